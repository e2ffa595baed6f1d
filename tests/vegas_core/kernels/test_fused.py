"""The fused layer kernels (`kernels/fused.py`; Triton, run by the interpreter on the CPU) against
their plain PyTorch references and against the engine's own ops (`apply_rotary`, `KVPool.write`).

Tolerances, float32 inputs: `rotary_qkv` without a q/k norm must be bit-identical (torch.equal) to
the engine's ops and to the reference, the pool must hold exactly what `KVPool.write` writes (also
through a strided pool view), and every slot not written keeps its poison value; with Qwen3's q/k
norm, and for `add_rms_norm`'s normed output and `silu_mul`, atol = rtol = 1e-5 (the sum of
squares is reduced in another order; NumPy's exp is not torch's); `add_rms_norm`'s hidden (the
residual add) is bit-identical.

bf16 (Triton 3.6's interpreter truncates float32 -> bf16, so those run compiled on a GPU only):
`rotary_qkv` and `silu_mul` have the same bits as the torch ops, `add_rms_norm` is within one bf16
ulp (its hidden the same bits), and with the q/k norm rotary_qkv is within atol 1/16, rtol 1/32.
The same bf16 checks also run on the CPU with the interpreter's conversion patched to round to
nearest even, which checks the kernels' rounding sequence without a GPU.
"""
import os

import pytest
import torch
import torch.nn.functional as F

from vegas_core.kernels.fused import (add_rms_norm, add_rms_norm_reference, rotary_qkv, rotary_qkv_reference,
                           silu_mul, silu_mul_reference)
from vegas_core.rope import apply_rotary

# CPU under the interpreter (CI); compiled on a GPU when run with TRITON_INTERPRET=0 there.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)
POISON = -1234.5
gpu_only = pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter truncates bf16; compiled GPU runs only")


def randn(*shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)


def cos_sin(rows, head_dim, dtype, seed):
    """Rotary tables of random positions, as `RotaryEmbedding.cos_sin` builds them, cast once."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 4096, (rows,), generator=g).float()
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    emb = torch.cat([pos[:, None] * inv] * 2, dim=-1)
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


def poisoned_pool(num_blocks, block_size, kv_heads, head_dim, dtype, strided=False):
    """K and V of one pool layer filled with POISON; `strided` lays the storage out as
    [blocks, kv_heads, block_size, d] and hands out the [blocks, block_size, kv_heads, d] view."""
    if strided:
        shape = (num_blocks, kv_heads, block_size, head_dim)
        return [torch.full(shape, POISON, dtype=dtype, device=DEVICE).transpose(1, 2)
                for _ in range(2)]
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return [torch.full(shape, POISON, dtype=dtype, device=DEVICE) for _ in range(2)]


def shuffled_slots(rows, num_blocks, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(num_blocks * block_size, generator=g)[:rows].to(DEVICE)


def engine_rotary(qkv, cos, sin, heads, kv_heads, head_dim, k_cache, v_cache, slots):
    """What the unfused model does: apply_rotary to q and k, then KVPool.write's index_copy_."""
    t = qkv.shape[0]
    hq, hkv = heads * head_dim, kv_heads * head_dim
    q = qkv[:, :hq].view(t, heads, head_dim)
    k = qkv[:, hq:hq + hkv].view(t, kv_heads, head_dim)
    v = qkv[:, hq + hkv:].view(t, kv_heads, head_dim)
    c, s = cos[:, None, :], sin[:, None, :]
    q, k = apply_rotary(q, c, s), apply_rotary(k, c, s)
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, v)
    return q


# -- add_rms_norm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,dim", [(1, 64), (5, 576), (37, 100), (3, 8192)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_reference(rows, dim, with_residual):
    x = randn(rows, dim, seed=rows + dim)
    residual = randn(rows, dim, seed=rows + dim + 1) if with_residual else None
    weight = 1.0 + 0.1 * randn(dim, seed=dim + 2)
    normed, hidden = add_rms_norm(x, weight, 1e-6, residual)
    want_normed, want_hidden = add_rms_norm_reference(x, weight, 1e-6, residual)
    if residual is None:
        assert hidden is x
    assert torch.equal(hidden, want_hidden)
    assert normed.dtype == want_normed.dtype and normed.shape == (rows, dim)
    torch.testing.assert_close(normed, want_normed, **TOL)


def test_add_rms_norm_empty_batch():
    x = randn(0, 64, seed=0)
    normed, hidden = add_rms_norm(x, randn(64, seed=1), 1e-6, randn(0, 64, seed=2))
    assert normed.shape == (0, 64) and hidden.shape == (0, 64)


# -- rotary_qkv -----------------------------------------------------------------------------------

ROTARY_CASES = [  # (rows, heads, kv_heads, head_dim, block_size, num_blocks)
    (1, 4, 2, 16, 4, 3),
    (5, 9, 3, 64, 16, 2),       # SmolLM2's heads
    (37, 6, 1, 40, 8, 7),       # half of d (20) not a power of two; T not a multiple of the page
]


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("rows,heads,kv_heads,head_dim,block_size,num_blocks", ROTARY_CASES)
def test_rotary_qkv_matches_engine_ops(rows, heads, kv_heads, head_dim, block_size, num_blocks,
                                       strided):
    """Same q as apply_rotary and the same pool as KVPool.write, bit for bit; shuffled slots, and
    every slot not written keeps its poison."""
    qkv = randn(rows, (heads + 2 * kv_heads) * head_dim, seed=rows)
    cos, sin = cos_sin(rows, head_dim, torch.float32, seed=rows + 1)
    slots = shuffled_slots(rows, num_blocks, block_size, seed=rows + 2)
    k_cache, v_cache = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32,
                                     strided)
    q = rotary_qkv(qkv, cos, sin, heads, kv_heads, head_dim, k_cache, v_cache, slots)
    want_k, want_v = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32)
    want_q = engine_rotary(qkv, cos, sin, heads, kv_heads, head_dim, want_k, want_v, slots)
    assert q.shape == (rows, heads, head_dim) and q.is_contiguous()
    assert torch.equal(q, want_q)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    written[slots] = True
    assert bool((k_cache.reshape(-1, kv_heads, head_dim)[~written] == POISON).all())
    assert bool((v_cache.reshape(-1, kv_heads, head_dim)[~written] == POISON).all())

    ref_k, ref_v = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32, strided)
    ref_q = rotary_qkv_reference(qkv, cos, sin, heads, kv_heads, head_dim, ref_k, ref_v, slots)
    assert torch.equal(ref_q, want_q) and torch.equal(ref_k, want_k) and torch.equal(ref_v, want_v)


@pytest.mark.parametrize("rows,heads,kv_heads,head_dim,block_size,num_blocks", ROTARY_CASES)
def test_rotary_qkv_with_qk_norm_matches_reference(rows, heads, kv_heads, head_dim, block_size,
                                                   num_blocks):
    qkv = randn(rows, (heads + 2 * kv_heads) * head_dim, seed=rows + 10)
    cos, sin = cos_sin(rows, head_dim, torch.float32, seed=rows + 11)
    slots = shuffled_slots(rows, num_blocks, block_size, seed=rows + 12)
    q_norm, k_norm = 1.0 + 0.1 * randn(head_dim, seed=1), 1.0 + 0.1 * randn(head_dim, seed=2)
    k_cache, v_cache = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32)
    ref_k, ref_v = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.float32)
    q = rotary_qkv(qkv, cos, sin, heads, kv_heads, head_dim, k_cache, v_cache, slots,
                   q_norm, k_norm, 1e-6)
    want_q = rotary_qkv_reference(qkv, cos, sin, heads, kv_heads, head_dim, ref_k, ref_v, slots,
                                  q_norm, k_norm, 1e-6)
    torch.testing.assert_close(q, want_q, **TOL)
    torch.testing.assert_close(k_cache, ref_k, **TOL)
    assert torch.equal(v_cache, ref_v)


# -- silu_mul -------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,inter", [(1, 64), (5, 1536), (37, 300)])
def test_silu_mul_matches_reference(rows, inter):
    gate_up = randn(rows, 2 * inter, seed=rows + inter, scale=4.0)
    out = silu_mul(gate_up)
    want = silu_mul_reference(gate_up)
    assert out.shape == (rows, inter)
    torch.testing.assert_close(out, want, **TOL)


# -- bf16: compiled on a GPU; on the CPU with the interpreter's casts made exact -------------------

def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical bf16 tensors (torch.equal would let +0 and -0 pass)."""
    return a.dtype == b.dtype == torch.bfloat16 and torch.equal(
        a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 values lie between a and b (0: equal; +0 and -0 count as equal)."""
    def ordered(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits >= 0, bits, -(bits & 0x7FFF))
    return (ordered(a) - ordered(b)).abs()


def check_add_rms_norm_bf16(rows, dim):
    x = randn(rows, dim, seed=dim, dtype=torch.bfloat16)
    residual = randn(rows, dim, seed=dim + 1, dtype=torch.bfloat16)
    weight = (1.0 + 0.1 * randn(dim, seed=dim + 2)).to(torch.bfloat16)
    for res in (None, residual):
        normed, hidden = add_rms_norm(x, weight, 1e-5, res)
        want_normed, want_hidden = add_rms_norm_reference(x, weight, 1e-5, res)
        assert same_bits(hidden, want_hidden)
        assert normed.dtype == torch.bfloat16
        assert int(ulp_distance(normed, want_normed).max()) <= 1


def check_rotary_qkv_bf16(rows, heads, kv_heads, head_dim):
    """Bit-identical to apply_rotary + KVPool.write."""
    num_blocks, block_size = 16, 16
    qkv = randn(rows, (heads + 2 * kv_heads) * head_dim, seed=rows, dtype=torch.bfloat16)
    cos, sin = cos_sin(rows, head_dim, torch.bfloat16, seed=rows + 1)
    slots = shuffled_slots(rows, num_blocks, block_size, seed=rows + 2)
    k_cache, v_cache = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.bfloat16)
    want_k, want_v = poisoned_pool(num_blocks, block_size, kv_heads, head_dim, torch.bfloat16)
    q = rotary_qkv(qkv, cos, sin, heads, kv_heads, head_dim, k_cache, v_cache, slots)
    want_q = engine_rotary(qkv, cos, sin, heads, kv_heads, head_dim, want_k, want_v, slots)
    assert same_bits(q, want_q)
    assert same_bits(k_cache, want_k) and same_bits(v_cache, want_v)


def check_rotary_qkv_bf16_qk_norm(rows, heads, kv_heads, head_dim):
    """With Qwen3's norm: the norm may be an ulp off, which the rotation carries on (values up
    to ~4, whose ulp is 1/64: a few ulps allowed); v is copied bit for bit."""
    qkv = randn(rows, (heads + 2 * kv_heads) * head_dim, seed=5, dtype=torch.bfloat16)
    cos, sin = cos_sin(rows, head_dim, torch.bfloat16, seed=6)
    slots = shuffled_slots(rows, 8, 16, seed=7)
    q_norm = (1.0 + 0.1 * randn(head_dim, seed=8)).to(torch.bfloat16)
    k_norm = (1.0 + 0.1 * randn(head_dim, seed=9)).to(torch.bfloat16)
    k_cache, v_cache = poisoned_pool(8, 16, kv_heads, head_dim, torch.bfloat16)
    ref_k, ref_v = poisoned_pool(8, 16, kv_heads, head_dim, torch.bfloat16)
    q = rotary_qkv(qkv, cos, sin, heads, kv_heads, head_dim, k_cache, v_cache, slots,
                   q_norm, k_norm, 1e-6)
    want_q = rotary_qkv_reference(qkv, cos, sin, heads, kv_heads, head_dim, ref_k, ref_v, slots,
                                  q_norm, k_norm, 1e-6)
    torch.testing.assert_close(q, want_q, atol=1 / 16, rtol=1 / 32)
    torch.testing.assert_close(k_cache, ref_k, atol=1 / 16, rtol=1 / 32)
    assert same_bits(v_cache, ref_v)


def check_silu_mul_bf16(rows, inter):
    """Bit-identical to F.silu(gate) * up."""
    gate_up = randn(rows, 2 * inter, seed=inter, dtype=torch.bfloat16, scale=4.0)
    gate, up = gate_up.chunk(2, dim=-1)
    assert same_bits(silu_mul(gate_up), F.silu(gate) * up)


@gpu_only
@pytest.mark.parametrize("rows,dim", [(1, 576), (64, 576), (64, 4096), (7, 8192)])
def test_add_rms_norm_bf16_within_one_ulp(rows, dim):
    check_add_rms_norm_bf16(rows, dim)


@gpu_only
@pytest.mark.parametrize("rows,heads,kv_heads,head_dim", [(64, 9, 3, 64), (17, 32, 8, 128)])
def test_rotary_qkv_bf16_bit_identical(rows, heads, kv_heads, head_dim):
    check_rotary_qkv_bf16(rows, heads, kv_heads, head_dim)


@gpu_only
def test_rotary_qkv_bf16_with_qk_norm_close():
    check_rotary_qkv_bf16_qk_norm(64, 16, 8, 128)


@gpu_only
@pytest.mark.parametrize("rows,inter", [(1, 1536), (64, 1536), (64, 14336)])
def test_silu_mul_bf16_bit_identical(rows, inter):
    check_silu_mul_bf16(rows, inter)


def _exact_bf16_casts(convert):
    """Triton 3.6's interpreter truncates float32 -> bf16 (`_convert_float`); this one rounds to
    nearest even, as `.to(tl.bfloat16)` does compiled, by way of torch."""
    import numpy as np
    import triton.language as tl

    def exact(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        if src == tl.bfloat16 and dst == tl.float32:
            t = torch.from_numpy(np.ascontiguousarray(data).view(np.int16).copy())
            return t.view(torch.bfloat16).float().numpy()
        return convert(data, src, dst, rounding_mode)
    return exact


@pytest.mark.skipif(DEVICE != "cpu", reason="the compiled bf16 tests above cover the GPU")
def test_bf16_roundings_under_interpreter_with_exact_casts(monkeypatch):
    """The kernels' bf16 rounding sequence, checked on the CPU: with the interpreter's bf16
    conversion made exact, the bf16 checks hold against torch's CPU ops (NumPy's exp and rsqrt
    stand in for libdevice's; the GPU tests check those)."""
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    if not hasattr(interpreter, "_convert_float"):
        pytest.skip("this Triton's interpreter converts floats elsewhere")
    monkeypatch.setattr(interpreter, "_convert_float", _exact_bf16_casts(interpreter._convert_float))
    check_add_rms_norm_bf16(5, 576)
    check_rotary_qkv_bf16(5, 9, 3, 64)
    check_rotary_qkv_bf16_qk_norm(5, 4, 2, 32)
    check_silu_mul_bf16(5, 300)
