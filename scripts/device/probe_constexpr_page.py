"""A/B in one process: verify_attention and sparse_attention with the page size a runtime argument
against a constexpr (bench/results/kernels-2026-12-02-h200-constexpr-page.json). The "before"
kernels are not kept in the tree; to run it again, restore them first:
    git show d4e58bc:kernels/verify_attention.py > kernels/_ab_before_verify.py
    git show d4e58bc:kernels/sparse_attention.py > kernels/_ab_before_sparse.py
(and delete them after)."""
import json, math, os
import torch
from vegas_core.bench.kernels import _bench, paged_case
from vegas_core.bench.common import copy_bandwidth
from vegas_core.bench import common
import kernels.verify_attention as new_v, kernels._ab_before_verify as old_v
import kernels.sparse_attention as new_s, kernels._ab_before_sparse as old_s
from kernels.verify_attention import collected_rows, collected_row_slots

dev = torch.device("cuda")
copy = copy_bandwidth(dev)
records = []
for shape, (heads, kvh, dim) in (("smollm2", (9, 3, 64)), ("8b", (32, 8, 128))):
    for rows, ctx_len in ((1, 6144), (1, 8192), (8, 8192)):
        k, v, tables, ctx = paged_case(64, ctx_len, kvh, dim, 16, dev)
        q = torch.randn(64 * rows, heads, dim, device=dev, dtype=torch.bfloat16)
        loc = torch.arange(0, 64 * rows + 1, rows, dtype=torch.int32, device=dev)
        crow = collected_rows(loc.cpu(), "c2q")
        slots = collected_row_slots(crow, 64 * rows).to(dev)
        kv_bytes = 2 * 64 * ctx_len * kvh * dim * 2
        ref = old_v.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, max_ctx=ctx_len, max_q=rows)[0]
        got = new_v.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, max_ctx=ctx_len, max_q=rows)[0]
        same = bool(torch.equal(ref, got))
        cfgs = [{}, dict(max_registers=0), dict(num_stages=3), dict(block_n=64), dict(num_warps=2)]
        for collect in (("none",) if rows == 1 else ("none", "c2q")):
            mode = "none" if collect == "none" else crow
            for name, mod in (("before", old_v), ("constexpr", new_v)):
                for cfg in (cfgs if name == "constexpr" else [{}]):
                    try:
                        us = _bench(lambda: mod.verify_attention(
                            q, k, v, tables, ctx, loc, dim ** -0.5, collect=mode, max_ctx=ctx_len,
                            max_q=rows, row_slot=None if collect == "none" else slots,
                            c2q_tile=collect == "c2q", **cfg))
                    except Exception as e:  # noqa: BLE001
                        print(shape, rows, ctx_len, collect, name, cfg, "error", str(e)[:100]); continue
                    rec = dict(kernel="verify_attention", version=name, shape=shape, batch=64, context=ctx_len,
                               q_rows=rows, collect=collect, config=cfg, us=us, kv_bytes=kv_bytes,
                               copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy, same_bits_as_before=same)
                    records.append(rec)
                    print(f"{shape} rows {rows} ctx {ctx_len} {collect:4s} {name:9s} {cfg}: {us:7.1f} us "
                          f"{rec['copy_fraction']:.0%} of copy  same={same}")
        del k, v
        torch.cuda.empty_cache()
    # sparse at 7 % of 8K plus an 8-entry tail
    k, v, tables, ctx = paged_case(64, 8192, kvh, dim, 16, dev)
    base = 8192 - 8
    budget = math.ceil(0.07 * base)
    idx = torch.topk(torch.rand(64, kvh, base, device=dev), budget, dim=-1).indices.sort(dim=-1).values.to(torch.int32)
    counts = torch.full((64,), budget, dtype=torch.int32, device=dev)
    tail = torch.full((64,), base, dtype=torch.int32, device=dev)
    q = torch.randn(64, heads, dim, device=dev, dtype=torch.bfloat16)
    gathered = 2 * 64 * (budget + 8) * kvh * dim * 2
    for name, mod in (("before", old_s), ("constexpr", new_s)):
        us = _bench(lambda: mod.sparse_attention(q, k, v, tables, ctx, idx, counts, tail, dim ** -0.5))
        rec = dict(kernel="sparse_attention", version=name, shape=shape, batch=64, context=8192, sparsity=0.07,
                   us=us, copy_fraction=gathered / (us * 1e-6) / 1e12 / copy)
        records.append(rec)
        print(f"{shape} sparse 7% {name}: {us:.1f} us {rec['copy_fraction']:.0%} of copy")
    del k, v
    torch.cuda.empty_cache()
import datetime
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
path = os.environ["OUT"] + "/results/kernels-constexpr-page.json"
json.dump(dict(date=datetime.date.today().isoformat(), device=common.device_description(dev),
               command="python scripts/device/probe_constexpr_page.py", torch=torch.__version__,
               copy_TBps=copy, records=records), open(path, "w"), indent=1)
print("wrote", path)
