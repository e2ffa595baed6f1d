"""A/B in one process: Collect-2-Query through the first/last tile (a second small dot per key
tile, the engine's path until then) against the first and last rows placed first in the main tile and their
scores taken from it (`c2q_from_main=True`), at batch 64 x 8K, 8 and 16 rows, both head shapes.
Also whether each path's output equals no collection's bit for bit on the GPU. Writes
$OUT/results/kernels-c2q-from-main.json (bench/results/kernels-2026-12-02-h200-c2q-from-main.json,
measured before the row order became every path's and `c2q_from_main` the default at 8 rows; the
"tile" rows pass c2q_from_main=False). Needs the kernel of commit 9b9ac44 (reverted after; see
scripts/device/probe_row_order.py). Run from the repository root with PYTHONPATH=.."""
import datetime
import json
import os

import torch

from kernels.verify_attention import collected_row_slots, collected_rows, verify_attention
from vegas_core.bench.common import device_description
from vegas_core.bench.kernels import _bench, paged_case
from vegas_core.bench.common import copy_bandwidth

dev = torch.device("cuda")
copy = copy_bandwidth(dev)
records = []
for shape, (heads, kvh, dim) in (("smollm2", (9, 3, 64)), ("8b", (32, 8, 128))):
    for rows in (8, 16):
        k, v, tables, ctx = paged_case(64, 8192, kvh, dim, 16, dev)
        q = torch.randn(64 * rows, heads, dim, device=dev, dtype=torch.bfloat16)
        loc = torch.arange(0, 64 * rows + 1, rows, dtype=torch.int32, device=dev)
        crow = collected_rows(loc.cpu(), "c2q")
        slots = collected_row_slots(crow, 64 * rows).to(dev)
        kv_bytes = 2 * 64 * 8192 * kvh * dim * 2
        common = dict(max_ctx=8192, max_q=rows)
        base = verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **common)
        tile = verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, collect=crow, row_slot=slots,
                                c2q_tile=True, c2q_from_main=False, **common)
        main = verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, collect=crow, row_slot=slots,
                                c2q_tile=True, c2q_from_main=True, **common)
        same = dict(tile_out=torch.equal(tile[0], base[0]), main_out=torch.equal(main[0], base[0]),
                    logits=torch.equal(tile[2].logits, main[2].logits),
                    max_out_diff=float((main[0].float() - base[0].float()).abs().max()))
        variants = [("none", {}, "none"), ("c2q", dict(c2q_from_main=False), "tile"),
                    ("c2q", dict(c2q_from_main=True), "main"),
                    ("c2q", dict(c2q_from_main=True, max_registers=0), "main"),
                    ("c2q", dict(c2q_from_main=True, max_registers=128), "main"),
                    ("c2q", dict(c2q_from_main=True, max_registers=255), "main")]
        none_us = None
        for collect, cfg, path in variants:
            mode = "none" if collect == "none" else crow
            try:
                us = _bench(lambda: verify_attention(
                    q, k, v, tables, ctx, loc, dim ** -0.5, collect=mode,
                    row_slot=None if collect == "none" else slots, c2q_tile=collect == "c2q",
                    **common, **cfg))
            except Exception as e:  # noqa: BLE001
                print(shape, rows, path, cfg, "error", str(e)[:150])
                continue
            none_us = us if collect == "none" else none_us
            rec = dict(kernel="verify_attention", shape=shape, batch=64, context=8192, q_rows=rows,
                       collect=collect, path=path, config=cfg, us=us,
                       copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy,
                       collect_overhead=us / none_us - 1, same=same)
            records.append(rec)
            print(f"{shape} rows {rows} {collect:4s} {path:4s} {cfg}: {us:7.1f} us "
                  f"{rec['copy_fraction']:.0%} of copy, +{rec['collect_overhead']:.0%}  {same}")
        del k, v
        torch.cuda.empty_cache()
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
with open(os.environ["OUT"] + "/results/kernels-c2q-from-main.json", "w") as f:
    json.dump(dict(date=datetime.date.today().isoformat(), device=device_description(dev),
                   command="python scripts/device/probe_c2q_from_main.py", copy_TBps=copy,
                   records=records), f, indent=1)
