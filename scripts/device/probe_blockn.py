"""verify_attention at SmolLM2's shape (batch 64; 1 row at 6K and 8K, 8 rows at 8K, the 8-row
case also with Collect-2-Query): 128- and 256-key tiles x pipeline stages 2-4 x register caps
(168, 255, none), and 3 or 12 splits at 256-key tiles, beside the engine's launch (config {}).
Writes $OUT/results/kernels-blockn.json (bench/results/kernels-2026-12-02-h200-blockn.json)."""
import datetime
import json
import os

import torch

from vegas_core.bench.common import device_description
from vegas_core.bench.kernels import _time_verify_configs
from vegas_core.bench.common import copy_bandwidth

dev = torch.device("cuda")
copy = copy_bandwidth(dev)
cfgs = [{}]
for bn in (128, 256):
    for st in (2, 3, 4):
        for reg in (168, 255, 0):
            if not (bn == 128 and reg == 168 and st == 2):      # that one is the engine's launch
                cfgs.append(dict(block_n=bn, num_stages=st, max_registers=reg))
cfgs += [dict(block_n=256, num_splits=sp) for sp in (3, 12)]
records = []
for rows, ctx in ((1, 6144), (1, 8192), (8, 8192)):
    collects = ("none",) if rows == 1 else ("none", "c2q")
    recs = _time_verify_configs("smollm2", 64, ctx, rows, 16, dev, copy, "blockn", collects, cfgs)
    for r in recs:
        print(rows, ctx, r["collect"], r.get("config"), round(r.get("us", -1), 1),
              round(r.get("copy_fraction", 0), 3), r.get("error", ""))
    records += recs
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
with open(os.environ["OUT"] + "/results/kernels-blockn.json", "w") as f:
    json.dump(dict(date=datetime.date.today().isoformat(), device=device_description(dev),
                   command="python scripts/device/probe_blockn.py", copy_TBps=copy, records=records),
              f, indent=1)
