"""The fused projections (`kernels/fused_linear.py`; Triton, run by the interpreter on the CPU)
against their plain PyTorch references.

Tolerances, float32 inputs (IEEE products on a GPU, NumPy's under the interpreter): atol = rtol =
1e-5 (another reduction order). bf16 runs compiled on a GPU only (the interpreter truncates
float32 -> bf16): within 2 bf16 ulps of the reference, and a row's bits do not depend on how many
rows are computed with it (the batch invariance the engine's lossless comparison relies on)."""
import os

import pytest
import torch

from vegas_core.kernels.fused_linear import (DEFAULT_CONFIG, linear_add, linear_add_reference, norm_linear,
                                  norm_linear_reference)

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)
gpu_only = pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter truncates bf16; compiled GPU runs only")


def randn(*shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)


# (rows, K, N): a single row, rows and widths that are not multiples of the tiles, and K longer
# than one BLOCK_K; the last, with N < BLOCK_N, is one partial column tile.
SHAPES = [(1, 64, 32), (5, 40, 24), (17, 96, 50), (33, 136, 72), (70, 64, 16)]
CONFIGS = [DEFAULT_CONFIG, (32, 16, 32, 2, 2), (64, 64, 128, 4, 1)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("rows, k, n", SHAPES)
@pytest.mark.parametrize("norm, bias", [(True, False), (True, True), (False, True), (False, False)])
def test_norm_linear_matches_reference(rows, k, n, norm, bias, config):
    x = randn(rows, k, seed=1)
    nw = randn(k, seed=2) if norm else None
    w, b = randn(n, k, seed=3, scale=0.1), randn(n, seed=4) if bias else None
    got = norm_linear(x, nw, 1e-6, w, b, config=config)
    torch.testing.assert_close(got, norm_linear_reference(x, nw, 1e-6, w, b), **TOL)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("rows, k, n", SHAPES)
def test_norm_linear_silu_mul_matches_reference(rows, k, n, config):
    x, nw, w = randn(rows, k, seed=5), randn(k, seed=6), randn(2 * n, k, seed=7, scale=0.1)
    got = norm_linear(x, nw, 1e-6, w, silu_mul=True, config=config)
    assert got.shape == (rows, n)
    torch.testing.assert_close(got, norm_linear_reference(x, nw, 1e-6, w, silu_mul=True), **TOL)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("rows, k, n", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_add_updates_the_residual_in_place(rows, k, n, bias, config):
    x, w = randn(rows, k, seed=8), randn(n, k, seed=9, scale=0.1)
    b = randn(n, seed=10) if bias else None
    residual = randn(rows, n, seed=11)
    expected = linear_add_reference(x, w, residual.clone(), b)
    got = linear_add(x, w, residual, b, config=config)
    assert got.data_ptr() == residual.data_ptr()
    torch.testing.assert_close(residual, expected, **TOL)


def test_zero_rows_and_bad_shapes():
    w = randn(8, 16, seed=12)
    assert norm_linear(randn(0, 16, seed=13), None, 1e-6, w).shape == (0, 8)
    with pytest.raises(ValueError, match="weight"):
        norm_linear(randn(3, 12, seed=14), None, 1e-6, w)
    with pytest.raises(ValueError, match="silu_mul"):
        norm_linear(randn(3, 16, seed=14), None, 1e-6, randn(7, 16, seed=15), silu_mul=True)
    with pytest.raises(ValueError, match="residual"):
        linear_add(randn(3, 16, seed=14), w, randn(3, 7, seed=16))


@gpu_only
@pytest.mark.parametrize("silu", [False, True])
def test_bf16_rows_do_not_depend_on_the_batch(silu):
    """SmolLM2's widths: a 64-row decode step and a 576-row verification give a row the same
    bits; both within 2 bf16 ulps (plus a small absolute floor) of the reference."""
    k, n = 576, 1536 if silu else 960
    x = randn(576, k, seed=17, dtype=torch.bfloat16)
    nw = randn(k, seed=18, dtype=torch.bfloat16)
    w = randn(2 * n if silu else n, k, seed=19, dtype=torch.bfloat16, scale=0.05)
    full = norm_linear(x, nw, 1e-5, w, silu_mul=silu)
    assert torch.equal(norm_linear(x[:64].clone(), nw, 1e-5, w, silu_mul=silu), full[:64])
    assert torch.equal(norm_linear(x[100:101].clone(), nw, 1e-5, w, silu_mul=silu), full[100:101])
    ref = norm_linear_reference(x, nw, 1e-5, w, silu_mul=silu).float()
    torch.testing.assert_close(full.float(), ref, atol=2e-2, rtol=2 ** -7)
    residual = randn(576, n, seed=20, dtype=torch.bfloat16)
    add_full = linear_add(full, randn(n, n, seed=21, dtype=torch.bfloat16, scale=0.03),
                          residual.clone())
    part = linear_add(full[:64].clone(), randn(n, n, seed=21, dtype=torch.bfloat16, scale=0.03),
                      residual[:64].clone())
    assert torch.equal(part, add_full[:64])


@gpu_only
def test_programmatic_dependent_launch_keeps_the_order_in_a_graph():
    """A layer's four fused projections replayed from a CUDA graph with PDL (each kernel may start
    before the previous one ends, and waits for its memory) give the bits they give without it:
    an early read of the stream the previous kernel is still writing would change them."""
    if not (torch.cuda.get_device_capability()[0] >= 9):
        pytest.skip("PDL needs compute capability 9")
    k, n, inter = 576, 960, 1536
    x0 = randn(64, k, seed=22, dtype=torch.bfloat16)
    nw = randn(k, seed=23, dtype=torch.bfloat16)
    wq, wo = randn(n, k, seed=24, dtype=torch.bfloat16, scale=0.05), randn(k, k, seed=25, dtype=torch.bfloat16, scale=0.05)
    wg, wd = (randn(2 * inter, k, seed=26, dtype=torch.bfloat16, scale=0.05),
              randn(k, inter, seed=27, dtype=torch.bfloat16, scale=0.05))
    outs = {}
    for pdl in (False, True):
        hidden = x0.clone()

        def layer():
            for _ in range(4):
                qkv = norm_linear(hidden, nw, 1e-5, wq, pdl=pdl)
                linear_add(qkv[:, :k], wo, hidden, pdl=pdl)
                linear_add(norm_linear(hidden, nw, 1e-5, wg, silu_mul=True, pdl=pdl), wd, hidden, pdl=pdl)

        layer()                                  # compile outside the capture
        hidden.copy_(x0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer()
        hidden.copy_(x0)
        graph.replay()
        torch.cuda.synchronize()
        outs[pdl] = hidden.clone()
    assert torch.equal(outs[True], outs[False])
