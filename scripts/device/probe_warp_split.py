"""A/B in one process: verify_attention with each key tile cut into one chunk a warp, each with its
own softmax state (`verify_attention(warp_split=True)`, `_attend_tile_warps`), against the
engine's 2-D launch.

Why (bench/NOTES.md version 57): at head dim 64 the tile has 16-32 rows (query heads x rows) and
128 keys; Triton puts the 4 warps of a chained product with fewer rows than keys along the keys
(warpsPerCTA [1, 4]), so every tile reduces its max and sum across warps and passes P through
shared memory: 10 barriers a tile in the main loop of the SASS (compiled offline for sm_90,
`python -m vegas_core.bench sass --warp-split`), against 2 a 64-key tile with the warp split.
Nsight Compute had the 2-D kernel latency-bound (run 48).

Cases: batch 64 x 8K, SmolLM2's shape (9 / 3 / 64) at 1 row (a plain decode step), 8 rows, and 10
(vegas's tuned gamma 9) without collection, with Collect-2-Query (its first/last tile, and at 10
rows also its rows stored from the main tile: c2q-main) and with all rows stored. Each
warp-split launch over (tile, warps, stages, register cap, block-table entries a tile ahead)
choices and twice the splits; per
record the registers and spills of the compiled kernel and the largest differences from the
engine's output, log-sum-exp and collected logits (another summation order: not the same bits).
Whether collecting leaves the warp-split output's bits is checked at `launch_config`'s launch.
Then the draft's sparse attention with 4, 2 and 1 warps a program (`sparse_warps`).
Writes $OUT/results/kernels-warp-split-<date>-<device>.json."""
import os

import torch
import triton

import kernels.verify_attention as va
from vegas_core.bench import common
from vegas_core.bench.common import copy_bandwidth
from vegas_core.bench.kernels import SHAPES, _bench, paged_case

# (block_n, num_warps, num_stages, max_registers or None for launch_config's, splits factor,
# page_ahead): the first is launch_config's launch
CONFIGS = [(64, 4, 2, None, 1, 0), (64, 4, 2, 0, 1, 0), (64, 4, 2, 168, 1, 0), (64, 4, 2, 200, 1, 0),
           (64, 4, 3, None, 1, 0), (64, 4, 2, None, 2, 0), (64, 4, 2, None, 1, 1), (64, 4, 3, None, 1, 1),
           (128, 8, 2, 0, 1, 0), (128, 4, 2, 0, 1, 0), (32, 2, 2, 0, 1, 0)]
# c2q-main: Collect-2-Query's rows stored through the main tile's row slots (c2q_tile=False; the
# split's C2Q path takes them from the score tile by row block instead: 226 against 237
# registers, offline)
CASES = [(1, ("none",)), (8, ("none", "c2q", "all")), (10, ("none", "c2q", "c2q-main", "all"))]
BATCH, CONTEXT = 64, 8192


def _buffers(q, heads, ctx_len, crow, collect):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], heads, dtype=torch.float32, device=q.device)
    logits = (torch.empty(len(crow), heads, ctx_len, dtype=torch.bfloat16, device=q.device)
              if collect != "none" else None)
    return out, lse, logits


def main(dev=torch.device("cuda")):
    copy = copy_bandwidth(dev)
    records = []
    heads, kvh, dim, _ = SHAPES["smollm2"]
    batch, ctx_len = BATCH, CONTEXT
    k, v, tables, ctx = paged_case(batch, ctx_len, kvh, dim, 16, dev)
    kv_bytes = 2 * batch * ctx_len * kvh * dim * 2
    splits = va.default_num_splits(batch, kvh, ctx_len)
    scale = dim ** -0.5
    for rows, collects in CASES:
        total = batch * rows
        q = torch.randn(total, heads, dim, device=dev, dtype=torch.bfloat16)
        loc = torch.arange(0, total + 1, rows, dtype=torch.int32, device=dev)
        split_outputs = {}
        for collect in collects:
            crow = va.collected_rows(loc.cpu(), "c2q" if collect == "c2q-main" else collect)
            slots = va.collected_row_slots(crow, total).to(dev) if collect != "none" else None
            fields = dict(shape="smollm2", batch=batch, context=ctx_len, q_rows=rows, heads=heads,
                          kv_heads=kvh, head_dim=dim, collect=collect, kv_bytes=kv_bytes, copy_TBps=copy)

            def launch(bufs, n_splits=splits, warp_split=False, **kw):
                va.WARP_SPLIT = warp_split      # launch_config's choices for that kernel
                return va.verify_attention_into(
                    q, k, v, tables, ctx, loc, scale, bufs[0], bufs[1], max_q=rows, num_splits=n_splits,
                    logits=bufs[2], row_slot=slots, c2q_tile=collect == "c2q", logits_len=ctx_len, **kw)

            base = _buffers(q, heads, ctx_len, crow, collect)
            compiled = launch(base)
            base_us = _bench(lambda: launch(base))
            records.append(dict(kernel="verify_attention", variant="engine", num_splits=splits, us=base_us,
                                copy_fraction=kv_bytes / (base_us * 1e-6) / 1e12 / copy,
                                registers=getattr(compiled, "n_regs", None),
                                spills=getattr(compiled, "n_spills", None), **fields))
            print(f"rows {rows:2d} {collect:4s}: engine {base_us:7.1f} us {records[-1]['copy_fraction']:.0%} of copy "
                  f"regs={records[-1]['registers']}")
            for config in CONFIGS:
                block_n, warps, stages, nreg, factor, ahead = config
                bufs = _buffers(q, heads, ctx_len, crow, collect)
                cfg = dict(block_n=block_n, num_warps=warps, num_stages=stages, warp_split=True,
                           page_ahead=ahead)
                if nreg is not None:
                    cfg["max_registers"] = nreg
                n_splits = splits * factor
                default = config == CONFIGS[0]
                label = dict(block_n=block_n, num_warps=warps, num_stages=stages, max_registers=nreg,
                             num_splits=n_splits, page_ahead=ahead, launch_config=default)
                try:
                    compiled = launch(bufs, n_splits, **cfg)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a launch that does not compile is a result too
                    records.append(dict(kernel="verify_attention", variant="warp_split", **label,
                                        error=f"{type(e).__name__}: {e}"[:300], **fields))
                    print(f"  {label}: failed {records[-1]['error']}")
                    continue
                us = _bench(lambda: launch(bufs, n_splits, **cfg))
                rec = dict(kernel="verify_attention", variant="warp_split", **label, us=us,
                           copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy, speedup_vs_engine=base_us / us,
                           registers=getattr(compiled, "n_regs", None),
                           spills=getattr(compiled, "n_spills", None),
                           max_abs_diff_vs_engine=(bufs[0].float() - base[0].float()).abs().max().item(),
                           max_lse_diff_vs_engine=(bufs[1] - base[1]).abs().max().item(), **fields)
                if collect != "none":
                    want, got = base[2].float(), bufs[2].float()
                    rec["logits_same_inf"] = bool(torch.equal(torch.isinf(got), torch.isinf(want)))
                    fin = torch.isfinite(want)
                    rec["max_logit_diff_vs_engine"] = (got[fin] - want[fin]).abs().max().item()
                if default:
                    split_outputs[collect] = (bufs[0].clone(), bufs[1].clone())
                    if collect != "none" and "none" in split_outputs:
                        rec["same_bits_as_none"] = bool(torch.equal(bufs[0], split_outputs["none"][0])
                                                        and torch.equal(bufs[1], split_outputs["none"][1]))
                records.append(rec)
                print(f"  ws {block_n}/{warps}/{stages}/{nreg} x{factor} ahead {ahead}: {us:7.1f} us {rec['copy_fraction']:.0%} "
                      f"x{rec['speedup_vs_engine']:.2f} regs={rec['registers']} spills={rec['spills']} "
                      f"diff {rec['max_abs_diff_vs_engine']:.1e}"
                      + (f" same_bits_as_none={rec['same_bits_as_none']}" if "same_bits_as_none" in rec else ""))
    summary(records)
    records += sparse_warps(dev, copy)
    path = common.write_results("kernels-warp-split", os.environ["OUT"] + "/results", dev, [], records,
                                command="python scripts/device/probe_warp_split.py", triton=triton.__version__,
                                copy_TBps=copy)
    print("wrote", path)


def summary(records):
    """Per case the engine, launch_config's split launch and the fastest split launch: what to
    put in `_warp_split_launch` (one key tile and chunking for every path of a tile size)."""
    print("\nsummary (us; x = engine / split):")
    cases = sorted({(r["q_rows"], r["collect"]) for r in records})
    for rows, collect in cases:
        group = [r for r in records if (r["q_rows"], r["collect"]) == (rows, collect) and "us" in r]
        engine = next(r for r in group if r["variant"] == "engine")
        split = [r for r in group if r["variant"] == "warp_split"]
        if not split:
            continue
        default = next((r for r in split if r["launch_config"]), None)
        best = min(split, key=lambda r: r["us"])
        line = f"  rows {rows:2d} {collect:8s} engine {engine['us']:7.1f}"
        if default is not None:
            line += f" | launch_config {default['us']:7.1f} x{engine['us'] / default['us']:.2f}"
        line += (f" | best {best['us']:7.1f} x{engine['us'] / best['us']:.2f} ({best['block_n']}/"
                 f"{best['num_warps']}/{best['num_stages']}/{best['max_registers']}, "
                 f"{best['num_splits']} splits, ahead {best['page_ahead']})")
        print(line)


def sparse_warps(dev, copy):
    """The draft's sparse attention with fewer warps a program. Its packed program (SmolLM2's
    9 heads as 16 rows, 32-entry tiles, 4 warps) also has its warps along the entries: 13 barriers
    a tile in the offline compile, 2 with one warp (which then issues the whole tile: 860
    instructions against 367 a warp). Batch 64 x 8K at vegas's tuned sparsity 0.05 with an 8-entry
    tail, one selection shared by the KV heads (packed), the automatic split and the CUDA-graph
    path's 12."""
    from vegas_core.bench.kernels import sparse_record
    out = []
    for block_n in (32, 64):
        for warps in (4, 2, 1):
            for splits in (None, 12):
                try:
                    rec = sparse_record("smollm2", BATCH, CONTEXT, 0.05, 8, 16, dev, copy, block_n=block_n,
                                        num_splits=splits, granularity="layer", num_warps=warps)
                except Exception as e:  # noqa: BLE001 - a launch that does not compile is a result too
                    out.append(dict(kernel="sparse_attention", sweep="sparse_warps", block_n=block_n,
                                    num_warps=warps, num_splits=splits, error=f"{type(e).__name__}: {e}"[:300]))
                    print(f"sparse block_n {block_n} warps {warps} splits {splits}: failed {out[-1]['error']}")
                    continue
                rec["sweep"] = "sparse_warps"
                out.append(rec)
                print(f"sparse block_n {block_n} warps {warps} splits {splits}: {rec['us']:6.1f} us "
                      f"{rec['copy_fraction']:.0%} of copy")
    return out


if __name__ == "__main__":
    main()
