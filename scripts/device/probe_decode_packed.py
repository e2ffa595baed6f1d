"""A/B in one process: the one-row call (a plain decode step) as one program per request for all
its KV heads (`kernels.verify_attention.PACK_DECODE`, `_attend_tile_packed`) against a program per
KV head, at batch 64 and SmolLM2's shape (9 / 3 / 64), contexts 6K and 8K; key tiles, warps,
splits; cuDNN SDPA over the same dense work and the copy rate beside them. Checks the packed
output against the per-KV-head one (max difference) and collecting against not (same bits).
Writes $OUT/results/kernels-decode-packed.json.

Measured (run 47, bench/results/kernels-2026-12-04-h200-run47-decode-packed.json): no faster than a
program per KV head at its best tile (95.9 against 94.9 us at 6K, 120.3 against 121.5 at 8K), so
the packed program was taken out again (bench/NOTES.md version 47). It lives in commit b6ca0de; to
run this again, restore it first:
    git show b6ca0de:kernels/verify_attention.py > kernels/verify_attention.py"""
import datetime
import json
import os

import torch

import kernels.verify_attention as va
from vegas_core.bench import common
from vegas_core.bench.kernels import _bench, _sdpa, paged_case
from vegas_core.bench.common import copy_bandwidth
from kernels.verify_attention import collected_row_slots, collected_rows

dev = torch.device("cuda")
copy = copy_bandwidth(dev)
records = []
heads, kvh, dim, batch = 9, 3, 64, 64
for ctx_len in (6144, 8192):
    k, v, tables, ctx = paged_case(batch, ctx_len, kvh, dim, 16, dev)
    q = torch.randn(batch, heads, dim, device=dev, dtype=torch.bfloat16)
    loc = torch.arange(0, batch + 1, dtype=torch.int32, device=dev)
    kv_bytes = 2 * batch * ctx_len * kvh * dim * 2
    base_splits = va.default_num_splits(batch, kvh, ctx_len)
    kw = dict(max_ctx=ctx_len, max_q=1)
    va.PACK_DECODE = False
    single = va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw)[0]
    va.PACK_DECODE = True
    packed = va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw)[0]
    rows = collected_rows(loc.cpu(), "c2q")
    collected = va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, collect="c2q",
                                    row_slot=collected_row_slots(rows, batch).to(dev), **kw)[0]
    diff = float((packed.float() - single.float()).abs().max())
    same_collect = bool(torch.equal(collected, packed))
    print(f"ctx {ctx_len}: packed vs per-KV-head max |diff| {diff:.3g}; c2q same bits as none: {same_collect}")
    sdpa_us, backend = _sdpa(1, k, v, tables, batch, ctx_len, heads, kvh, dim)
    variants = [("per-kv-head", False, {}), ("packed", True, {})]
    for mult in (1, 2):        # splits: x kv_heads (the engine's) and x 2 kv_heads
        for bn, warps in ((128, 4), (64, 4), (64, 2), (128, 8)):
            variants.append((f"packed bn{bn} w{warps} splits x{mult}", True,
                             dict(block_n=bn, num_warps=warps, num_splits=base_splits * mult)))
    for name, pack, cfg in variants:
        va.PACK_DECODE = pack
        try:
            us = _bench(lambda: va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw, **cfg))
        except Exception as e:  # noqa: BLE001
            print(ctx_len, name, "error", str(e)[:120]); continue
        rec = dict(kernel="verify_attention", variant=name, packed=pack, config=cfg, shape="smollm2",
                   batch=batch, context=ctx_len, q_rows=1, heads=heads, kv_heads=kvh, head_dim=dim,
                   collect="none", us=us, kv_bytes=kv_bytes, read_TBps=kv_bytes / (us * 1e-6) / 1e12,
                   copy_TBps=copy, copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy,
                   sdpa_us=sdpa_us, sdpa_backend=backend, max_diff_vs_per_kv_head=diff,
                   c2q_same_bits_as_none=same_collect)
        records.append(rec)
        print(f"ctx {ctx_len} {name:32s}: {us:7.1f} us {rec['copy_fraction']:.0%} of copy "
              f"(SDPA {backend} {sdpa_us:.1f} us)")
    va.PACK_DECODE = True
    del k, v
    torch.cuda.empty_cache()
os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
path = os.environ["OUT"] + "/results/kernels-decode-packed.json"
with open(path, "w") as f:
    json.dump(dict(date=datetime.date.today().isoformat(), device=common.device_description(dev),
                   command="python scripts/device/probe_decode_packed.py", torch=torch.__version__,
                   copy_TBps=copy, records=records), f, indent=1)
print("wrote", path)
