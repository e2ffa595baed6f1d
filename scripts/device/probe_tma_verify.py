"""Probe: verification attention whose K/V tiles come in by TMA (Triton tensor descriptors) from
pages at least as long as the key tile, against the engine's pointer-gather kernel.

Why: at head dim 64 the engine's kernel (`kernels/verify_attention.py`) reaches 70 % of copy
bandwidth at 8 rows and 86 % at one row on the H200, latency-bound at 12 warps an SM with about
two fifths of its loop spent on address, page and mask arithmetic (bench/NOTES.md, versions 48
and 57-59). A TMA load takes a whole [BLOCK_N, head_dim] box with one instruction from one thread
and needs no per-element pointers, but only from memory that is one strided box: with the pool's
16-token pages a 128-key tile spans 8 pages. So pages of 64 or 128 tokens (PAGE >= BLOCK_N) are the
price, and this probe measures what that price buys before the pool is re-laid.

Cases (batch 64, graph replays, best of each sweep reported beside the engine's launch):
- the engine's kernel on its 16-token pages (what `bench e2e` runs), and on 128-token pages (the
  same data re-paged: the change of page alone);
- the TMA kernel on 128-token pages (and 64 where BLOCK_N is 64) over tiles, warps, stages and
  splits.
SmolLM2's shape (9 / 3 / 64) and the 8B-like (32 / 8 / 128) at one row and 8 rows, 8K. Every TMA
output is checked against the engine's on the same data (max abs difference; bf16 rounding
differs with the summation order). `--check` runs the small-shape comparison against the PyTorch
reference only (works under TRITON_INTERPRET=1 on a CPU).
Writes $OUT/results/kernels-tma-verify.json."""
import argparse
import datetime
import json
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import kernels.verify_attention as va
from kernels.split_merge import arrival_counters, last_to_arrive


@triton.jit
def _tile(start, q_tile, row_pos, m_valid, m_i, l_i, acc, k_desc, v_desc, tables_ptr, req, col,
          scale, s_tb, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    page = tl.load(tables_ptr + req * s_tb + start // PAGE)
    r0 = page * PAGE + start % PAGE
    k = k_desc.load([r0, col])
    s = tl.dot(q_tile, tl.trans(k)) * scale
    if MASKED:
        pos = start + tl.arange(0, BLOCK_N)
        s = tl.where((pos[None, :] <= row_pos[:, None]) & m_valid[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = v_desc.load([r0, col])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _tma_verify_kernel(q_ptr, k_desc, v_desc, out_ptr, lse_ptr, part_acc_ptr, part_ml_ptr, cnt_ptr,
                       tables_ptr, ctx_ptr, qloc_ptr, scale, num_splits,
                       s_qt, s_qh, s_ot, s_oh, s_od, s_lt, s_lh, s_tb, s_ps, s_pt, s_ph,
                       PAGE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                       FUSED_MERGE: tl.constexpr, INTERPRET: tl.constexpr):
    """The engine kernel's program (request, KV head, split) and online softmax, masks only on the
    tiles some row cannot see whole; K/V tiles by descriptor at (page row, KV head column)."""
    req, kvh, split, q_start, q_len, ctx, lo, hi = va._program_keys(qloc_ptr, ctx_ptr, num_splits,
                                                                    BLOCK_N, SPLIT)
    offs_m, offs_d, row, head, m_valid, d_valid, row_pos = va._tile_rows(
        kvh, q_len, ctx, GROUP, HEAD_DIM, BLOCK_M, HEAD_DIM)
    q_tile = tl.load(q_ptr + (q_start + row)[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :],
                     mask=m_valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    full_end = tl.minimum(hi, ctx - q_len + 1)
    mid = lo + tl.maximum(full_end - lo, 0) // BLOCK_N * BLOCK_N
    col = kvh * HEAD_DIM
    if INTERPRET:
        start = lo
        while start < mid:
            m_i, l_i, acc = _tile(start, q_tile, row_pos, m_valid, m_i, l_i, acc, k_desc, v_desc,
                                  tables_ptr, req, col, scale, s_tb, PAGE, BLOCK_N, False)
            start += BLOCK_N
        while start < hi:
            m_i, l_i, acc = _tile(start, q_tile, row_pos, m_valid, m_i, l_i, acc, k_desc, v_desc,
                                  tables_ptr, req, col, scale, s_tb, PAGE, BLOCK_N, True)
            start += BLOCK_N
    else:
        for start in range(lo, mid, BLOCK_N):
            m_i, l_i, acc = _tile(start, q_tile, row_pos, m_valid, m_i, l_i, acc, k_desc, v_desc,
                                  tables_ptr, req, col, scale, s_tb, PAGE, BLOCK_N, False)
        for start in range(mid, hi, BLOCK_N):
            m_i, l_i, acc = _tile(start, q_tile, row_pos, m_valid, m_i, l_i, acc, k_desc, v_desc,
                                  tables_ptr, req, col, scale, s_tb, PAGE, BLOCK_N, True)
    o_rows = q_start + row
    if SPLIT:
        part = split * s_ps + o_rows * s_pt + head * s_ph
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=m_valid[:, None])
        tl.store(part_ml_ptr + 2 * part, m_i, mask=m_valid)
        tl.store(part_ml_ptr + 2 * part + 1, l_i, mask=m_valid)
        if FUSED_MERGE:
            if last_to_arrive(cnt_ptr + req * tl.num_programs(1) + kvh, num_splits):
                va._merge_rows(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, o_rows, head, m_valid,
                               offs_d, d_valid, num_splits, s_ps, s_pt, s_ph, s_ot, s_oh, s_od,
                               s_lt, s_lh, HEAD_DIM, BLOCK_M, HEAD_DIM, INTERPRET)
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        tl.store(out_ptr + o_rows[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :] * s_od,
                 (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=m_valid[:, None])
        tl.store(lse_ptr + o_rows * s_lt + head * s_lh, m_i + tl.log(l_safe), mask=m_valid)


class TmaVerify:
    """A launch of the TMA kernel with its buffers made once (so a graph can capture `__call__`)."""

    def __init__(self, q, k, v, tables, ctx, loc, max_q, *, block_n, num_warps, num_stages,
                 num_splits, fused_merge=True, max_registers=0):
        total, heads, dim = q.shape
        blocks, page, kvh, _ = k.shape
        if page % block_n:
            raise ValueError(f"the page ({page}) must be a multiple of the key tile ({block_n})")
        self.q, self.tables, self.ctx, self.loc = q, tables, ctx, loc
        # The pool as a 2-D [slots, kv_heads * dim] tensor: one page's keys of one KV head are the
        # box [page rows, dim columns at kvh * dim].
        shape, strides = [blocks * page, kvh * dim], [kvh * dim, 1]
        self.k_desc = TensorDescriptor(k, shape, strides, [block_n, dim])
        self.v_desc = TensorDescriptor(v, shape, strides, [block_n, dim])
        self.out = torch.empty_like(q)
        self.lse = torch.empty(total, heads, dtype=torch.float32, device=q.device)
        self.split = num_splits > 1
        n = num_splits if self.split else 1
        self.part_acc = torch.empty(n, total, heads, dim, dtype=torch.float32, device=q.device)
        self.part_ml = torch.empty(n, total, heads, 2, dtype=torch.float32, device=q.device)
        self.fused = fused_merge and self.split
        self.counters = arrival_counters(q.device, tables.shape[0] * kvh)
        self.grid = (tables.shape[0], kvh, num_splits)
        interpret = bool(triton.knobs.runtime.interpret)
        extra = {"maxnreg": max_registers} if max_registers and not interpret else {}
        self.meta = dict(PAGE=page, GROUP=heads // kvh, HEAD_DIM=dim,
                         BLOCK_M=va.tile_rows(max_q, heads // kvh), BLOCK_N=block_n, SPLIT=self.split,
                         FUSED_MERGE=self.fused, INTERPRET=interpret, num_warps=num_warps,
                         num_stages=num_stages, **extra)
        self.num_splits, self.heads, self.dim, self.interpret = num_splits, heads, dim, interpret
        self.scale = dim ** -0.5
        self.kernel = None

    def __call__(self):
        q, out, lse = self.q, self.out, self.lse
        total, heads = q.shape[0], q.shape[1]
        s_ps, s_pt, s_ph = total * heads, heads, 1
        self.kernel = _tma_verify_kernel[self.grid](
            q, self.k_desc, self.v_desc, out, lse, self.part_acc, self.part_ml, self.counters,
            self.tables, self.ctx, self.loc, self.scale, self.num_splits, q.stride(0), q.stride(1),
            *out.stride(), *lse.stride(), self.tables.stride(0), s_ps, s_pt, s_ph, **self.meta)
        if self.split and not self.fused:
            va._merge_splits_kernel[(total,)](
                self.part_acc, self.part_ml, out, lse, heads, self.num_splits, s_ps, s_pt, s_ph,
                *out.stride(), *lse.stride(), HEAD_DIM=self.dim,
                BLOCK_H=max(2, triton.next_power_of_2(heads)), BLOCK_D=self.dim,
                INTERPRET=self.interpret, USE_PDL=False)
        return out, lse


def repage(k, tables, page):
    """The same pool and tables at a smaller page size (`page` divides the pool's): page j of a
    request becomes pages j * r .. j * r + r - 1 of the finer pool, holding the same rows."""
    blocks, big, kvh, dim = k.shape
    r = big // page
    fine = k.view(blocks * r, page, kvh, dim)
    t = (tables.long()[:, :, None] * r + torch.arange(r, device=tables.device)).reshape(tables.shape[0], -1)
    return fine, t.to(torch.int32).contiguous()


def check(device) -> float:
    """The TMA kernel against the PyTorch reference on small ragged shapes; returns the worst max
    abs difference (raises past 2e-2)."""
    worst = 0.0
    g = torch.Generator(device="cpu").manual_seed(0)
    # Triton 3.6's interpreter computes bf16 dots wrongly (tests/kernels skip them there): float32
    # on the CPU, the engine's bf16 on the GPU.
    dtype = torch.float32 if triton.knobs.runtime.interpret else torch.bfloat16
    for heads, kvh, dim, page, block_n in ((9, 3, 64, 64, 64), (8, 2, 64, 128, 64), (8, 8, 32, 32, 32)):
        ctx = torch.tensor([300, 123, 77], dtype=torch.int32)
        lens = torch.tensor([8, 1, 3])
        per = -(-int(ctx.max()) // page)
        perm = torch.randperm(3 * per, generator=g)
        tables = perm.view(3, per).to(torch.int32).to(device)
        k = torch.randn(3 * per, page, kvh, dim, generator=g).to(device=device, dtype=dtype)
        v = torch.randn(3 * per, page, kvh, dim, generator=g).to(device=device, dtype=dtype)
        loc = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32).to(device)
        q = torch.randn(int(lens.sum()), heads, dim, generator=g).to(device=device, dtype=dtype)
        ctx = ctx.to(device)
        ref, ref_lse, _ = va.verify_attention_reference(q, k, v, tables, ctx, loc, dim ** -0.5)
        for splits, fused in ((1, False), (3, False), (3, True)):
            out, lse = TmaVerify(q, k, v, tables, ctx, loc, 8, block_n=block_n, num_warps=4,
                                 num_stages=2, num_splits=splits, fused_merge=fused)()
            diff = (out.float() - ref.float()).abs().max().item()
            dl = (lse - ref_lse).abs().max().item()
            print(f"check heads {heads}/{kvh} dim {dim} page {page} tile {block_n} splits {splits} "
                  f"fused {fused}: max |out - ref| {diff:.2e}, |lse - ref| {dl:.2e}")
            worst = max(worst, diff, dl)
    if worst > 2e-2:
        raise AssertionError(f"TMA kernel differs from the reference by {worst}")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only the small-shape reference check")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    worst = check(dev)
    if args.check:
        return
    from vegas_core.bench import common
    from vegas_core.bench.common import copy_bandwidth
    from vegas_core.bench.kernels import SHAPES, _bench, paged_case
    # Host-side descriptors hold a pointer to nothing Triton must allocate, but device-side ones
    # would; set an allocator anyway so a Triton that builds them in-kernel does not fail.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    copy = copy_bandwidth(dev)
    records = []
    cases = [("smollm2", 1, 8192), ("smollm2", 8, 8192), ("8b", 1, 8192), ("8b", 8, 8192)]
    os.makedirs(os.environ["OUT"] + "/results", exist_ok=True)
    path = os.environ["OUT"] + "/results/kernels-tma-verify.json"
    for shape, rows, ctx_len in cases:
        heads, kvh, dim, _ = SHAPES[shape]
        batch = 64
        k, v, tables, ctx = paged_case(batch, ctx_len, kvh, dim, 128, dev)
        q = torch.randn(batch * rows, heads, dim, device=dev, dtype=torch.bfloat16)
        loc = torch.arange(0, batch * rows + 1, rows, dtype=torch.int32, device=dev)
        kv_bytes = 2 * batch * ctx_len * kvh * dim * 2
        splits0 = va.default_num_splits(batch, kvh, ctx_len)

        def record(variant, us, out, **cfg):
            diff = (out.float() - ref.float()).abs().max().item()
            rec = dict(kernel="verify_attention", variant=variant, shape=shape, batch=batch,
                       context=ctx_len, q_rows=rows, heads=heads, kv_heads=kvh, head_dim=dim,
                       collect="none", us=us, kv_bytes=kv_bytes, read_TBps=kv_bytes / (us * 1e-6) / 1e12,
                       copy_TBps=copy, copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy,
                       max_abs_diff_vs_engine=diff, **cfg)
            records.append(rec)
            print(f"{shape} rows {rows} ctx {ctx_len} {variant:14s} {cfg}: {us:7.1f} us "
                  f"{rec['copy_fraction']:.0%} of copy, |diff| {diff:.1e}", flush=True)
            return rec

        kw = dict(max_ctx=ctx_len, max_q=rows)
        k16, t16 = repage(k, tables, 16)
        v16, _ = repage(v, tables, 16)
        ref = va.verify_attention(q, k16, v16, t16, ctx, loc, dim ** -0.5, **kw)[0]
        engine16 = record("engine-page16", _bench(lambda: va.verify_attention(q, k16, v16, t16, ctx, loc, dim ** -0.5, **kw)),
               ref, page=16)
        out = va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw)[0]
        record("engine-page128", _bench(lambda: va.verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, **kw)),
               out, page=128)
        best = None
        for page, block_n in ((128, 128), (128, 64), (64, 64)):
            kp, tp = (k, tables) if page == 128 else repage(k, tables, page)
            vp = v if page == 128 else repage(v, tables, page)[0]
            # 4 warps over 2-4 stages at the engine's split count, then 8 warps and twice the splits
            for warps, stages, splits in ((4, 2, splits0), (4, 3, splits0), (4, 4, splits0),
                                          (8, 3, splits0), (4, 3, 2 * splits0)):
                cfg = dict(page=page, block_n=block_n, num_warps=warps, num_stages=stages,
                           num_splits=splits)
                try:
                    run = TmaVerify(q, kp, vp, tp, ctx, loc, rows, block_n=block_n, num_warps=warps,
                                    num_stages=stages, num_splits=splits, fused_merge=dim <= 64)
                    o, _ = run()
                    us = _bench(run)
                except Exception as e:  # noqa: BLE001 - a launch that does not fit is a result too
                    print(f"{shape} rows {rows} {cfg}: failed: {type(e).__name__}: {str(e)[:200]}")
                    records.append(dict(variant="tma", shape=shape, q_rows=rows, context=ctx_len,
                                        error=f"{type(e).__name__}: {str(e)[:300]}", **cfg))
                    continue
                rec = record("tma", us, o, registers=run.kernel.n_regs, spills=run.kernel.n_spills,
                             **cfg)
                if best is None or us < best["us"]:
                    best = rec
        if best:
            print(f"== {shape} rows {rows} ctx {ctx_len}: best TMA {best['us']:.1f} us "
                  f"({best['copy_fraction']:.0%} of copy) against the engine's {engine16['us']:.1f} "
                  f"({engine16['copy_fraction']:.0%}): {engine16['us'] / best['us']:.2f}x", flush=True)
        del k, v, k16, v16
        torch.cuda.empty_cache()
        with open(path, "w") as f:     # after every case: a run cut short keeps what it measured
            json.dump(dict(date=datetime.date.today().isoformat(), device=common.device_description(dev),
                           command="python scripts/device/probe_tma_verify.py", torch=torch.__version__,
                           triton=triton.__version__, copy_TBps=copy, check_max_abs_diff=worst,
                           records=records), f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
