"""`kernels.sort.sort_rows` sorts each row of a block exactly as torch.sort does (values only; equal
keys are interchangeable), ascending and descending, for the dtypes the kernels sort: both its
min/max network (the interpreter's) and tl.sort (the GPU's), whichever way the tests run."""
import os

import pytest
import torch
import triton
import triton.language as tl

from vegas_core.kernels.sort import sort_rows

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"


@triton.jit
def _sort_kernel(x_ptr, out_ptr, R: tl.constexpr, N: tl.constexpr, DESCENDING: tl.constexpr,
                 NETWORK: tl.constexpr):
    offs = tl.arange(0, R)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(out_ptr + offs, sort_rows(tl.load(x_ptr + offs), DESCENDING, NETWORK))


def _random(rows, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.float32:
        x = torch.randn(rows, n, generator=g)
        if n >= 8:
            x[:, ::5] = float("-inf")
            x[:, 1::7] = 0.5                               # repeats
        return x
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (rows, n), generator=g, dtype=dtype)
    if n >= 8:
        x[:, 1::3] = x[:, :1]                              # repeats
    return x


@pytest.mark.parametrize("rows,n", [(1, 2), (1, 16), (4, 64), (2, 512)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("network", [True, False], ids=["min-max network", "tl.sort"])
def test_sort_rows_equals_torch_sort(rows, n, dtype, descending, network):
    x = _random(rows, n, dtype, seed=rows * n).to(DEVICE)
    if torch.equal(torch.sort(x, dim=-1, descending=descending).values, x):
        x = x.flip(-1)                                     # a case with something to do
    out = torch.empty_like(x)
    _sort_kernel[(1,)](x, out, R=rows, N=n, DESCENDING=int(descending), NETWORK=network)
    want = torch.sort(x, dim=-1, descending=descending).values
    assert torch.equal(out, want)
    assert not torch.equal(out, x)                          # the input was not already sorted
