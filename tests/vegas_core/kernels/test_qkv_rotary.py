"""The qkv projection with its rotary and pool-write epilogue (`kernels/qkv_rotary.py`; Triton, run
by the interpreter on the CPU) against its reference and against the two kernels it replaces.

Tolerances, float32 (IEEE products on a GPU, NumPy's under the interpreter): q within atol = rtol =
1e-5 of the reference (another reduction order for the product), the pool's k and v likewise;
every slot not written keeps its poison. bf16 runs compiled on a GPU only (the interpreter
truncates float32 -> bf16): q and the pool the same bits as `norm_linear` then `rotary_qkv` with
the same launch configuration, and a row's bits do not depend on the number of rows beside it."""
import pytest
import torch

from vegas_core.kernels.fused import rotary_qkv
from vegas_core.kernels.fused_linear import norm_linear
from vegas_core.kernels.qkv_rotary import norm_linear_rotary, norm_linear_rotary_reference
from tests.vegas_core.kernels.test_fused import (DEVICE, POISON, TOL, cos_sin, gpu_only, poisoned_pool, randn,
                                      shuffled_slots)

# (rows, heads, kv_heads, head_dim, K, block_size, num_blocks): GQA ratios 1, 3 and 4; half a head
# of 20 (not a multiple of a 16-pair tile); rows that are not a multiple of a row tile.
CASES = [
    (1, 4, 4, 16, 32, 4, 3),
    (5, 9, 3, 64, 96, 16, 2),     # SmolLM2's heads
    (17, 8, 2, 40, 48, 8, 5),
]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): 16-pair tiles with K in several steps, then one tile
# wider than half a head (its pairs past d/2 masked off).
CONFIGS = [(16, 32, 32, 4, 1), (32, 128, 64, 4, 1)]


def _inputs(rows, heads, kv_heads, head_dim, k, block_size, num_blocks, dtype, seed, bias):
    n = (heads + 2 * kv_heads) * head_dim
    x = randn(rows, k, seed=seed, dtype=dtype)
    nw = (1.0 + 0.1 * randn(k, seed=seed + 1)).to(dtype)
    w = randn(n, k, seed=seed + 2, dtype=dtype, scale=0.1)
    b = randn(n, seed=seed + 3, dtype=dtype) if bias else None
    cos, sin = cos_sin(rows, head_dim, dtype, seed=seed + 4)
    slots = shuffled_slots(rows, num_blocks, block_size, seed=seed + 5)
    return x, nw, w, b, cos, sin, slots


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("norm, bias", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("rows,heads,kv_heads,head_dim,k,block_size,num_blocks", CASES)
def test_matches_reference(rows, heads, kv_heads, head_dim, k, block_size, num_blocks, norm, bias,
                           config):
    x, nw, w, b, cos, sin, slots = _inputs(rows, heads, kv_heads, head_dim, k, block_size,
                                           num_blocks, torch.float32, rows + k, bias)
    nw = nw if norm else None
    k_cache, v_cache = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32,
                                     strided=True)
    q = norm_linear_rotary(x, nw, 1e-6, w, b, cos, sin, heads, kv_heads, head_dim, k_cache,
                           v_cache, slots, config=config)
    want_k, want_v = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32)
    want_q = norm_linear_rotary_reference(x, nw, 1e-6, w, b, cos, sin, heads, kv_heads, head_dim,
                                          want_k, want_v, slots)
    assert q.shape == (rows, heads, head_dim) and q.is_contiguous()
    torch.testing.assert_close(q, want_q, **TOL)
    torch.testing.assert_close(k_cache, want_k, **TOL)
    torch.testing.assert_close(v_cache, want_v, **TOL)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    written[slots] = True
    assert bool((k_cache.reshape(-1, kv_heads, head_dim)[~written] == POISON).all())
    assert bool((v_cache.reshape(-1, kv_heads, head_dim)[~written] == POISON).all())


def test_v_is_the_product_and_q_is_rotated():
    """With cos = 1 and sin = 0 nothing rotates: q, k and v are the product's columns as they are
    (a kernel that swapped halves or mixed up heads fails here). Within TOL: under the
    interpreter NumPy sums a 16-wide and a 32-wide product in different orders."""
    rows, heads, kv_heads, head_dim, k = 6, 4, 2, 16, 32
    x, nw, w, _, _, _, slots = _inputs(rows, heads, kv_heads, head_dim, k, 4, 3, torch.float32, 7,
                                       False)
    ones = torch.ones(rows, head_dim, device=DEVICE)
    k_cache, v_cache = poisoned_pool(3, 4, kv_heads, head_dim, torch.float32)
    q = norm_linear_rotary(x, nw, 1e-6, w, None, ones, ones * 0, heads, kv_heads, head_dim,
                           k_cache, v_cache, slots, config=CONFIGS[0])
    qkv = norm_linear(x, nw, 1e-6, w, config=CONFIGS[0])
    hq, hkv = heads * head_dim, kv_heads * head_dim
    torch.testing.assert_close(q, qkv[:, :hq].reshape(rows, heads, head_dim), **TOL)
    torch.testing.assert_close(k_cache.reshape(-1, kv_heads, head_dim)[slots],
                               qkv[:, hq:hq + hkv].reshape(rows, kv_heads, head_dim), **TOL)
    torch.testing.assert_close(v_cache.reshape(-1, kv_heads, head_dim)[slots],
                               qkv[:, hq + hkv:].reshape(rows, kv_heads, head_dim), **TOL)


def test_zero_rows_and_bad_shapes():
    k_cache, v_cache = poisoned_pool(2, 4, 2, 16, torch.float32)
    w = randn(8 * 16, 32, seed=1)
    cos = torch.ones(0, 16, device=DEVICE)
    slots = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    q = norm_linear_rotary(randn(0, 32, seed=2), None, 1e-6, w, None, cos, cos, 4, 2, 16, k_cache,
                           v_cache, slots)
    assert q.shape == (0, 4, 16)
    with pytest.raises(ValueError, match="weight"):
        norm_linear_rotary(randn(3, 32, seed=3), None, 1e-6, w, None, cos, cos, 4, 1, 16, k_cache,
                           v_cache, slots)


@gpu_only
@pytest.mark.parametrize("rows", [1, 64, 576])
def test_bf16_same_bits_as_the_two_kernels(rows):
    """SmolLM2's shape with the engine's configuration: q and the pool as `norm_linear` then
    `rotary_qkv` give them, bit for bit, and rows 0-63 the same bits at 64 and at 576 rows."""
    heads, kv_heads, head_dim, k, block_size, num_blocks = 9, 3, 64, 576, 16, 48
    x, nw, w, _, cos, sin, slots = _inputs(rows, heads, kv_heads, head_dim, k, block_size,
                                           num_blocks, torch.bfloat16, 11, False)
    k_cache, v_cache = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.bfloat16)
    q = norm_linear_rotary(x, nw, 1e-5, w, None, cos, sin, heads, kv_heads, head_dim, k_cache,
                           v_cache, slots)
    want_k, want_v = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.bfloat16)
    want_q = rotary_qkv(norm_linear(x, nw, 1e-5, w), cos, sin, heads, kv_heads, head_dim, want_k,
                        want_v, slots)
    assert torch.equal(q, want_q)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    if rows > 64:
        part = norm_linear_rotary(x[:64].clone(), nw, 1e-5, w, None, cos[:64].clone(),
                                  sin[:64].clone(), heads, kv_heads, head_dim, k_cache, v_cache,
                                  slots[:64].clone())
        assert torch.equal(part, q[:64])
