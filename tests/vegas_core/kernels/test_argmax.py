"""`kernels.argmax.argmax_rows` gives exactly `torch.argmax`'s indices: first index on ties (within a
chunk and across chunks), rows of -inf, vocabularies that are not a multiple of the chunk, strided
rows, bf16 / fp16 / fp32, and NaN as torch takes it (the largest: a CUDA graph's padding rows
may hold it, and an index past the vocabulary would crash the next step's embedding lookup). Under the interpreter on the CPU; compiled on a GPU with
TRITON_INTERPRET=0."""
import os

import pytest
import torch

from vegas_core.kernels.argmax import argmax_rows, argmax_rows_reference

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"


def _logits(rows, vocab, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * 4).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,vocab,block", [(1, 1, 4096), (3, 37, 16), (5, 1000, 128),
                                              (4, 49152, 4096), (2, 5000, 4096)])
def test_matches_torch_argmax(dtype, rows, vocab, block):
    x = _logits(rows, vocab, dtype, seed=rows * 7 + vocab)
    assert torch.equal(argmax_rows(x, block=block).cpu(), argmax_rows_reference(x).cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ties_take_the_first_index(dtype):
    vocab, block = 1000, 64
    x = _logits(6, vocab, dtype, seed=3)
    top = x.max() + 1
    x[0, [700, 5, 900]] = top                 # across chunks: 5 wins
    x[1, [130, 129]] = top                    # within one chunk: 129 wins
    x[2, [64, 63]] = top                      # either side of a chunk edge: 63 wins
    x[3, [999, 998]] = top                    # in the last, partial chunk
    x[4] = float("-inf")                      # nothing but -inf: 0, as torch
    x[5, :] = top                             # all equal: 0
    got = argmax_rows(x, block=block).cpu()
    assert got.tolist() == [5, 129, 63, 998, 0, 0]
    assert torch.equal(got, argmax_rows_reference(x).cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nan_is_the_largest_value_as_in_torch(dtype):
    vocab, block = 300, 32
    x = _logits(5, vocab, dtype, seed=9)
    x[0, [250, 40]] = float("nan")            # first NaN across chunks: 40
    x[0, 10] = float("inf")                   # an earlier +inf does not beat it
    x[1] = float("nan")                       # all NaN: 0
    x[2, 299] = float("nan")                  # in the last, partial chunk
    x[3, [33, 34]] = float("nan")             # two in one chunk: 33
    x[4, 7] = float("nan")
    x[4, 200:] = float("-inf")
    got = argmax_rows(x, block=block).cpu()
    assert got.tolist() == [40, 0, 299, 33, 7]
    assert torch.equal(got, argmax_rows_reference(x).cpu())
    assert int(argmax_rows(torch.full((3, vocab), float("nan"), dtype=dtype, device=DEVICE),
                           block=block).max()) < vocab


def test_strided_rows_and_empty_batch():
    x = _logits(8, 300, torch.bfloat16, seed=5)
    view = x[::2, 10:290]                     # row stride 600, unit column stride
    assert torch.equal(argmax_rows(view, block=32).cpu(), argmax_rows_reference(view).cpu())
    cols = x.t().contiguous().t()            # column stride != 1: copied first
    assert torch.equal(argmax_rows(cols, block=64).cpu(), argmax_rows_reference(x).cpu())
    assert argmax_rows(x[:0]).shape == (0,)


def test_rejects_what_it_cannot_take():
    with pytest.raises(ValueError):
        argmax_rows(torch.zeros(2, 3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError):
        argmax_rows(torch.zeros(2, 0, device=DEVICE))
    with pytest.raises(ValueError):
        argmax_rows(torch.zeros(5, device=DEVICE))
