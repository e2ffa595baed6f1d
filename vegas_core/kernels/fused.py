"""Fused element-wise kernels of a decoder layer, in Triton beside plain PyTorch references with the
same signatures. At decode batch sizes a layer is bound by how many kernels it launches, not by
bytes, so each of these replaces a chain of small torch ops with one launch.

Contract (each ``name`` and ``name_reference`` take and return the same):
- ``add_rms_norm(x, weight, eps, residual=None) -> (normed, hidden)``: x, residual ``[T, D]``.
  ``hidden = x + residual`` (rounded once to x's dtype, as torch's add), or ``x`` itself when
  ``residual`` is None; ``normed`` is ``vegas_core.model.RMSNorm`` of ``hidden``: float32 in, then
  ``F.rms_norm``; otherwise normalise in float32, cast to the dtype, then multiply by the weight.
  ``normed`` has the dtype torch's ``weight * normalised`` would have.
- ``rotary_qkv(qkv, cos, sin, num_heads, num_kv_heads, head_dim, k_cache, v_cache, slots,
  q_norm=None, k_norm=None, eps=1e-6) -> q``: ``qkv`` ``[T, (H + 2 KVH) * d]`` (q heads, then k,
  then v); ``cos, sin`` ``[T, d]`` in qkv's dtype. With ``q_norm``/``k_norm`` (Qwen3's per-head
  RMSNorm weights ``[d]``, in qkv's dtype) each q/k head is first normalised as ``RMSNorm`` does.
  q and k are rotated as ``vegas_core.rope.apply_rotary`` ("rotate half"), each op rounded to the
  dtype as torch rounds it (``round(round(x cos) + round(rot sin))``); rotated k and plain v of row
  ``t`` go to pool slot ``slots[t]`` (int64; page ``s // block_size``, offset ``s % block_size``) of
  ``k_cache``/``v_cache`` ``[num_blocks, block_size, KVH, d]`` (any strides), as
  ``KVPool.write`` does. Returns the rotated q as a new contiguous ``[T, H, d]``.
- ``silu_mul(gate_up) -> out``: gate_up ``[T, 2 I]`` (gate columns first), out ``[T, I]`` =
  ``F.silu(gate) * up``, silu in float32 rounded to the dtype, then the product rounded.

On a GPU in bf16, `rotary_qkv` (without the q/k norm) and `silu_mul` are meant to be bit-identical
to the torch ops (torch's CUDA silu is ``x / (1 + expf(-x))``: libdevice's exp and a correctly
rounded division here, not Triton's approximate ones; no mul+add contraction into FMAs), and the
RMSNorms within one bf16 ulp (the sum of squares is reduced in another order). The kernels only
read shapes, strides and dtypes on the host and allocate with ``torch.empty``: CUDA-graph safe.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # Triton is optional: the CPU engine path only needs the references.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None
    libdevice = None

from .pdl import launch_options

if triton is not None:
    from .pdl import pdl_wait


# -- references -----------------------------------------------------------------------------------

def _rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`vegas_core.model.RMSNorm.forward` (kernels/ does not import the engine)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`vegas_core.rope.apply_rotary` with cos/sin [T, d] already in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def add_rms_norm_reference(x, weight, eps: float, residual=None):
    hidden = x if residual is None else x + residual
    return _rms_norm_reference(hidden, weight, eps), hidden


def rotary_qkv_reference(qkv, cos, sin, num_heads: int, num_kv_heads: int, head_dim: int,
                         k_cache, v_cache, slots, q_norm=None, k_norm=None, eps: float = 1e-6):
    t = qkv.shape[0]
    hq, hkv = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :hq].reshape(t, num_heads, head_dim)
    k = qkv[:, hq:hq + hkv].reshape(t, num_kv_heads, head_dim)
    v = qkv[:, hq + hkv:hq + 2 * hkv].reshape(t, num_kv_heads, head_dim)
    if q_norm is not None:
        q, k = _rms_norm_reference(q, q_norm, eps), _rms_norm_reference(k, k_norm, eps)
    q, k = _rotate_reference(q, cos, sin), _rotate_reference(k, cos, sin)
    pages, offsets = slots // k_cache.shape[1], slots % k_cache.shape[1]
    k_cache[pages, offsets] = k.to(k_cache.dtype)
    v_cache[pages, offsets] = v.to(v_cache.dtype)
    return q.contiguous()


def silu_mul_reference(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# -- Triton ---------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, hidden_ptr, eps, T, D,
                             s_xt, s_xd, s_rt, s_rd, s_ot, s_od, s_ht, s_hd,
                             HAS_RESIDUAL: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
        """BLOCK_T rows per program (one on a GPU): the residual add, then RMSNorm with
        RMSNorm.forward's roundings, each row reduced on its own."""
        pdl_wait(USE_PDL)
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
        offs = tl.arange(0, BLOCK_D)[None, :]
        mask = (t < T) & (offs < D)
        x = tl.load(x_ptr + t * s_xt + offs * s_xd, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + t * s_rt + offs * s_rd, mask=mask, other=0.0)
            hidden = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)   # torch's add: one rounding
            tl.store(hidden_ptr + t * s_ht + offs * s_hd, hidden, mask=mask)
        else:
            hidden = x
        hf = hidden.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=1) / D + eps)[:, None]
        normalised = (hf * inv_rms).to(x.dtype)                  # cast back before the weight
        w = tl.load(w_ptr + offs, mask=offs < D, other=0.0)
        out = w.to(tl.float32) * normalised.to(tl.float32)
        tl.store(out_ptr + t * s_ot + offs * s_od, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotate_rounded(x, partner, cos, sin, DT: tl.constexpr):
        """x * cos + partner * sin with torch's roundings: each product, then the sum, to DT."""
        a = (x.to(tl.float32) * cos).to(DT)
        b = (partner.to(tl.float32) * sin).to(DT)
        return (a.to(tl.float32) + b.to(tl.float32)).to(DT)

    @triton.jit
    def _head_rms_norm(lo, hi, w_ptr, j, j_mask, eps, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
                       DT: tl.constexpr):
        """RMSNorm of each head, given as its two halves [rows, heads, half], with
        RMSNorm.forward's roundings."""
        lf, hf = lo.to(tl.float32), hi.to(tl.float32)
        ms = (tl.sum(lf * lf, axis=2) + tl.sum(hf * hf, axis=2)) / HEAD_DIM
        inv_rms = tl.rsqrt(ms + eps)[:, :, None]
        w_lo = tl.load(w_ptr + j, mask=j_mask, other=0.0).to(tl.float32)[None, None, :]
        w_hi = tl.load(w_ptr + HALF + j, mask=j_mask, other=0.0).to(tl.float32)[None, None, :]
        lo = (w_lo * (lf * inv_rms).to(DT).to(tl.float32)).to(DT)
        hi = (w_hi * (hf * inv_rms).to(DT).to(tl.float32)).to(DT)
        return lo, hi

    @triton.jit
    def _load_row_halves(ptr, t, t_mask, s_t, s_d, j, j_mask, HALF: tl.constexpr):
        """Rows t of a [T, d] table (cos or sin) as float32 [rows, 1, BLOCK_HALF] halves."""
        rows = ptr + t[:, None] * s_t
        mask = t_mask[:, None] & j_mask[None, :]
        lo = tl.load(rows + j[None, :] * s_d, mask=mask, other=0.0).to(tl.float32)
        hi = tl.load(rows + (j[None, :] + HALF) * s_d, mask=mask, other=0.0).to(tl.float32)
        return lo[:, None, :], hi[:, None, :]

    @triton.jit
    def _head_offsets(heads, t_mask, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_HALF: tl.constexpr):
        """Head and column indices [1, BLOCK_H, 1], [1, 1, BLOCK_HALF] and the [rows, heads, half]
        mask of the real rows, heads and columns."""
        h = tl.arange(0, BLOCK_H)[None, :, None]
        j = tl.arange(0, BLOCK_HALF)[None, None, :]
        return h, j, t_mask[:, None, None] & (h < heads) & (j < HALF)

    @triton.jit
    def _load_heads(rows_ptr, t_mask, col0, heads, s_xd, HEAD_DIM: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
        """Heads [col0 / d, col0 / d + heads) of qkv rows ([rows, 1, 1] pointers) as
        (first halves, second halves), each [rows, BLOCK_H, BLOCK_HALF]."""
        h, j, mask = _head_offsets(heads, t_mask, HALF, BLOCK_H, BLOCK_HALF)
        cols = col0 + h * HEAD_DIM + j
        lo = tl.load(rows_ptr + cols * s_xd, mask=mask, other=0.0)
        hi = tl.load(rows_ptr + (cols + HALF) * s_xd, mask=mask, other=0.0)
        return lo, hi

    @triton.jit
    def _store_heads(base_ptr, t_mask, lo, hi, heads, s_h, s_d, HALF: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
        """Store [rows, heads, half] halves at per-row bases ([rows, 1, 1] pointers)."""
        h, j, mask = _head_offsets(heads, t_mask, HALF, BLOCK_H, BLOCK_HALF)
        dst = base_ptr + h * s_h + j * s_d
        tl.store(dst, lo.to(base_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF * s_d, hi.to(base_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotary_qkv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, slots_ptr,
                           qw_ptr, kw_ptr, eps, T,
                           s_xt, s_xd, s_ct, s_cd, s_st, s_sd, s_qt, s_qh,
                           s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, block_size,
                           NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                           HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                           BLOCK_HALF: tl.constexpr, QK_NORM: tl.constexpr,
                           USE_PDL: tl.constexpr):
        """One program per BLOCK_T token rows (1 on a GPU; more under the interpreter, whose cost
        is per operation, not per element): (norm and) rotate their q heads into q, their k heads
        into the pool, and copy their v heads to the pool. Halves are handled apart, which is
        what rotate_half pairs: out_lo = lo cos_lo - hi sin_lo, out_hi = hi cos_hi + lo sin_hi."""
        DT: tl.constexpr = qkv_ptr.dtype.element_ty
        pdl_wait(USE_PDL)
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = t < T
        rows = (qkv_ptr + t * s_xt)[:, None, None]
        j = tl.arange(0, BLOCK_HALF)
        j_mask = j < HALF
        cos_lo, cos_hi = _load_row_halves(cos_ptr, t, t_mask, s_ct, s_cd, j, j_mask, HALF)
        sin_lo, sin_hi = _load_row_halves(sin_ptr, t, t_mask, s_st, s_sd, j, j_mask, HALF)

        lo, hi = _load_heads(rows, t_mask, 0, NUM_HEADS, s_xd, HEAD_DIM, HALF, BLOCK_HQ, BLOCK_HALF)
        if QK_NORM:
            lo, hi = _head_rms_norm(lo, hi, qw_ptr, j, j_mask, eps, HEAD_DIM, HALF, DT)
        # rotate_half's -x[d/2:]; `* -1.0` flips the sign of zeros too (Triton's unary minus is
        # 0 - x, which is +0 for +0), so even the signs of zero results are torch's.
        q_lo = _rotate_rounded(lo, hi.to(tl.float32) * -1.0, cos_lo, sin_lo, DT)
        q_hi = _rotate_rounded(hi, lo, cos_hi, sin_hi, DT)
        _store_heads((q_ptr + t * s_qt)[:, None, None], t_mask, q_lo, q_hi, NUM_HEADS, s_qh, 1,
                     HALF, BLOCK_HQ, BLOCK_HALF)

        slot = tl.load(slots_ptr + t, mask=t_mask, other=0).to(tl.int64)
        page, offset = slot // block_size, slot % block_size
        lo, hi = _load_heads(rows, t_mask, NUM_HEADS * HEAD_DIM, NUM_KV_HEADS, s_xd, HEAD_DIM,
                             HALF, BLOCK_HK, BLOCK_HALF)
        if QK_NORM:
            lo, hi = _head_rms_norm(lo, hi, kw_ptr, j, j_mask, eps, HEAD_DIM, HALF, DT)
        k_lo = _rotate_rounded(lo, hi.to(tl.float32) * -1.0, cos_lo, sin_lo, DT)
        k_hi = _rotate_rounded(hi, lo, cos_hi, sin_hi, DT)
        _store_heads((k_ptr + page * s_kb + offset * s_kt)[:, None, None], t_mask, k_lo, k_hi,
                     NUM_KV_HEADS, s_kh, s_kd, HALF, BLOCK_HK, BLOCK_HALF)

        lo, hi = _load_heads(rows, t_mask, (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM, NUM_KV_HEADS,
                             s_xd, HEAD_DIM, HALF, BLOCK_HK, BLOCK_HALF)
        _store_heads((v_ptr + page * s_vb + offset * s_vt)[:, None, None], t_mask, lo, hi,
                     NUM_KV_HEADS, s_vh, s_vd, HALF, BLOCK_HK, BLOCK_HALF)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, T, I, s_xt, s_xd, s_ot, s_od, BLOCK_T: tl.constexpr,
                         BLOCK: tl.constexpr, INTERPRET: tl.constexpr, USE_PDL: tl.constexpr):
        """Program (BLOCK_T rows, one on a GPU; a block of columns):
        out = round(round(silu(gate)) * up)."""
        pdl_wait(USE_PDL)
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
        mask = (t < T) & (cols < I)
        row = x_ptr + t * s_xt
        gate = tl.load(row + cols * s_xd, mask=mask, other=0.0)
        up = tl.load(row + (cols + I) * s_xd, mask=mask, other=0.0)
        g = gate.to(tl.float32)
        if INTERPRET:   # the interpreter has no libdevice; NumPy's exp is accurate anyway
            e = tl.exp(-g)
        else:           # torch's CUDA silu calls expf: libdevice's, not Triton's ex2.approx
            e = libdevice.exp(-g)
        silu = tl.div_rn(g, 1.0 + e).to(gate.dtype)                   # torch divides exactly
        out = silu.to(tl.float32) * up.to(tl.float32)
        tl.store(out_ptr + t * s_ot + cols * s_od, out.to(out_ptr.dtype.element_ty), mask=mask)


# Token rows per rotary_qkv / add_rms_norm / silu_mul program under the interpreter: it pays per
# operation, whatever the tensor's size, so a block of rows costs about what one row does (on a
# GPU each program takes one).
INTERPRET_ROWS = 32


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


def _rows_per_program(rows: int) -> int:
    return min(INTERPRET_ROWS, triton.next_power_of_2(rows)) if _interpreting() else 1


def _num_warps(elements: int) -> int:
    return max(1, min(8, elements // 256))


def _need_triton(name: str) -> None:
    if triton is None:
        raise RuntimeError(f"{name} needs Triton; use {name}_reference")


def add_rms_norm(x, weight, eps: float, residual=None, pdl: bool = False):
    """Triton version of ``add_rms_norm_reference`` (see the module docstring)."""
    _need_triton("add_rms_norm")
    rows, dim = x.shape
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError("residual must have x's shape and dtype")
    hidden = x if residual is None else torch.empty_like(x)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)     # torch's `weight * normalised`
    out = torch.empty((rows, dim), dtype=out_dtype, device=x.device)
    if rows == 0:
        return out, hidden
    res = x if residual is None else residual          # never read without a residual
    block_d = triton.next_power_of_2(dim)
    block_t = _rows_per_program(rows)
    _add_rms_norm_kernel[(triton.cdiv(rows, block_t),)](
        x, res, weight, out, hidden, float(eps), rows, dim, *x.stride(), *res.stride(),
        *out.stride(), *hidden.stride(), HAS_RESIDUAL=residual is not None, BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=_num_warps(block_d), **launch_options(x.device, pdl))
    return out, hidden


def rotary_qkv(qkv, cos, sin, num_heads: int, num_kv_heads: int, head_dim: int,
               k_cache, v_cache, slots, q_norm=None, k_norm=None, eps: float = 1e-6,
               pdl: bool = False):
    """Triton version of ``rotary_qkv_reference`` (see the module docstring)."""
    _need_triton("rotary_qkv")
    if head_dim % 2 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError("qkv must be [T, (H + 2 KVH) * head_dim] with an even head_dim")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("pass both q_norm and k_norm or neither")
    rows = qkv.shape[0]
    q = torch.empty((rows, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if rows == 0:
        return q
    half = head_dim // 2
    block_half = triton.next_power_of_2(half)
    block_hq = triton.next_power_of_2(num_heads)
    qk_norm = q_norm is not None
    qw, kw = (q_norm, k_norm) if qk_norm else (cos, cos)     # never read without the norm
    block_t = _rows_per_program(rows)
    _rotary_qkv_kernel[(triton.cdiv(rows, block_t),)](
        qkv, cos, sin, q, k_cache, v_cache, slots, qw, kw, float(eps), rows,
        *qkv.stride(), *cos.stride(), *sin.stride(), q.stride(0), q.stride(1),
        *k_cache.stride(), *v_cache.stride(), k_cache.shape[1],
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HALF=half,
        BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(num_kv_heads), BLOCK_HALF=block_half,
        QK_NORM=qk_norm, num_warps=_num_warps(2 * block_hq * block_half), **launch_options(qkv.device, pdl),
        enable_fp_fusion=False)   # an FMA would skip the product's rounding torch does
    return q


def silu_mul(gate_up, pdl: bool = False):
    """Triton version of ``silu_mul_reference`` (see the module docstring)."""
    _need_triton("silu_mul")
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0 or inter == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    block_t = _rows_per_program(rows)
    _silu_mul_kernel[(triton.cdiv(rows, block_t), triton.cdiv(inter, block))](
        gate_up, out, rows, inter, *gate_up.stride(), *out.stride(), BLOCK_T=block_t, BLOCK=block,
        INTERPRET=_interpreting(), num_warps=_num_warps(block), enable_fp_fusion=False,
        **launch_options(gate_up.device, pdl))
    return out
