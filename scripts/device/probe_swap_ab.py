"""A/B in one process: verify_attention with the key tile as the product's M side
(`verify_attention(swap_ab=True)`, `_verify_swap_kernel`) against the engine's launch.

Why (bench/NOTES.md version 50): at head dim 64 the engine's kernel stays at 70 % of copy with 8
rows (86 % at one row) while the 8B-like shape reaches 93 %; Nsight Compute has it latency-bound at
12 warps an SM (168 registers). Its tile is rows x keys with 16-32 rows (query heads x rows), too
few for Hopper's warp-group MMA (64 rows a warp group), so Triton emits mma.sync with both operands
staged through registers. S^T = K Q^T (128 keys as M) and O^T += V^T P^T put the large side where
wgmma wants it. Collection stores the rows with a slot from the swapped score tile (no second dot).

Cases: batch 64 x 8K; SmolLM2's shape (9 / 3 / 64) at 8 and 9 rows (vegas's gamma 8) without
collection and with Collect-2-Query, at one row (a plain decode step) without; the 8B-like shape
(32 / 8 / 128) at 8 rows both ways. Each swap launch over a few (tile, warps, stages, register cap)
choices, all with the fused merge; per record whether the PTX holds wgmma, the registers, and the
largest differences from the engine's output, log-sum-exp and collected logits (another reduction
order: not the same bits). Writes $OUT/results/kernels-swap-ab-<date>-<device>.json."""
import os

import torch
import triton

import kernels.verify_attention as va
from vegas_core.bench import common
from vegas_core.bench.common import copy_bandwidth
from vegas_core.bench.kernels import SHAPES, _bench, paged_case

CONFIGS = [(128, 4, 2, 0), (128, 4, 3, 0), (128, 4, 2, 168), (128, 8, 2, 0), (64, 4, 2, 0)]
CASES = [("smollm2", 8, ("none", "c2q")), ("smollm2", 9, ("none", "c2q")), ("smollm2", 1, ("none",)),
         ("8b", 8, ("none", "c2q"))]


def _outputs(q, heads, ctx_len, crow, c2q):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], heads, dtype=torch.float32, device=q.device)
    logits = torch.empty(len(crow), heads, ctx_len, dtype=torch.bfloat16, device=q.device) if c2q else None
    return out, lse, logits


def main():
    dev = torch.device("cuda")
    copy = copy_bandwidth(dev)
    records = []
    for shape, rows, collects in CASES:
        heads, kvh, dim, _ = SHAPES[shape]
        batch, ctx_len = 64, 8192
        k, v, tables, ctx = paged_case(batch, ctx_len, kvh, dim, 16, dev)
        total = batch * rows
        q = torch.randn(total, heads, dim, device=dev, dtype=torch.bfloat16)
        loc = torch.arange(0, total + 1, rows, dtype=torch.int32, device=dev)
        crow = va.collected_rows(loc.cpu(), "c2q")
        slots = va.collected_row_slots(crow, total).to(dev)
        kv_bytes = 2 * batch * ctx_len * kvh * dim * 2
        splits = va.default_num_splits(batch, kvh, ctx_len)
        scale = dim ** -0.5
        for collect in collects:
            c2q = collect == "c2q"
            base = _outputs(q, heads, ctx_len, crow, c2q)
            kw = dict(max_q=rows, num_splits=splits, logits=base[2], row_slot=slots if c2q else None,
                      c2q_tile=c2q, logits_len=ctx_len, swap_ab=False)

            def engine(outs=base, kw=kw):
                return va.verify_attention_into(q, k, v, tables, ctx, loc, scale, outs[0], outs[1], **kw)

            engine()
            base_us = _bench(engine)
            fields = dict(shape=shape, batch=batch, context=ctx_len, q_rows=rows, heads=heads, kv_heads=kvh,
                          head_dim=dim, collect=collect, num_splits=splits, kv_bytes=kv_bytes, copy_TBps=copy)
            records.append(dict(kernel="verify_attention", variant="engine", us=base_us,
                                copy_fraction=kv_bytes / (base_us * 1e-6) / 1e12 / copy, **fields))
            print(f"{shape} rows {rows} {collect}: engine {base_us:7.1f} us {records[-1]['copy_fraction']:.0%} of copy")
            for block_n, warps, stages, nreg in CONFIGS:
                outs = _outputs(q, heads, ctx_len, crow, c2q)
                launch = dict(block_n=block_n, num_warps=warps, num_stages=stages, max_registers=nreg)
                skw = dict(kw, logits=outs[2], swap_ab=True, fused_merge=True, **launch)

                def swapped(outs=outs, skw=skw):
                    return va.verify_attention_into(q, k, v, tables, ctx, loc, scale, outs[0], outs[1], **skw)

                try:
                    compiled = swapped()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a launch that does not compile is a result too
                    records.append(dict(kernel="verify_attention", variant="swap_ab", **launch,
                                        error=f"{type(e).__name__}: {e}"[:300], **fields))
                    print(f"  swap {block_n}/{warps}/{stages}/{nreg}: failed {records[-1]['error']}")
                    continue
                us = _bench(swapped)
                ptx = compiled.asm.get("ptx", "") if compiled is not None else ""
                rec = dict(kernel="verify_attention", variant="swap_ab", **launch, us=us,
                           copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy, speedup_vs_engine=base_us / us,
                           max_abs_diff_vs_engine=(outs[0].float() - base[0].float()).abs().max().item(),
                           max_lse_diff_vs_engine=(outs[1] - base[1]).abs().max().item(),
                           wgmma="wgmma" in ptx, mma_sync="mma.sync" in ptx,
                           registers=getattr(compiled, "n_regs", None), spills=getattr(compiled, "n_spills", None),
                           **fields)
                if c2q:
                    want, got = base[2].float(), outs[2].float()
                    rec["logits_same_inf"] = bool(torch.equal(torch.isinf(got), torch.isinf(want)))
                    fin = torch.isfinite(want)
                    rec["max_logit_diff_vs_engine"] = (got[fin] - want[fin]).abs().max().item()
                records.append(rec)
                print(f"  swap {block_n}/{warps}/{stages}/{nreg}: {us:7.1f} us {rec['copy_fraction']:.0%} "
                      f"x{rec['speedup_vs_engine']:.2f} diff {rec['max_abs_diff_vs_engine']:.1e} "
                      f"wgmma={rec['wgmma']} regs={rec['registers']} spills={rec['spills']}")
        del k, v
        torch.cuda.empty_cache()
    path = common.write_results("kernels-swap-ab", os.environ["OUT"] + "/results", dev, [], records,
                                command="python scripts/device/probe_swap_ab.py", triton=triton.__version__,
                                copy_TBps=copy)
    print("wrote", path)


if __name__ == "__main__":
    main()
