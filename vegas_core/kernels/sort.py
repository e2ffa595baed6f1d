"""A sort of each row of a block, for use inside Triton kernels: ``sort_rows(x, descending,
INTERPRET)`` sorts a ``[R, N]`` (or ``[N]``) tensor along its last axis, N and R powers of two, as
``tl.sort``; the caller passes its ``INTERPRET`` constexpr (whether Triton's interpreter runs it).

Why not ``tl.sort`` under the interpreter: it is the same network, but each compare-and-swap finds
an element's partner with ``xor_sum`` over a size-2 axis, and under ``TRITON_INTERPRET=1`` a
reduction with a custom combine function runs that function once per element in Python (a 16-key
sort took about 100 ms, a 512-key one seconds). Here the pair's minimum and maximum come from
``tl.min`` / ``tl.max``, which the interpreter runs as numpy calls; compiled, both are reductions
over an axis of two.
Equal keys are interchangeable (the kernels here sort packed, unique keys).

Compiled (``INTERPRET=False``) it is ``tl.sort`` itself: Quest ran slower end to end with the
network compiled (bench/NOTES.md, sort.sort_rows), so only the interpreter takes the network.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None


if triton is not None:

    @triton.constexpr_function
    def _log2(n):
        return n.bit_length() - 1

    @triton.jit
    def _indicator(n_dims: tl.constexpr, j: tl.constexpr):
        """0 / 1 along hypercube axis ``n_dims - 1 - j`` (whether an element is its pair's right)."""
        return tl.reshape(tl.arange(0, 2), [1] * (n_dims - j - 1) + [2] + [1] * j)

    @triton.jit
    def _compare_and_swap(h, flip, i: tl.constexpr):
        """Pairs along the i-th innermost axis of the hypercube: the left one takes the minimum
        and the right one the maximum, or the reverse where ``flip``."""
        n_dims: tl.constexpr = _log2(h.numel)
        lo = tl.min(h, axis=n_dims - 1 - i, keep_dims=True)
        hi = tl.max(h, axis=n_dims - 1 - i, keep_dims=True)
        return tl.where((flip ^ _indicator(n_dims, i)) == 1, hi, lo)

    @triton.jit
    def _bitonic_merge(h, stage: tl.constexpr, order: tl.constexpr):
        """order 0 ascending, 1 descending, 2 alternating in runs of 2**stage."""
        if order == 2:
            flip = _indicator(_log2(h.numel), stage)
        else:
            flip = order
        for i in tl.static_range(stage):
            h = _compare_and_swap(h, flip, stage - 1 - i)
        return h

    @triton.jit
    def sort_rows(x, descending: tl.constexpr, INTERPRET: tl.constexpr):
        if INTERPRET:
            log_n: tl.constexpr = _log2(x.shape[len(x.shape) - 1])
            h = tl.reshape(x, [2] * _log2(x.numel))
            for i in tl.static_range(1, log_n + 1):
                h = _bitonic_merge(h, i, 2 if i < log_n else descending)
            return tl.reshape(h, x.shape)
        else:
            return tl.sort(x, descending=descending)
