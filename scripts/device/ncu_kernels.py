"""Hardware counters for the attention kernels at the e2e's shape, under Nsight Compute.

    ncu --profile-from-start off --clock-control none --set detailed \
        python3 scripts/device/ncu_kernels.py

Every case is compiled and run once before `cudaProfilerStart`, so ncu sees exactly one launch of
each: verify_attention at batch 64 x 8K, 8 rows (collect none, then c2q through the first/last
tile), and sparse_attention at a 7 % budget (one draft step's layer). The question it answers: what
Collect-2-Query's extra work stalls on (its stores are 5 % of the bytes but cost +44 %), and what
the sparse gather waits for."""
from __future__ import annotations

import argparse
import math

import torch

from kernels.sparse_attention import sparse_attention
from kernels.verify_attention import collected_row_slots, collected_rows, verify_attention
from vegas_core.bench.kernels import SHAPES, paged_case


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="smollm2", choices=list(SHAPES))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--q-rows", type=int, default=8)
    args = p.parse_args()
    heads, kvh, dim, _ = SHAPES[args.shape]
    batch, context, q_rows = args.batch, args.context, args.q_rows
    k, v, tables, ctx = paged_case(batch, context, kvh, dim, 16, "cuda")
    q = torch.randn(batch * q_rows, heads, dim, device="cuda", dtype=torch.bfloat16)
    loc = torch.arange(0, batch * q_rows + 1, q_rows, dtype=torch.int32, device="cuda")
    rows = collected_rows(loc.cpu(), "c2q")
    slots = collected_row_slots(rows, batch * q_rows).cuda()

    base = context - q_rows
    budget = max(1, math.ceil(0.07 * base))
    idx = torch.topk(torch.rand(batch, kvh, base, device="cuda"), budget, dim=-1).indices
    idx = idx.sort(dim=-1).values.to(torch.int32)
    counts = torch.full((batch,), budget, dtype=torch.int32, device="cuda")
    tail = torch.full((batch,), base, dtype=torch.int32, device="cuda")
    qs = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)

    cases = {
        "verify none": lambda: verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5,
                                                max_ctx=context, max_q=q_rows),
        "verify c2q": lambda: verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, collect=rows,
                                               max_ctx=context, max_q=q_rows, row_slot=slots,
                                               c2q_tile=True),
        "sparse": lambda: sparse_attention(qs, k, v, tables, ctx, idx, counts, tail, dim ** -0.5),
    }
    for fn in cases.values():   # compile and warm outside the profiled range
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in cases.items():
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(cases))


if __name__ == "__main__":
    main()
