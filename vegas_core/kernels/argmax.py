"""The argmax of each row of a batch's logits, in Triton beside a PyTorch reference with the same
signature: a greedy chain step's token (a draft, or a plain decode step chained on the GPU).

Why a kernel: the head's bf16 logits cast to float32 and `torch.argmax` took about 2 % of a draft
step at batch 64 (bench/NOTES.md, argmax): torch gives each row one block, 64 blocks on 132 SMs,
and the cast is a copy of its own. Here each row is cut into BLOCK-wide chunks (one
program each) and a second launch reduces the chunks' winners, reading the logits once in their
own dtype.

Contract (both functions): ``x`` ``[R, V]`` floating point (float32, bfloat16 or float16),
any row stride, unit column stride for the kernel. Returns int64 ``[R]``: for each row the index of
its largest value, the first such index on ties, as ``torch.argmax`` (the values are compared in
their own dtype, so casting bf16 logits to float32 first cannot change the answer). A row of all
``-inf`` gives 0, and NaN counts as larger than anything (the first NaN's index), as torch. The
NaN rule matters in a CUDA graph: a bucket's padding rows compute from whatever their buffers
hold, and an index past the vocabulary would be the next step's embedding lookup.
"""
from __future__ import annotations

import torch

from .fused import _need_triton, tl, triton
from .pdl import launch_options

if triton is not None:
    from .pdl import pdl_wait


def argmax_rows_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.argmax(x, dim=-1)


# Chunk width of the first launch: 4,096 values (8 KB of bf16) per program, 12 programs a row for a
# 49K vocabulary (768 at batch 64). Under the interpreter a program costs the same whatever its
# size, so the CPU tests take the same width and few programs.
BLOCK = 4096


if triton is not None:

    @triton.jit
    def _first_max(vals, idx, valid, V):
        """(the largest of `vals` where `valid`, the smallest `idx` holding it), with torch's
        rules: ties take the lowest index, NaN beats everything (the first NaN's index, and the
        value NaN, whatever tl.max made of it). An index V means none was valid."""
        best = tl.max(vals, axis=0)
        first = tl.min(tl.where(valid & (vals == best), idx, V), axis=0)
        first_nan = tl.min(tl.where(valid & (vals != vals), idx, V), axis=0)
        has_nan = first_nan < V
        return tl.where(has_nan, float("nan"), best), tl.where(has_nan, first_nan, first)

    @triton.jit
    def _chunk_argmax_kernel(x_ptr, s_x, val_ptr, idx_ptr, V, chunks, BLOCK: tl.constexpr,
                             USE_PDL: tl.constexpr):
        """Program (row, chunk): the chunk's largest value (float32) and its first index (an all
        -inf chunk: its first index)."""
        pdl_wait(USE_PDL)
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        valid = offs < V
        x = tl.load(x_ptr + row.to(tl.int64) * s_x + offs, mask=valid, other=float("-inf"))
        x = x.to(tl.float32)                       # exact for bf16 / fp16: the order is kept
        best, first = _first_max(x, offs, valid, V)
        tl.store(val_ptr + row * chunks + chunk, best)
        tl.store(idx_ptr + row * chunks + chunk, first)

    @triton.jit
    def _row_argmax_kernel(val_ptr, idx_ptr, out_ptr, V, chunks, CHUNKS_PAD: tl.constexpr,
                           USE_PDL: tl.constexpr):
        """Program (row): the winner among the row's chunk winners. Chunks are in index order, so
        the first chunk holding the maximum (or a NaN) holds the row's first such index; a row of
        all -inf gives the first chunk's first index, 0."""
        pdl_wait(USE_PDL)
        row = tl.program_id(0)
        c = tl.arange(0, CHUNKS_PAD)
        valid = c < chunks
        vals = tl.load(val_ptr + row * chunks + c, mask=valid, other=float("-inf"))
        idx = tl.load(idx_ptr + row * chunks + c, mask=valid, other=V)
        _, first = _first_max(vals, idx, valid, V)
        tl.store(out_ptr + row, first.to(tl.int64))


def argmax_rows(x: torch.Tensor, block: int = BLOCK, pdl: bool = False) -> torch.Tensor:
    """Triton version of ``argmax_rows_reference`` (see the module docstring). Allocates with
    ``torch.empty`` and reads only shapes on the host: CUDA-graph safe."""
    _need_triton("argmax_rows")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point [R, V] tensor, got {x.dtype} {tuple(x.shape)}")
    rows, vocab = x.shape
    if vocab == 0:
        raise ValueError("argmax of an empty row")
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    block = min(block, triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, block)
    vals = torch.empty(rows, chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, chunks, dtype=torch.int32, device=x.device)
    opts = launch_options(x.device, pdl)
    _chunk_argmax_kernel[(rows, chunks)](x, x.stride(0), vals, idx, vocab, chunks, BLOCK=block,
                                         num_warps=4, **opts)
    _row_argmax_kernel[(rows,)](vals, idx, out, vocab, chunks,
                                CHUNKS_PAD=max(2, triton.next_power_of_2(chunks)), num_warps=1, **opts)
    return out
