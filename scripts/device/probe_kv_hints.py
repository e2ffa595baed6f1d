"""A/B in one process: verify_attention's K/V tile loads with Triton's cache and eviction hints
(`kernels.verify_attention.KV_LOAD_HINT`): none, evict_first (the K/V a step reads is streamed
once: leave L2 to what is reused), .cg (skip L1), both, evict_last. Batch 64, SmolLM2's shape at
one row (a plain decode step, 6K and 8K) and 8 rows (no collection and C2Q, 8K), the 8B-like
shape at one and 8 rows (8K). The same output bits with every hint is checked (hints do not
change arithmetic). Writes $OUT/results/kernels-kv-hints.json.

Measured (run 48, bench/results/kernels-2026-12-04-h200-run48-kv-hints.json): no hint moved any
case by more than 0.3 %, so the hints were taken out again (bench/NOTES.md version 48). The
kernel with them is commit f169a0f; to run this again, restore it first:
    git show f169a0f:kernels/verify_attention.py > kernels/verify_attention.py"""
import datetime
import json
import os

import torch

import kernels.verify_attention as va
from kernels.verify_attention import collected_row_slots, collected_rows
from vegas_core.bench import common
from vegas_core.bench.kernels import SHAPES, _bench, paged_case
from vegas_core.bench.common import copy_bandwidth

HINTS = [("", ""), ("", "evict_first"), (".cg", ""), (".cg", "evict_first"), ("", "evict_last")]
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
        for hint in HINTS:
            va.KV_LOAD_HINT = hint
            out = va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw)[0]
            base = out if base is None else base
            same = bool(torch.equal(out, base))
            us = _bench(lambda: va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw))
            rec = dict(kernel="verify_attention", hint=list(hint), shape=shape, batch=batch,
                       context=ctx_len, q_rows=rows, heads=heads, kv_heads=kvh, head_dim=dim,
                       collect=collect, us=us, kv_bytes=kv_bytes,
                       read_TBps=kv_bytes / (us * 1e-6) / 1e12, copy_TBps=copy,
                       copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy, same_bits_as_none=same)
            records.append(rec)
            print(f"{shape} rows {rows} ctx {ctx_len} {collect:4s} hint {hint!s:22s}: {us:7.1f} us "
                  f"{rec['copy_fraction']:.0%} of copy same={same}")
    va.KV_LOAD_HINT = ("", "")
    del k, v
    torch.cuda.empty_cache()
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
path = os.environ["OUT"] + "/results/kernels-kv-hints.json"
with open(path, "w") as f:
    json.dump(dict(date=datetime.date.today().isoformat(), device=common.device_description(dev),
                   command="python scripts/device/probe_kv_hints.py", torch=torch.__version__,
                   copy_TBps=copy, records=records), f, indent=1)
print("wrote", path)
