"""The qkv projection with the rotary and the KV-pool write as its epilogue, in Triton beside a plain
PyTorch reference with the same signature: one launch where `norm_linear` then `rotary_qkv` were two.

Why: a draft step at batch 64 is a chain of about 210 small kernels (7 a layer), each near its
latency floor; the rotary kernel between the qkv product and attention only re-reads the 64 rows the
product has just written (bench/NOTES.md versions 37 and 42).

Contract (``norm_linear_rotary`` and ``norm_linear_rotary_reference`` take and return the same):
``norm_linear_rotary(x, norm_weight, eps, weight, bias, cos, sin, num_heads, num_kv_heads,
head_dim, k_cache, v_cache, slots) -> q`` is
``rotary_qkv(norm_linear(x, norm_weight, eps, weight, bias), cos, sin, num_heads, num_kv_heads,
head_dim, k_cache, v_cache, slots)`` (see `kernels.fused_linear` and `kernels.fused`): x ``[T, K]``,
weight ``[(H + 2 KVH) d, K]``, cos/sin ``[T, d]`` in x's dtype; the rotated k and the plain v of row
``t`` go to pool slot ``slots[t]``; returns the rotated q as a new ``[T, H, d]``. The product is
rounded to the dtype before the rotation, and the rotation rounds as torch's ops do, so the result
is the two kernels' bit for bit when the products agree. Without Qwen3's per-head q/k norm (the
model keeps the two kernels for that).

Triton design: a program computes BLOCK_M rows of BLOCK_P column pairs ``(j, j + d/2)`` (of one
or more heads, q, k or v) as two accumulators, which is what rotate_half pairs, then stores each
pair where its head goes; the launch configuration is `kernels.fused_linear`'s for the same (N, K)
with BLOCK_P = BLOCK_N / 2, so the same number of programs read the same weights, and a row's bits
do not depend on the batch. Under the interpreter one program takes every pair.
"""
from __future__ import annotations

import torch

from .fused import _need_triton, rotary_qkv_reference, tl, triton
from .fused_linear import _check, config_for, norm_linear_reference
from .pdl import launch_options

if triton is not None:   # the kernel's device helpers exist only where Triton is installed
    from .fused import _rotate_rounded
    from .fused_linear import row_inv_rms, x_tile
    from .pdl import pdl_wait


def norm_linear_rotary_reference(x, norm_weight, eps: float, weight, bias, cos, sin, num_heads: int,
                                 num_kv_heads: int, head_dim: int, k_cache, v_cache, slots):
    qkv = norm_linear_reference(x, norm_weight, eps, weight, bias)
    return rotary_qkv_reference(qkv, cos, sin, num_heads, num_kv_heads, head_dim, k_cache, v_cache,
                                slots)


if triton is not None:

    @triton.jit
    def _qkv_rotary_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
                           slots_ptr, M, eps, block_size, s_xm, s_xk, s_wn, s_wk, s_ct, s_cd,
                           s_st, s_sd, s_qt, s_qh, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                           K: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                           HEAD_DIM: tl.constexpr, NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                           PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
                           BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
        """Program (pair block, row block). Pair p is column j = p % (d/2) of head p // (d/2)
        and its partner j + d/2; heads are q, then k, then v, as the product's columns."""
        DT: tl.constexpr = x_ptr.dtype.element_ty
        HALF: tl.constexpr = HEAD_DIM // 2
        PAIRS: tl.constexpr = (NUM_HEADS + 2 * NUM_KV_HEADS) * HALF
        pdl_wait(USE_PDL)
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        p_mask = p < PAIRS
        head, j = p // HALF, p % HALF
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        r_mask = rows < M
        ks = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + rows[:, None].to(tl.int64) * s_xm
        cols = head * HEAD_DIM + j                       # the pair's first column; + HALF its partner
        w_lo = w_ptr + cols[:, None].to(tl.int64) * s_wn
        w_hi = w_lo + HALF * s_wn
        if NORM:
            inv_rms = row_inv_rms(x_rows, r_mask, s_xk, eps, K, BLOCK_M, BLOCK_K)
        else:
            inv_rms = tl.zeros([BLOCK_M], dtype=tl.float32)   # not read
        acc_lo = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
        acc_hi = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = (k0 + ks) < K
            x = x_tile(x_rows, r_mask, s_xk, k0, ks, k_mask, nw_ptr, inv_rms, NORM, DT)
            w_mask = p_mask[:, None] & k_mask[None, :]
            w = tl.load(w_lo + (k0 + ks)[None, :] * s_wk, mask=w_mask, other=0.0)
            acc_lo = tl.dot(x, tl.trans(w), acc_lo, input_precision=PRECISION)
            w = tl.load(w_hi + (k0 + ks)[None, :] * s_wk, mask=w_mask, other=0.0)
            acc_hi = tl.dot(x, tl.trans(w), acc_hi, input_precision=PRECISION)
        if HAS_BIAS:
            acc_lo += tl.load(b_ptr + cols, mask=p_mask, other=0.0).to(tl.float32)[None, :]
            acc_hi += tl.load(b_ptr + cols + HALF, mask=p_mask, other=0.0).to(tl.float32)[None, :]
        lo, hi = acc_lo.to(DT), acc_hi.to(DT)          # the product's own rounding, as qkv's
        mask = r_mask[:, None] & p_mask[None, :]
        trig = rows[:, None].to(tl.int64)
        cos_lo = tl.load(cos_ptr + trig * s_ct + j[None, :] * s_cd, mask=mask, other=0.0)
        cos_hi = tl.load(cos_ptr + trig * s_ct + (j[None, :] + HALF) * s_cd, mask=mask, other=0.0)
        sin_lo = tl.load(sin_ptr + trig * s_st + j[None, :] * s_sd, mask=mask, other=0.0)
        sin_hi = tl.load(sin_ptr + trig * s_st + (j[None, :] + HALF) * s_sd, mask=mask, other=0.0)
        # rotate_half's -x[d/2:]: `* -1.0` flips the sign of zeros too, as torch's negation
        rot_lo = _rotate_rounded(lo, hi.to(tl.float32) * -1.0, cos_lo.to(tl.float32),
                                 sin_lo.to(tl.float32), DT)
        rot_hi = _rotate_rounded(hi, lo, cos_hi.to(tl.float32), sin_hi.to(tl.float32), DT)
        rotate = (head < NUM_HEADS + NUM_KV_HEADS)[None, :]     # q and k rotate, v does not
        out_lo, out_hi = tl.where(rotate, rot_lo, lo), tl.where(rotate, rot_hi, hi)

        is_q, is_k = head < NUM_HEADS, (head >= NUM_HEADS) & (head < NUM_HEADS + NUM_KV_HEADS)
        is_v = head >= NUM_HEADS + NUM_KV_HEADS
        q_dst = q_ptr + trig * s_qt + (head * s_qh + j)[None, :]
        q_mask = mask & is_q[None, :]
        tl.store(q_dst, out_lo.to(q_ptr.dtype.element_ty), mask=q_mask)
        tl.store(q_dst + HALF, out_hi.to(q_ptr.dtype.element_ty), mask=q_mask)
        slot = tl.load(slots_ptr + rows, mask=r_mask, other=0).to(tl.int64)
        page, off = (slot // block_size)[:, None], (slot % block_size)[:, None]
        kv_head = tl.where(is_k, head - NUM_HEADS, head - NUM_HEADS - NUM_KV_HEADS)
        k_dst = k_ptr + page * s_kb + off * s_kt + (kv_head * s_kh + j * s_kd)[None, :]
        k_mask = mask & is_k[None, :]
        tl.store(k_dst, out_lo.to(k_ptr.dtype.element_ty), mask=k_mask)
        tl.store(k_dst + HALF * s_kd, out_hi.to(k_ptr.dtype.element_ty), mask=k_mask)
        v_dst = v_ptr + page * s_vb + off * s_vt + (kv_head * s_vh + j * s_vd)[None, :]
        v_mask = mask & is_v[None, :]
        tl.store(v_dst, out_lo.to(v_ptr.dtype.element_ty), mask=v_mask)
        tl.store(v_dst + HALF * s_vd, out_hi.to(v_ptr.dtype.element_ty), mask=v_mask)


def norm_linear_rotary(x, norm_weight, eps: float, weight, bias, cos, sin, num_heads: int,
                       num_kv_heads: int, head_dim: int, k_cache, v_cache, slots,
                       config: tuple[int, int, int, int, int] | None = None, pdl: bool = False,
                       table: dict | None = None):
    """Triton version of ``norm_linear_rotary_reference`` (see the module docstring); ``config``
    is a `kernels.fused_linear` configuration (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), of
    which BLOCK_N / 2 column pairs make a program's tile on a GPU (at least 16, tl.dot's
    minimum); without it `fused_linear.config_for`'s for the qkv shape (``table`` as there)."""
    _need_triton("norm_linear_rotary")
    _check(x, weight, bias)
    n = (num_heads + 2 * num_kv_heads) * head_dim
    if weight.shape[0] != n:
        raise ValueError(f"weight [(H + 2 KVH) * head_dim = {n}, K] expected, got "
                         f"{tuple(weight.shape)}")
    if head_dim % 2:
        raise ValueError("head_dim must be even")
    rows = x.shape[0]
    q = torch.empty((rows, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if rows == 0:
        return q
    pairs = n // 2
    if config is None and triton.knobs.runtime.interpret:
        # The engine under the interpreter (CI), whose cost is per program: every pair in one.
        block_m, _, block_k, warps, stages = config_for(n, x.shape[1], False)
        block_p = triton.next_power_of_2(pairs)
    else:
        block_m, block_n, block_k, warps, stages = config or config_for(n, x.shape[1], False, table)
        block_p = max(16, block_n // 2)
    grid = (triton.cdiv(pairs, block_p), triton.cdiv(rows, block_m))
    _qkv_rotary_kernel[grid](
        x, x if norm_weight is None else norm_weight, weight, x if bias is None else bias, cos, sin,
        q, k_cache, v_cache, slots, rows, float(eps), k_cache.shape[1], *x.stride(),
        *weight.stride(), *cos.stride(), *sin.stride(), q.stride(0), q.stride(1),
        *k_cache.stride(), *v_cache.stride(), K=x.shape[1], NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, NORM=norm_weight is not None,
        HAS_BIAS=bias is not None, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_P=block_p, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
        **launch_options(x.device, pdl),
        enable_fp_fusion=False)   # an FMA would skip the roundings the references make
    return q
