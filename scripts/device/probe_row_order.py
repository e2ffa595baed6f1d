"""A/B in one process at SmolLM2's shape (batch 64 x 8K, 7 and 9 rows, every collection path):
kernels/verify_attention.py at 94ef9b8 ("before", natural row order) against 9b9ac44 ("after":
tile rows ordered first, last, then the rest, C2Q taken from the main tile). Written to check
whether run 31's slower main-tile collection (vegas-all, specextend) was the kernel: it was
(bench/results/kernels-2026-12-02-h200-row-order-ab.json), and 9b9ac44 was reverted. To run it
again, from the repository root with PYTHONPATH=.:
    git show 94ef9b8:kernels/verify_attention.py > kernels/_ab_before_verify.py
    git show 9b9ac44:kernels/verify_attention.py > kernels/verify_attention.py   (then restore it)
"""
import json, os, torch, datetime
import kernels.verify_attention as new_v, kernels._ab_before_verify as old_v
from kernels.verify_attention import collected_row_slots, collected_rows
from vegas_core.bench.kernels import _bench, paged_case
from vegas_core.bench.common import copy_bandwidth
from vegas_core.bench.common import device_description
dev = torch.device("cuda"); copy = copy_bandwidth(dev); recs = []
for rows in (7, 9):
    heads, kvh, dim = 9, 3, 64
    k, v, tables, ctx = paged_case(64, 8192, kvh, dim, 16, dev)
    q = torch.randn(64 * rows, heads, dim, device=dev, dtype=torch.bfloat16)
    loc = torch.arange(0, 64 * rows + 1, rows, dtype=torch.int32, device=dev)
    for collect in ("none", "c2q", "c2q-main", "all"):
        crow = collected_rows(loc.cpu(), collect.split("-")[0])
        slots = collected_row_slots(crow, 64 * rows).to(dev) if collect != "none" else None
        mode = crow if collect != "none" else "none"
        for name, mod in (("before", old_v), ("after", new_v)):
            us = _bench(lambda: mod.verify_attention(q, k, v, tables, ctx, loc, 0.125, collect=mode, max_ctx=8192,
                                                     max_q=rows, row_slot=slots, c2q_tile=collect == "c2q"))
            recs.append(dict(rows=rows, collect=collect, version=name, us=us))
            print(rows, collect, name, round(us, 1))
    del k, v; torch.cuda.empty_cache()
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
json.dump(dict(date=datetime.date.today().isoformat(), device=device_description(dev), copy_TBps=copy,
               command="A/B of kernels/verify_attention.py at 94ef9b8 (before) against the row-ordered kernel with c2q_from_main (after)",
               records=recs), open(os.environ["OUT"] + "/results/kernels-row-order-ab.json", "w"), indent=1)
