"""A probe, not the engine's kernel: verification attention with the key tile as the product's M side
("swap AB"), against the engine's `verify_attention` in one process.

Why: at head dim 64 the engine's kernel stays at 70 % of copy with 8 rows (86 % at one row) while
the 8B-like shape reaches 93 %; Nsight Compute has it latency-bound at 12 warps an SM (168
registers). Its tile is rows x keys with 16-32 rows (GROUP query heads x rows), too few for
Hopper's warp-group MMA (64 rows a warp group), so Triton emits mma.sync with both operands staged
through registers. Computing S^T = K Q^T (128 keys as M, the rows as N, which may be 8-256) and
O^T += V^T P^T puts the large side where wgmma wants it, its A operand read from shared memory.
The softmax then reduces over axis 0 (keys). Output is the engine's within bf16 rounding, not the
same bits (the products reduce in another order).

Cases: batch 64, SmolLM2's shape (9 / 3 / 64) at 1 and 8 rows, the 8B-like (32 / 8 / 128) at 8,
context 8K, no collection, every tile masked, split-K with the engine's split count and the fused
merge (the engine's own `_merge_rows`). Each swap launch is timed over a few (tile, warps, stages,
register cap) choices; the record says whether its PTX holds wgmma and its register count.
Writes $OUT/results/kernels-swap-ab-<date>-<device>.json. Run with `--check` under TRITON_INTERPRET=1 on a CPU
for a float32 correctness check against the reference at small shapes (no timing)."""
import os
import sys

import torch
import triton
import triton.language as tl

import kernels.verify_attention as va
from kernels.split_merge import arrival_counters, last_to_arrive


@triton.jit
def _swap_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, logits_ptr, slot_ptr, part_acc_ptr,
                 part_ml_ptr, cnt_ptr, tables_ptr, ctx_ptr, qloc_ptr, scale, num_splits, logits_len,
                 s_qt, s_qh, s_qd, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                 s_ot, s_oh, s_od, s_lt, s_lh, s_gr, s_gh, s_gc, s_tb, s_ps, s_pt, s_ph,
                 BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 COLLECT: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    req = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(qloc_ptr + req)
    q_len = tl.load(qloc_ptr + req + 1) - q_start
    ctx = tl.load(ctx_ptr + req)
    split_len = tl.cdiv(ctx, num_splits * BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(ctx, lo + split_len)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row = offs_m // GROUP
    head = kvh * GROUP + offs_m % GROUP
    m_valid = offs_m < q_len * GROUP
    d_valid = offs_d < HEAD_DIM
    row_pos = ctx - q_len + row
    q_t = tl.load(q_ptr + (q_start + row)[None, :] * s_qt + head[None, :] * s_qh
                  + offs_d[:, None] * s_qd, mask=m_valid[None, :] & d_valid[:, None], other=0.0)
    # COLLECT: the rows with a slot (the first and last of each request, for Collect-2-Query) are
    # stored from the score tile itself, a key column of it per tile.
    slot = tl.load(slot_ptr + q_start + row, mask=m_valid & COLLECT, other=-1)
    keep = (slot >= 0) & m_valid

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_D, BLOCK_M], dtype=tl.float32)
    if INTERPRET:
        start = lo
        while start < hi:
            m_i, l_i, acc_t = _swap_tile(start, q_t, row_pos, m_valid, m_i, l_i, acc_t, k_ptr, v_ptr,
                                         tables_ptr, req, kvh, hi, scale, s_kb, s_kt, s_kh, s_kd,
                                         s_vb, s_vt, s_vh, s_vd, s_tb, logits_ptr, slot, head, keep,
                                         s_gr, s_gh, s_gc, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM,
                                         COLLECT, PRECISION)
            start += BLOCK_N
    else:
        for start in range(lo, hi, BLOCK_N):
            m_i, l_i, acc_t = _swap_tile(start, q_t, row_pos, m_valid, m_i, l_i, acc_t, k_ptr, v_ptr,
                                         tables_ptr, req, kvh, hi, scale, s_kb, s_kt, s_kh, s_kd,
                                         s_vb, s_vt, s_vh, s_vd, s_tb, logits_ptr, slot, head, keep,
                                         s_gr, s_gh, s_gc, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM,
                                         COLLECT, PRECISION)

    if COLLECT:
        if split == num_splits - 1:
            va._store_neg_tail(logits_ptr, slot, head, keep, ctx, logits_len, s_gr, s_gh, s_gc,
                               BLOCK_M, BLOCK_N, INTERPRET)
    o_rows = q_start + row
    part = split * s_ps + o_rows * s_pt + head * s_ph
    tl.store(part_acc_ptr + part[None, :] * HEAD_DIM + offs_d[:, None], acc_t,
             mask=m_valid[None, :] & d_valid[:, None])
    tl.store(part_ml_ptr + 2 * part, m_i, mask=m_valid)
    tl.store(part_ml_ptr + 2 * part + 1, l_i, mask=m_valid)
    if last_to_arrive(cnt_ptr + req * tl.num_programs(1) + kvh, num_splits):
        va._merge_rows(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, o_rows, head, m_valid, offs_d,
                       d_valid, num_splits, s_ps, s_pt, s_ph, s_ot, s_oh, s_od, s_lt, s_lh,
                       HEAD_DIM, BLOCK_M, BLOCK_D, INTERPRET)


@triton.jit
def _swap_tile(start, q_t, row_pos, m_valid, m_i, l_i, acc_t, k_ptr, v_ptr, tables_ptr, req, kvh,
               ctx, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_tb, logits_ptr, slot,
               head, keep, s_gr, s_gh, s_gc, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, COLLECT: tl.constexpr,
               PRECISION: tl.constexpr):
    pos, n_valid, k_tile, v_tile = va._load_kv(
        start, k_ptr, v_ptr, tables_ptr, req, kvh, ctx, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh,
        s_vd, s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, True, 0, False)
    s_t = tl.dot(k_tile, q_t, input_precision=PRECISION) * scale          # [BLOCK_N, BLOCK_M]
    visible = (pos[:, None] <= row_pos[None, :]) & n_valid[:, None] & m_valid[None, :]
    s_t = tl.where(visible, s_t, float("-inf"))
    if COLLECT:
        dst = (logits_ptr + slot.to(tl.int64)[None, :] * s_gr + head[None, :] * s_gh
               + pos[:, None] * s_gc)
        tl.store(dst, s_t.to(tl.bfloat16), mask=keep[None, :] & n_valid[:, None])
    m_new = tl.maximum(m_i, tl.max(s_t, axis=0))
    alpha = tl.exp(m_i - m_new)
    p_t = tl.exp(s_t - m_new[None, :])
    l_i = l_i * alpha + tl.sum(p_t, axis=0)
    acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v_tile), p_t.to(v_tile.dtype),
                                            input_precision=PRECISION)
    return m_new, l_i, acc_t


def swap_attention(q, k_cache, v_cache, tables, ctx, loc, scale, max_q, num_splits,
                   block_n=128, num_warps=4, num_stages=2, maxnreg=0, logits=None, row_slot=None):
    """(out, lse, compiled kernel). With `logits` ([R, heads, W] bf16) and `row_slot` (int32
    [total], as `collected_row_slots` builds it) the rows with a slot are collected."""
    total, heads, dim = q.shape
    batch, kv_heads = ctx.shape[0], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    lse = torch.empty(total, heads, dtype=torch.float32, device=q.device)
    part_acc = torch.empty(num_splits, total, heads, dim, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(num_splits, total, heads, 2, dtype=torch.float32, device=q.device)
    counters = arrival_counters(q.device, batch * kv_heads)
    block_m = max(16, triton.next_power_of_2(max_q * group))
    extra = {"maxnreg": maxnreg} if maxnreg and not va._interpreting() else {}
    collect = logits is not None
    if not collect:
        logits = torch.empty(1, 1, 1, dtype=torch.bfloat16, device=q.device)
        row_slot = torch.empty(1, dtype=torch.int32, device=q.device)
    compiled = _swap_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, out, lse, logits, row_slot, part_acc, part_ml, counters, tables, ctx,
        loc, float(scale), num_splits, logits.shape[2] if collect else 0, *q.stride(),
        *k_cache.stride(), *v_cache.stride(), *out.stride(), *lse.stride(), *logits.stride(),
        tables.stride(0), total * heads, heads, 1, k_cache.shape[1],
        GROUP=group, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(dim)), COLLECT=collect,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", INTERPRET=va._interpreting(),
        num_warps=num_warps, num_stages=num_stages, **extra)
    return out, lse, compiled


def _c2q(loc, total, device):
    rows = va.collected_rows(loc.cpu(), "c2q")
    return rows, va.collected_row_slots(rows, total).to(device)


def check_on_cpu():
    """Float32 against the reference: ragged lengths, 1 / 2 / 8 / 17 rows, GQA 1 / 3 / 8, one and
    three splits, without collection and with Collect-2-Query's rows."""
    torch.manual_seed(0)
    for heads, kvh, dim in ((9, 3, 64), (4, 4, 32), (8, 1, 16)):
        for rows in (1, 2, 8, 17):
            ctxs = [37, 70, 129]
            bs = 16
            per = max(-(-c // bs) for c in ctxs)
            nblocks = per * len(ctxs) + 1
            k = torch.randn(nblocks, bs, kvh, dim)
            v = torch.randn(nblocks, bs, kvh, dim)
            tables = torch.randperm(nblocks - 1)[: per * len(ctxs)].view(len(ctxs), per).int()
            ctx = torch.tensor(ctxs, dtype=torch.int32)
            total = rows * len(ctxs)
            loc = torch.arange(0, total + 1, rows, dtype=torch.int32)
            q = torch.randn(total, heads, dim)
            ref, ref_lse, ref_logits = va.verify_attention_reference(q, k, v, tables, ctx, loc, dim ** -0.5,
                                                                     collect="c2q")
            crow, slots = _c2q(loc, total, q.device)
            for splits in (1, 3):
                for collect in (False, True):
                    logits = torch.empty(len(crow), heads, max(ctxs) + 5, dtype=torch.bfloat16) if collect else None
                    out, lse, _ = swap_attention(q, k, v, tables, ctx, loc, dim ** -0.5, rows, splits,
                                                 block_n=32, logits=logits, row_slot=slots if collect else None)
                    err = (out - ref).abs().max().item()
                    lerr = (lse - ref_lse).abs().max().item()
                    assert err < 1e-4 and lerr < 1e-4, (heads, kvh, dim, rows, splits, err, lerr)
                    if collect:
                        want = ref_logits.logits.float()
                        got = logits[:, :, :max(ctxs)].float()
                        assert torch.equal(torch.isinf(got), torch.isinf(want))
                        fin = torch.isfinite(want)
                        assert (got[fin] - want[fin]).abs().max().item() < 0.05
                        assert bool(torch.isneginf(logits[:, :, max(ctxs):].float()).all())
                    print(f"ok heads {heads}/{kvh} d {dim} rows {rows} splits {splits} collect {collect}: "
                          f"{err:.1e} {lerr:.1e}")


def probe():
    from vegas_core.bench import common
    from vegas_core.bench.common import copy_bandwidth
    from vegas_core.bench.kernels import SHAPES, _bench, paged_case

    dev = torch.device("cuda")
    copy = copy_bandwidth(dev)
    configs = [(128, 4, 2, 0), (128, 4, 3, 0), (128, 4, 2, 168), (128, 8, 2, 0), (64, 4, 2, 0)]
    cases = [("smollm2", 8, ("none", "c2q")), ("smollm2", 9, ("none", "c2q")), ("smollm2", 1, ("none",)),
             ("8b", 8, ("none", "c2q"))]
    records = []
    for shape, rows, collects in cases:
        heads, kvh, dim, _ = SHAPES[shape]
        batch, ctx_len = 64, 8192
        k, v, tables, ctx = paged_case(batch, ctx_len, kvh, dim, 16, dev)
        total = batch * rows
        q = torch.randn(total, heads, dim, device=dev, dtype=torch.bfloat16)
        loc = torch.arange(0, total + 1, rows, dtype=torch.int32, device=dev)
        crow, slots = _c2q(loc, total, dev)
        kv_bytes = 2 * batch * ctx_len * kvh * dim * 2
        splits = va.default_num_splits(batch, kvh, ctx_len)
        scale = dim ** -0.5
        for collect in collects:
            c2q = collect == "c2q"
            eng_kw = dict(max_ctx=ctx_len, max_q=rows, num_splits=splits)
            if c2q:
                eng_kw.update(collect=crow, row_slot=slots, c2q_tile=True)
            base_out, base_lse, base_logits = va.verify_attention(q, k, v, tables, ctx, loc, scale, **eng_kw)
            base_us = _bench(lambda: va.verify_attention(q, k, v, tables, ctx, loc, scale, **eng_kw))
            fields = dict(shape=shape, batch=batch, context=ctx_len, q_rows=rows, heads=heads, kv_heads=kvh,
                          head_dim=dim, collect=collect, num_splits=splits, kv_bytes=kv_bytes, copy_TBps=copy)
            records.append(dict(kernel="verify_attention (engine)", us=base_us,
                                copy_fraction=kv_bytes / (base_us * 1e-6) / 1e12 / copy, **fields))
            print(f"{shape} rows {rows} {collect}: engine {base_us:7.1f} us {records[-1]['copy_fraction']:.0%} of copy")
            logits = torch.empty(len(crow), heads, ctx_len, dtype=torch.bfloat16, device=dev) if c2q else None
            swap_kw = dict(logits=logits, row_slot=slots if c2q else None)
            for block_n, warps, stages, nreg in configs:
                launch = dict(block_n=block_n, num_warps=warps, num_stages=stages, maxnreg=nreg)
                try:
                    out, lse, compiled = swap_attention(q, k, v, tables, ctx, loc, scale, rows, splits,
                                                        **launch, **swap_kw)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a launch that does not compile is a result too
                    records.append(dict(kernel="swap_ab", **launch, error=f"{type(e).__name__}: {e}"[:300], **fields))
                    print(f"  swap {block_n}/{warps}/{stages}/{nreg}: failed {records[-1]['error']}")
                    continue
                us = _bench(lambda: swap_attention(q, k, v, tables, ctx, loc, scale, rows, splits,
                                                   **launch, **swap_kw))
                ptx = compiled.asm.get("ptx", "")
                rec = dict(kernel="swap_ab", **launch, us=us, copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy,
                           speedup_vs_engine=base_us / us,
                           max_abs_diff_vs_engine=(out.float() - base_out.float()).abs().max().item(),
                           max_lse_diff_vs_engine=(lse - base_lse).abs().max().item(),
                           wgmma="wgmma" in ptx, mma_sync="mma.sync" in ptx,
                           registers=getattr(compiled, "n_regs", None), spills=getattr(compiled, "n_spills", None),
                           **fields)
                if c2q:
                    want = base_logits.logits.float()
                    rec["logits_same_inf"] = bool(torch.equal(torch.isinf(logits.float()), torch.isinf(want)))
                    fin = torch.isfinite(want)
                    rec["max_logit_diff_vs_engine"] = (logits.float()[fin] - want[fin]).abs().max().item()
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
    check_on_cpu() if "--check" in sys.argv else probe()
