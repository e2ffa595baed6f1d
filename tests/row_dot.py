"""Triton's interpreter with a `tl.dot` whose rows do not depend on each other, for the tests of the
batch-invariant mode (`EngineOptions(deterministic=True)`).

Why: the mode rests on each element of a compiled `tl.dot` coming out of the same instruction
sequence whatever its row in the tile (a tensor core's MMA), so a query row gets the same bits as
row 0 of a decode step or row 40 of a verification tile of the same size. Triton 3.6's interpreter
computes `tl.dot` as one NumPy `matmul` (OpenBLAS's sgemm), which sums a row in an order that
depends on where it sits in the tile: a 64 x 32 by 32 x 16 product differed from the same rows
multiplied alone in 30 of 64 rows. Under the interpreter the kernels could then not show the
invariance that the GPU gives them.

The interpreter also multiplies bf16 operands as their storage's integers (it holds bf16 as
uint16), so a bf16 dot is meaningless there; here they are widened to their float32 values first
(exact), as a tensor core takes them.

What changes, inside `row_by_row_dot()` only: a 2-D `tl.dot` multiplies each row of ``a`` on its own
(a stacked `matmul` of [M, 1, K] by [K, N]: the same call shape for every row), then adds the
accumulator, as Triton's `create_dot` does. Other dots (8-bit floats, 3-D) keep Triton's code.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def row_by_row_dot():
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.ndim != 2 or a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        rows = np.matmul(values(a)[:, None, :], values(b), dtype=d.data.dtype)[:, 0, :]
        return interpreter.TensorHandle(rows + d.data, d.dtype.scalar)

    def values(x):
        if x.dtype.scalar == tl.bfloat16:
            return (x.data.astype(np.uint32) << 16).view(np.float32)
        return x.data

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = original
