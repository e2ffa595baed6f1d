"""A/B in one process: verify_attention loading each tile's block-table entries PAGE_AHEAD tiles
ahead (`verify_attention(page_ahead=...)`: 0, the tile's own load in front of its K/V gather; 1; 2),
with 2 and 3 pipeline stages. Nsight Compute at one row (run 48) had the program latency-bound
with a third of its stall on global loads. Batch 64, SmolLM2's shape at one row (6K and 8K) and
8 rows (no collection and C2Q, 8K), the 8B-like shape at one and 8 rows (8K). The same output bits
every way is checked. Writes $OUT/results/kernels-page-ahead.json."""
import datetime
import json
import os

import torch

import kernels.verify_attention as va
from kernels.verify_attention import collected_row_slots, collected_rows
from vegas_core.bench import common
from vegas_core.bench.kernels import SHAPES, _bench, paged_case
from vegas_core.bench.common import copy_bandwidth

VARIANTS = [(0, None), (1, None), (2, None), (0, 3), (1, 3), (2, 3)]   # (PAGE_AHEAD, num_stages)
dev = torch.device("cuda")
copy = copy_bandwidth(dev)
records = []
cases = [("smollm2", 1, 6144), ("smollm2", 1, 8192), ("smollm2", 8, 8192), ("8b", 1, 8192), ("8b", 8, 8192)]
for shape, rows, ctx_len in cases:
    heads, kvh, dim, _ = SHAPES[shape]
    batch = 64
    k, v, tables, ctx = paged_case(batch, ctx_len, kvh, dim, 16, dev)
    q = torch.randn(batch * rows, heads, dim, device=dev, dtype=torch.bfloat16)
    loc = torch.arange(0, batch * rows + 1, rows, dtype=torch.int32, device=dev)
    crow = collected_rows(loc.cpu(), "c2q")
    slots = collected_row_slots(crow, batch * rows).to(dev)
    kv_bytes = 2 * batch * ctx_len * kvh * dim * 2
    for collect in (("none",) if rows == 1 else ("none", "c2q")):
        kw = dict(max_ctx=ctx_len, max_q=rows)
        if collect == "c2q":
            kw.update(collect=crow, row_slot=slots, c2q_tile=True)
        base = None
        for ahead, stages in VARIANTS:
            kw["page_ahead"] = ahead
            if stages:
                kw["num_stages"] = stages
            else:
                kw.pop("num_stages", None)
            out = va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw)[0]
            base = out if base is None else base
            same = bool(torch.equal(out, base))
            us = _bench(lambda: va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw))
            rec = dict(kernel="verify_attention", page_ahead=ahead, num_stages=stages, shape=shape, batch=batch,
                       context=ctx_len, q_rows=rows, heads=heads, kv_heads=kvh, head_dim=dim,
                       collect=collect, us=us, kv_bytes=kv_bytes,
                       read_TBps=kv_bytes / (us * 1e-6) / 1e12, copy_TBps=copy,
                       copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy, same_bits_as_ahead_0=same)
            records.append(rec)
            print(f"{shape} rows {rows} ctx {ctx_len} {collect:4s} ahead {ahead} stages {stages}: {us:7.1f} us "
                  f"{rec['copy_fraction']:.0%} of copy same={same}")
    del k, v
    torch.cuda.empty_cache()
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
path = os.environ["OUT"] + "/results/kernels-page-ahead.json"
with open(path, "w") as f:
    json.dump(dict(date=datetime.date.today().isoformat(), device=common.device_description(dev),
                   command="python scripts/device/probe_page_ahead.py", torch=torch.__version__,
                   copy_TBps=copy, records=records), f, indent=1)
print("wrote", path)
