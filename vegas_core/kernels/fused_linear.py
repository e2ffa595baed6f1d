"""A decoder layer's projections with their neighbours fused in, in Triton beside plain PyTorch
references with the same signatures. At decode batch sizes (64 rows) every projection of a small
model is a 3-4 us kernel that reads a few hundred KB of weights, and the RMSNorm before it and the
SiLU * up or residual add after it are launches of their own (about 2 us each, plus the gap between
two kernels). Here the norm is the product's prologue and the SiLU * up or the residual add its
epilogue, so a layer runs its four projections in four launches and nothing else around them.

Contract (each ``name`` and ``name_reference`` take and return the same):
- ``norm_linear(x, norm_weight, eps, weight, bias=None, silu_mul=False) -> out``: x ``[T, K]``,
  weight ``[N, K]`` (``nn.Linear``'s). ``out = F.linear(rms_norm(x), weight, bias)`` with
  ``rms_norm`` as ``vegas_core.model.RMSNorm`` (normalise in float32, cast to x's dtype, then
  multiply by the weight). With ``silu_mul`` the weight is gate_up's ``[2 I, K]`` (gate rows first)
  and ``out [T, I] = silu(gate) * up``, each rounded to the dtype as ``kernels.fused.silu_mul``.
  ``norm_weight=None`` leaves out the norm.
- ``linear_add(x, weight, residual, bias=None) -> residual``: ``residual += F.linear(x, weight,
  bias)``, in place, the product rounded to the dtype before the add (as torch's two ops round).

Batch invariance: the launch configuration is chosen from (N, K) only, never from T, so a row's
result has the same bits whatever the number of rows beside it (a verification's 576 rows give
each row what a 64-row decode step gives it). cuBLAS picks another kernel per shape. The engine
runs these for forwards of up to `CausalLM.fused_linear_rows` rows (decode and draft steps by
default: at 576 rows cuBLAS is faster); raised to cover verifications, greedy output matched
vanilla's more often (bench/NOTES.md version 37). The batch-invariant mode
(`KernelOptions.deterministic`) runs every forward's projections and the head through them.

On a GPU in bf16 the products are not cuBLAS's bits (another reduction order); float32 inputs use
IEEE float32 products (no TF32). The kernels only read shapes, strides and dtypes on the host and
allocate with ``torch.empty``: CUDA-graph safe.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Triton is optional (the CPU engine path only needs the references): fused.py's import of it.
from .fused import _need_triton, _rms_norm_reference, libdevice, silu_mul_reference, tl, triton
from .pdl import launch_options

if triton is not None:
    from .pdl import pdl_wait


# -- references -----------------------------------------------------------------------------------

def norm_linear_reference(x, norm_weight, eps: float, weight, bias=None, silu_mul: bool = False):
    h = x if norm_weight is None else _rms_norm_reference(x, norm_weight, eps)
    out = F.linear(h, weight, bias)
    return silu_mul_reference(out) if silu_mul else out


def linear_add_reference(x, weight, residual, bias=None):
    residual += F.linear(x, weight, bias)
    return residual


# -- launch configurations ------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) per (N, K, silu_mul): the fastest at 64 rows
# on the H200 (bench/NOTES.md, fused_linear.CONFIGS); shapes not listed take DEFAULT_CONFIG. Chosen
# from (N, K) alone so results do not depend on the number of rows (see the module docstring).
CONFIGS: dict[tuple[int, int, bool], tuple[int, int, int, int, int]] = {
    # SmolLM2-135M
    (960, 576, False): (16, 32, 64, 4, 3),       # qkv
    (576, 576, False): (64, 16, 128, 4, 3),      # o_proj
    (1536, 576, True): (16, 64, 64, 4, 3),       # gate_up
    (576, 1536, False): (64, 16, 128, 4, 3),     # down_proj
    # Qwen2.5-0.5B, at 64 rows on an H100 (bench/results/linear-2026-12-06-h100-qwen.json)
    (1152, 896, False): (16, 64, 128, 8, 3),     # qkv
    (896, 896, False): (16, 32, 128, 4, 3),      # o_proj
    (4864, 896, True): (64, 64, 128, 8, 3),      # gate_up
    (896, 4864, False): (16, 16, 128, 4, 3),     # down_proj
}
DEFAULT_CONFIG = (16, 32, 64, 4, 3)
# The head (vocabulary-wide N), which only the batch-invariant mode runs here: wide tiles, so the
# 49K x 576 weight is read once per 64 rows. Not tuned on a GPU yet.
HEAD_CONFIG = (64, 128, 64, 4, 3)


# Under the interpreter (CI) a program costs tens of ms of Python whatever its size, so the engine's
# forwards there take few, large tiles; the kernel tests still run the GPU's tile sizes explicitly.
INTERPRET_CONFIG = (256, 256, 64, 4, 1)


def config_for(n: int, k: int, silu_mul: bool, table: dict | None = None
               ) -> tuple[int, int, int, int, int]:
    """The launch for an (N, K) product: ``table``'s (the batch-invariant mode's tuned choices,
    `options.InvariantConfig.linear`) where it lists the shape, else `CONFIGS`' or
    `DEFAULT_CONFIG`. Under the interpreter always `INTERPRET_CONFIG`."""
    if triton is not None and triton.knobs.runtime.interpret:
        return INTERPRET_CONFIG
    if table and (n, k, silu_mul) in table:
        return table[n, k, silu_mul]
    return CONFIGS.get((n, k, silu_mul), DEFAULT_CONFIG)


def head_config(config: tuple[int, int, int, int, int] | None = None
                ) -> tuple[int, int, int, int, int]:
    """The head's launch: ``config`` (`options.InvariantConfig.head`) or `HEAD_CONFIG`; under the
    interpreter `INTERPRET_CONFIG`."""
    if triton is not None and triton.knobs.runtime.interpret:
        return INTERPRET_CONFIG
    return config or HEAD_CONFIG



# -- Triton ---------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _silu_times(gate, up, DT: tl.constexpr, INTERPRET: tl.constexpr):
        """round(round(silu(gate)) * up) from float32 gate and up already rounded to DT, as
        `kernels.fused._silu_mul_kernel` (torch's CUDA silu: expf and an exact division)."""
        if INTERPRET:   # the interpreter has no libdevice; NumPy's exp is accurate anyway
            e = tl.exp(-gate)
        else:
            e = libdevice.exp(-gate)
        silu = tl.div_rn(gate, 1.0 + e).to(DT)
        return (silu.to(tl.float32) * up).to(DT)

    @triton.jit
    def row_inv_rms(x_rows, r_mask, s_xk, eps, K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr):
        """The rows' inverse RMS (RMSNorm's, in float32): a first pass over x (a few KB a row,
        from L2). ``x_rows`` are [BLOCK_M, 1] row pointers."""
        ks = tl.arange(0, BLOCK_K)
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = (k0 + ks) < K
            x = tl.load(x_rows + (k0 + ks)[None, :] * s_xk,
                        mask=r_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
            sum_sq += tl.sum(x * x, axis=1)
        return tl.rsqrt(sum_sq / K + eps)

    @triton.jit
    def x_tile(x_rows, r_mask, s_xk, k0, ks, k_mask, nw_ptr, inv_rms, NORM: tl.constexpr,
               DT: tl.constexpr):
        """Columns k0 + ks of x's rows, RMS-normalised with RMSNorm.forward's roundings
        (normalise, cast, then the weight's multiply) when NORM."""
        x = tl.load(x_rows + (k0 + ks)[None, :] * s_xk, mask=r_mask[:, None] & k_mask[None, :],
                    other=0.0)
        if NORM:
            nw = tl.load(nw_ptr + k0 + ks, mask=k_mask, other=0.0).to(tl.float32)
            normalised = (x.to(tl.float32) * inv_rms[:, None]).to(DT)
            x = (nw[None, :] * normalised.to(tl.float32)).to(DT)
        return x

    @triton.jit
    def _fused_linear_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, res_ptr, out_ptr, M, N, eps, up_row, s_xm, s_xk, s_wn, s_wk, s_rm, s_rn, s_om, s_on,
                             K: tl.constexpr, NORM: tl.constexpr, SILU_MUL: tl.constexpr, HAS_BIAS: tl.constexpr,
                             ADD_RESIDUAL: tl.constexpr, PRECISION: tl.constexpr,
                             INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
        """Program (column block, row block) of out = epilogue(norm(x) @ weight.T). K, the
        model's width, is a compile-time constant: loops over it are pipelined, and the
        interpreter takes no runtime bound in range()."""
        DT: tl.constexpr = x_ptr.dtype.element_ty
        pdl_wait(USE_PDL)
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        r_mask, c_mask = rows < M, cols < N
        ks = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + rows[:, None].to(tl.int64) * s_xm
        w_rows = w_ptr + cols[:, None].to(tl.int64) * s_wn
        if NORM:
            inv_rms = row_inv_rms(x_rows, r_mask, s_xk, eps, K, BLOCK_M, BLOCK_K)
        else:
            inv_rms = tl.zeros([BLOCK_M], dtype=tl.float32)   # not read
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if SILU_MUL:
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = (k0 + ks) < K
            x = x_tile(x_rows, r_mask, s_xk, k0, ks, k_mask, nw_ptr, inv_rms, NORM, DT)
            w_mask = c_mask[:, None] & k_mask[None, :]
            w = tl.load(w_rows + (k0 + ks)[None, :] * s_wk, mask=w_mask, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            if SILU_MUL:
                w_up = tl.load(w_rows + up_row * s_wn + (k0 + ks)[None, :] * s_wk, mask=w_mask,
                               other=0.0)
                acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=c_mask, other=0.0).to(tl.float32)[None, :]
        out = acc.to(DT)                                   # the product's own rounding
        if SILU_MUL:
            out = _silu_times(out.to(tl.float32), acc_up.to(DT).to(tl.float32), DT, INTERPRET)
        mask = r_mask[:, None] & c_mask[None, :]
        if ADD_RESIDUAL:   # torch's add: both operands in the dtype, one rounding
            res = res_ptr + rows[:, None].to(tl.int64) * s_rm + cols[None, :] * s_rn
            out = (out.to(tl.float32) + tl.load(res, mask=mask, other=0.0).to(tl.float32)).to(DT)
        tl.store(out_ptr + rows[:, None].to(tl.int64) * s_om + cols[None, :] * s_on, out,
                 mask=mask)


def _launch(x, norm_weight, eps, weight, bias, residual, out, n_out, silu_mul, config, pdl):
    rows, k = x.shape
    if rows == 0 or n_out == 0:
        return
    block_m, block_n, block_k, warps, stages = config
    precision = "ieee" if x.dtype == torch.float32 else "tf32"   # tf32 is ignored for 16-bit
    res = out if residual is None else residual
    grid = (triton.cdiv(n_out, block_n), triton.cdiv(rows, block_m))
    _fused_linear_kernel[grid](
        x, x if norm_weight is None else norm_weight, weight, x if bias is None else bias, res,
        out, rows, n_out, float(eps), n_out if silu_mul else 0, *x.stride(), *weight.stride(),
        *res.stride(), *out.stride(), K=k,
        NORM=norm_weight is not None, SILU_MUL=silu_mul, HAS_BIAS=bias is not None,
        ADD_RESIDUAL=residual is not None, PRECISION=precision,
        INTERPRET=bool(triton.knobs.runtime.interpret), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=warps, num_stages=stages, **launch_options(x.device, pdl),
        enable_fp_fusion=False)   # an FMA would skip roundings the references make


def _check(x, weight, bias):
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x [T, K] and weight [N, K] expected, got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError("x, weight and bias must share a dtype")


def norm_linear(x, norm_weight, eps: float, weight, bias=None, silu_mul: bool = False,
                config: tuple[int, int, int, int, int] | None = None, pdl: bool = False,
                table: dict | None = None):
    """Triton version of ``norm_linear_reference`` (see the module docstring); ``config``
    overrides the launch configuration, ``table`` the per-shape choices (`config_for`)."""
    _need_triton("norm_linear")
    _check(x, weight, bias)
    n = weight.shape[0]
    if silu_mul and (n % 2 or bias is not None):
        raise ValueError("silu_mul needs a [2 I, K] gate_up weight and no bias")
    n_out = n // 2 if silu_mul else n
    out = torch.empty((x.shape[0], n_out), dtype=x.dtype, device=x.device)
    _launch(x, norm_weight, eps, weight, bias, None, out, n_out, silu_mul,
            config or config_for(n_out, x.shape[1], silu_mul, table), pdl)
    return out


def linear_add(x, weight, residual, bias=None, config: tuple[int, int, int, int, int] | None = None,
               pdl: bool = False, table: dict | None = None):
    """Triton version of ``linear_add_reference`` (see the module docstring); ``config`` and
    ``table`` as `norm_linear`'s."""
    _need_triton("linear_add")
    _check(x, weight, bias)
    if residual.shape != (x.shape[0], weight.shape[0]) or residual.dtype != x.dtype:
        raise ValueError("residual must be [T, N] in x's dtype")
    _launch(x, None, 0.0, weight, bias, residual, residual, weight.shape[0], False,
            config or config_for(weight.shape[0], x.shape[1], False, table), pdl)
    return residual
