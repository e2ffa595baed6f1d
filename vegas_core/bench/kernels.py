"""`python -m vegas_core.bench kernels`: the Triton kernels' time and bandwidth on the GPU, beside
the measured copy bandwidth and torch SDPA on the same dense work.

Every kernel runs on random bf16 data in a paged pool with shuffled block tables (never zeros),
after its output was checked against the PyTorch reference on a small case (`--placement-sweep`
times them with the pages placed other ways too: sequential, interleaved, scattered;
`--layout-sweep` with pages stored head-major and 64 tokens long). Times are the median
of `triton.testing.do_bench` (CUDA events, warm-up first). `read_TBps` = the bytes a kernel must
read (the K/V entries it attends, plus the logits the selection reads) / time; `copy_TBps` = a
1 GiB device-to-device copy, counting bytes read plus written, measured in the same run.

Records:
- verify_attention: `q_rows` rows per request, collect none / c2q (the first/last tile) / c2q-main
  (the same rows stored from the main tile) / all; `sdpa_us` is torch SDPA
  (`enable_gqa`, cuDNN backend when it takes the shape, else whichever torch picks; `sdpa_backend`
  says which) over the same K/V stored contiguously, so it pays no paging;
- the collection sweep (the paper's Figure 6): q_rows 2..16 at one shape, c2q and all-row overhead
  relative to no collection;
- sparse_attention: a `sparsity` budget of random positions per (request, KV head), granularity
  "kv-head", or one set shared by the KV heads, "layer" (Vegas's default; `packed` says whether one
  program took all of a request's KV heads), plus a tail of `q_rows` entries; bytes = the gathered
  entries;
- selection: one whole model step (all layers): softmax re-materialisation + mean
  (`selection_scores`, one launch for every layer) and one top-k over c2q logits held in one
  [layers, rows, heads, context] buffer; `us_fused*` both in one launch
  (`kernels/select_fused.py`, the engine's with `--fused-select` where rows fit) at 4, 8
  and 16 warps;
- quest_page_scores: one layer, one draft step.
"""
from __future__ import annotations

import argparse
import math

import torch

from . import common

SHAPES = {  # name: (query heads, KV heads, head dim, layers)
    "smollm2": (9, 3, 64, 30),
    "8b": (32, 8, 128, 32),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                   help="head shapes: smollm2 (9/3/64) and 8b (32/8/128) (default: both)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 128])
    p.add_argument("--context", type=int, nargs="+", default=[1024, 4096, 8192, 32768])
    p.add_argument("--q-rows", type=int, default=8, help="verification rows per request (default: 8)")
    p.add_argument("--sweep-rows", type=int, nargs="+", default=[2, 4, 8, 12, 16],
                   help="rows of the collection sweep (default: 2 4 8 12 16)")
    p.add_argument("--sweep-shape", default="64x8192", help="batch x context of the sweep and the "
                   "selection step (default: 64x8192)")
    p.add_argument("--sparsity", type=float, default=0.07, help="sparse_attention budget (default: 0.07)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-kv-gb", type=float, default=40.0,
                   help="skip shapes whose paged K+V exceed this (default: 40)")
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=True,
                   help="first sweep verify_attention's tile/warps/stages/splits at the sweep shape "
                        "and use the fastest (default: on)")
    p.add_argument("--collect-tune", action=argparse.BooleanOptionalAction, default=False,
                   help="sweep the launch configuration of each collection path at the sweep shape")
    p.add_argument("--sparse-tune", action=argparse.BooleanOptionalAction, default=False,
                   help="sweep sparse_attention's tile and split count at the sweep shape")
    p.add_argument("--merge-tune", action=argparse.BooleanOptionalAction, default=False,
                   help="time verify_attention's fused split merge against the merge kernel and "
                        "register caps (occupancy), without collection and with C2Q")
    p.add_argument("--order-tune", action=argparse.BooleanOptionalAction, default=False,
                   help="time verify_attention with and without its unmasked tiles (at --q-rows "
                        "and 1 row), and sparse_attention's pipeline stages and warps")
    p.add_argument("--placement-sweep", action=argparse.BooleanOptionalAction, default=False,
                   help="time verify_attention and sparse_attention with the pages shuffled, "
                        "sequential, interleaved and scattered over a larger pool")
    p.add_argument("--layout-sweep", action=argparse.BooleanOptionalAction, default=False,
                   help="time verify_attention and sparse_attention over pools stored token-major "
                        "and head-major, at page sizes 16 and 64")
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def _bench(fn) -> float:
    """Median microseconds of fn(), replayed from a captured CUDA graph so that Python's launch
    cost (what CUDA graphs remove in the engine, issue 5) stays out of the kernel's time; plain
    event timing when fn cannot be captured."""
    import triton
    torch.cuda.synchronize()      # do_bench_cudagraph runs on its own stream: setup must be done
    try:
        return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception:   # noqa: BLE001 - a host sync inside fn makes capture fail: time it eagerly
        torch.cuda.synchronize()
        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


PLACEMENTS = ("shuffled", "sequential", "interleaved", "scattered")


def page_tables(batch: int, per: int, placement: str = "shuffled", spread: int = 16,
                seed: int = 0) -> tuple[torch.Tensor, int]:
    """Block tables [batch, per] (int32, CPU) and the pool size they address, by placement:
    - shuffled: a random permutation of a pool holding exactly these pages (the default: no
      locality at all between a request's consecutive pages);
    - sequential: request i owns pages i*per .. (i+1)*per - 1 (one prefill into a fresh pool);
    - interleaved: page j of request i is j*batch + i (decode steps appending a page to every
      request in turn);
    - scattered: random pages of a pool `spread` times larger (a long-lived pool's free list)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = batch * per
    if placement == "shuffled":
        return torch.randperm(n, generator=g).view(batch, per).to(torch.int32), n
    if placement == "sequential":
        return torch.arange(n, dtype=torch.int32).view(batch, per), n
    if placement == "interleaved":
        return torch.arange(n, dtype=torch.int32).view(per, batch).t().contiguous(), n
    if placement == "scattered":
        pool = n * spread
        return torch.randperm(pool, generator=g)[:n].view(batch, per).to(torch.int32), pool
    raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


LAYOUTS = ("token-major", "head-major")


def paged_case(batch, context, kv_heads, dim, block_size, device, dtype=torch.bfloat16, seed=0,
               placement: str = "shuffled", layout: str = "token-major"):
    """A pool holding `batch` requests of `context` tokens, pages placed by `placement`
    (`page_tables`; shuffled unless asked). K and V are always indexed [block, offset, KV head,
    dim]; `layout` is how a page is stored: token-major (offset then KV head, the engine's pool)
    or head-major (KV head then offset, a strided view: one KV head's keys of a page contiguous)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    per = math.ceil(context / block_size)
    tables, num_blocks = page_tables(batch, per, placement, seed=seed)
    tables = tables.to(device)
    if layout == "head-major":
        k = torch.randn(num_blocks, kv_heads, block_size, dim, device=device, dtype=dtype).transpose(1, 2)
        v = torch.randn(num_blocks, kv_heads, block_size, dim, device=device, dtype=dtype).transpose(1, 2)
    else:
        k = torch.randn(num_blocks, block_size, kv_heads, dim, device=device, dtype=dtype)
        v = torch.randn(num_blocks, block_size, kv_heads, dim, device=device, dtype=dtype)
    ctx = torch.full((batch,), context, dtype=torch.int32, device=device)
    return k, v, tables, ctx


def _check_verify(device, dtype=torch.bfloat16) -> None:
    from vegas_core.kernels.verify_attention import verify_attention, verify_attention_reference
    heads, kvh, dim = 8, 2, 64
    k, v, tables, _ = paged_case(3, 300, kvh, dim, 16, device, dtype=dtype, seed=1)
    ctx = torch.tensor([300, 123, 77], dtype=torch.int32, device=device)
    loc = torch.tensor([0, 8, 9, 12], dtype=torch.int32, device=device)
    q = torch.randn(12, heads, dim, device=device, dtype=dtype)
    args = (q, k, v, tables, ctx, loc, dim ** -0.5)
    ref, ref_lse, _ = verify_attention_reference(*args)
    for splits in (1, 3):
        out, lse, _ = verify_attention(*args, num_splits=splits)
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        if not err < 1e-2 or not torch.allclose(lse, ref_lse, atol=1e-2):
            raise RuntimeError(f"verify_attention disagrees with its reference (rel. error {err:.2e})")


def _sdpa(q_rows, k, v, tables, batch, context, heads, kvh, dim):
    """torch SDPA over the same dense work, K/V contiguous per request: (us, backend)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kd = k[tables.long()].reshape(batch, -1, kvh, dim)[:, :context].transpose(1, 2).contiguous()
    vd = v[tables.long()].reshape(batch, -1, kvh, dim)[:, :context].transpose(1, 2).contiguous()
    q = torch.randn(batch, heads, q_rows, dim, device=k.device, dtype=k.dtype)
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kd, vd, enable_gqa=True)
                torch.cuda.synchronize()

                def run():
                    with sdpa_kernel(backend):
                        F.scaled_dot_product_attention(q, kd, vd, enable_gqa=True)
                return _bench(run), name
        except (RuntimeError, NotImplementedError, ValueError):
            continue   # this backend does not take the shape: try the next
    return None, None


def verify_records(shape, batch, context, q_rows, block_size, device, copy_tbps, with_sdpa=True,
                   config: dict | None = None, placement: str = "shuffled",
                   layout: str = "token-major"):
    """Collection as the engine runs it: the collected rows and their slot map are built once per
    step (not per layer), so they are prepared outside the timed call."""
    from vegas_core.kernels.verify_attention import collected_row_slots, collected_rows, verify_attention
    config = config or {}
    heads, kvh, dim, _ = SHAPES[shape]
    k, v, tables, ctx = paged_case(batch, context, kvh, dim, block_size, device, placement=placement,
                                   layout=layout)
    q = torch.randn(batch * q_rows, heads, dim, device=device, dtype=torch.bfloat16)
    loc = torch.arange(0, batch * q_rows + 1, q_rows, dtype=torch.int32, device=device)
    kv_bytes = 2 * batch * context * kvh * dim * k.element_size()
    base = dict(shape=shape, batch=batch, context=context, q_rows=q_rows, heads=heads,
                kv_heads=kvh, head_dim=dim, copy_TBps=copy_tbps, placement=placement,
                layout=layout, block_size=block_size)
    sdpa_us, backend = _sdpa(q_rows, k, v, tables, batch, context, heads, kvh, dim) if with_sdpa else (None, None)
    records, none_us = [], None
    loc_cpu = loc.cpu()
    # c2q: through the kernel's small first/last tile (the engine's choice for vegas); c2q-main:
    # the same rows stored from the main tile (how vegas-all / specextend rows are collected).
    for collect in ("none", "c2q", "c2q-main", "all"):
        rows = collected_rows(loc_cpu, collect.split("-")[0])
        mode = rows if collect != "none" else "none"
        slots = collected_row_slots(rows, batch * q_rows).to(device) if collect != "none" else None
        us = _bench(lambda: verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5, collect=mode,
                                             max_ctx=context, max_q=q_rows, row_slot=slots,
                                             c2q_tile=collect == "c2q", **config))
        none_us = us if collect == "none" else none_us
        logit_bytes = len(rows) * heads * context * 2
        rec = dict(kernel="verify_attention", collect=collect, us=us, read_TBps=kv_bytes / (us * 1e-6) / 1e12,
                   kv_bytes=kv_bytes, logit_bytes_written=logit_bytes,
                   copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy_tbps,
                   collect_overhead=us / none_us - 1 if collect != "none" else 0.0,
                   sdpa_us=sdpa_us, sdpa_backend=backend,
                   vs_sdpa=sdpa_us / us if sdpa_us else None, config=config, **base)
        records.append(rec)
    del k, v
    torch.cuda.empty_cache()
    return records


def sparse_record(shape, batch, context, sparsity, tail, block_size, device, copy_tbps,
                  block_n: int = 32, num_splits: int | None = None, placement: str = "shuffled",
                  layout: str = "token-major", granularity: str = "kv-head", **launch):
    """`launch`: sparse_attention's other options (num_warps, num_stages, packed), recorded as
    given. `granularity` "kv-head": a selection per KV head; "layer": one shared by the KV heads
    (Vegas's default), which the kernel may take in one program per request (`packed`)."""
    from vegas_core.kernels.sparse_attention import packs_kv_heads, sparse_attention
    heads, kvh, dim, _ = SHAPES[shape]
    k, v, tables, ctx = paged_case(batch, context, kvh, dim, block_size, device, placement=placement,
                                   layout=layout)
    base = context - tail
    budget = max(1, math.ceil(sparsity * base))
    groups = kvh if granularity == "kv-head" else 1
    score = torch.rand(batch, groups, base, device=device)
    idx = torch.topk(score, budget, dim=-1).indices.sort(dim=-1).values.to(torch.int32)
    counts = torch.full((batch,), budget, dtype=torch.int32, device=device)
    tail_start = torch.full((batch,), base, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, dim, device=device, dtype=torch.bfloat16)
    us = _bench(lambda: sparse_attention(q, k, v, tables, ctx, idx, counts, tail_start, dim ** -0.5,
                                         block_n=block_n, num_splits=num_splits, **launch))
    gathered = 2 * batch * (budget + tail) * kvh * dim * k.element_size()
    tbps = gathered / (us * 1e-6) / 1e12
    del k, v
    torch.cuda.empty_cache()
    return dict(kernel="sparse_attention", shape=shape, batch=batch, context=context, q_rows=1,
                heads=heads, kv_heads=kvh, head_dim=dim, collect="none", sparsity=sparsity,
                budget=budget, tail=tail, granularity=granularity,
                packed=launch.get("packed", packs_kv_heads(heads, kvh, groups)), us=us, read_TBps=tbps,
                gathered_bytes=gathered, copy_fraction=tbps / copy_tbps, copy_TBps=copy_tbps,
                block_n=block_n, num_splits=num_splits, launch=launch or None, placement=placement,
                layout=layout, block_size=block_size)


def tune_sparse(shape, batch, context, sparsity, tail, block_size, device, copy_tbps) -> list[dict]:
    """sparse_attention's tile (entries per step) and split count at one shape (records with
    `sweep: sparse_tune`; `num_splits` None is the automatic choice the engine uses)."""
    from vegas_core.kernels.sparse_attention import packs_kv_heads
    heads, kvh, _, _ = SHAPES[shape]
    variants = [("kv-head", {})]
    if packs_kv_heads(heads, kvh, 1):      # a shared selection: one program per KV head, or all
        variants += [("layer", dict(packed=False)), ("layer", dict(packed=True))]
    out = []
    for granularity, launch in variants:
        trials = []
        for block_n in (16, 32, 64):
            for splits in (None, 1, 2, 4, 8, 12, 16):
                rec = sparse_record(shape, batch, context, sparsity, tail, block_size, device,
                                    copy_tbps, block_n=block_n, num_splits=splits,
                                    granularity=granularity, **launch)
                rec["sweep"] = "sparse_tune"
                trials.append(rec)
        best = min(trials, key=lambda r: r["us"])
        auto = next(r for r in trials if r["block_n"] == 32 and r["num_splits"] is None)
        print(f"sparse_tune {shape} {granularity} {launch or ''}: best block_n {best['block_n']} "
              f"splits {best['num_splits']} {best['us']:.1f} us ({best['copy_fraction']:.0%} of copy); "
              f"engine default {auto['us']:.1f} us")
        out += trials
    return out


def selection_record(shape, batch, context, q_rows, device, copy_tbps):
    """One model step's selection (every layer) from c2q logits, as the engine runs it
    (`kernels.select.select_layers`: one scoring launch and one radix top-k launch for all
    layers); `us_torch_topk` is the torch.topk path it replaced, timed beside it."""
    from vegas_core.kernels import select_fused
    from vegas_core.kernels.select import _topk_sorted, select_layers, selection_scores
    heads, kvh, dim, layers = SHAPES[shape]
    rows = 2 * batch
    # As the engine holds them: one [L, R, H, N] logits buffer and the rows' lse [L, R, H].
    logits = torch.empty(layers, rows, heads, context, device=device, dtype=torch.bfloat16)
    lse = torch.empty(layers, rows, heads, device=device)
    for layer in range(layers):
        logits[layer] = (torch.randn(rows, heads, context, device=device) * 3).to(torch.bfloat16)
        lse[layer] = torch.logsumexp(logits[layer].float(), dim=-1)
    collected = (logits, lse)
    row_start = torch.arange(0, rows, 2, dtype=torch.int32, device=device)
    row_count = torch.full((batch,), 2, dtype=torch.int32, device=device)
    bases = torch.full((batch,), context - q_rows, dtype=torch.int32, device=device)
    k = math.ceil(0.07 * (context - q_rows))
    budgets = torch.full((batch,), k, dtype=torch.int32, device=device)
    per_gran = {gran: _bench(lambda: select_layers(collected, row_start, row_count, bases, budgets, k, kvh, gran,
                                                   n_keys=context - q_rows, fused=False))
                for gran in ("layer", "kv-head")}
    # Scoring and selecting in one launch (the engine's with FUSED_SELECT, where rows fit), at three warp counts;
    # each checked against the two-launch path's positions first.
    fused_us = {}
    if context - q_rows <= select_fused.MAX_KEYS:
        for gran in ("layer", "kv-head"):
            want = select_layers(collected, row_start, row_count, bases, budgets, k, kvh, gran,
                                 n_keys=context - q_rows, fused=False)
            for warps in (4, 8, 16):
                run = lambda: select_fused.select_fused(logits[..., :context - q_rows], lse, row_start,  # noqa: E731
                                                        row_count, bases, budgets, k, kvh, gran,
                                                        num_warps=warps)
                if not torch.equal(run(), want):
                    raise RuntimeError(f"select_fused ({gran}, {warps} warps) chose other positions")
                fused_us[f"{gran}/{warps}"] = _bench(run)

    def torch_topk(gran):   # the path select_layers had before radix_topk, for the A/B
        keys = selection_scores(logits[..., :context - q_rows], lse, row_start, row_count, bases,
                                kvh, gran, packed=True)
        return _topk_sorted(keys.flatten(0, 1), budgets.repeat(layers), k)
    torch_us = {gran: _bench(lambda: torch_topk(gran)) for gran in ("layer", "kv-head")}
    logit_bytes = layers * rows * heads * context * 2
    del collected, logits, lse
    torch.cuda.empty_cache()
    return dict(kernel="selection", shape=shape, batch=batch, context=context, q_rows=2, heads=heads,
                kv_heads=kvh, head_dim=dim, layers=layers, collect="c2q", budget=k,
                us=per_gran["layer"], us_kv_head=per_gran["kv-head"],
                us_torch_topk=torch_us["layer"], us_kv_head_torch_topk=torch_us["kv-head"],
                us_fused=fused_us.get(f"layer/{select_fused.NUM_WARPS}"),
                us_kv_head_fused=fused_us.get(f"kv-head/{select_fused.NUM_WARPS}"), us_fused_by_warps=fused_us,
                read_TBps=logit_bytes / (per_gran["layer"] * 1e-6) / 1e12, copy_TBps=copy_tbps)


def tune_verify(shape, batch, context, q_rows, block_size, device, copy_tbps,
                placement: str = "shuffled") -> tuple[dict, list[dict]]:
    """Time verify_attention (no collection) over tile sizes, warps, pipeline depth and split
    counts at one shape; returns the fastest config and every trial."""
    from vegas_core.kernels.verify_attention import default_num_splits, verify_attention
    heads, kvh, dim, _ = SHAPES[shape]
    k, v, tables, ctx = paged_case(batch, context, kvh, dim, block_size, device, placement=placement)
    q = torch.randn(batch * q_rows, heads, dim, device=device, dtype=torch.bfloat16)
    loc = torch.arange(0, batch * q_rows + 1, q_rows, dtype=torch.int32, device=device)
    kv_bytes = 2 * batch * context * kvh * dim * k.element_size()
    auto = default_num_splits(batch, kvh, context)
    trials = []
    for block_n in (32, 64, 128):
        for warps in (4, 8):
            for stages in (2, 3):
                for splits in sorted({auto, 2 * auto}):
                    cfg = dict(block_n=block_n, num_warps=warps, num_stages=stages, num_splits=splits)
                    try:
                        us = _bench(lambda: verify_attention(q, k, v, tables, ctx, loc, dim ** -0.5,
                                                             max_ctx=context, max_q=q_rows, **cfg))
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip config
                        trials.append(dict(config=cfg, error=str(e)[:200]))
                        continue
                    trials.append(dict(config=cfg, us=us, read_TBps=kv_bytes / (us * 1e-6) / 1e12))
    ok = [t for t in trials if "us" in t]
    best = min(ok, key=lambda t: t["us"])
    del k, v
    torch.cuda.empty_cache()
    return best["config"], [dict(kernel="verify_attention", sweep="tune", shape=shape, batch=batch,
                                 context=context, q_rows=q_rows, heads=heads, kv_heads=kvh, head_dim=dim,
                                 collect="none", copy_TBps=copy_tbps, **t) for t in trials]


def _time_verify_configs(shape, batch, context, q_rows, block_size, device, copy_tbps, sweep,
                         collects, configs, placement: str = "shuffled",
                         layout: str = "token-major") -> list[dict]:
    """verify_attention at one shape for each collection path in `collects` ("none", "c2q"
    through the first/last tile, "c2q-main" the same rows from the main tile) and each launch
    option dict in `configs`; a config that fails (out of shared memory, a register cap too low)
    is recorded with its error. Records carry `sweep`."""
    from vegas_core.kernels.verify_attention import collected_row_slots, collected_rows, verify_attention
    heads, kvh, dim, _ = SHAPES[shape]
    k, v, tables, ctx = paged_case(batch, context, kvh, dim, block_size, device, placement=placement,
                                   layout=layout)
    q = torch.randn(batch * q_rows, heads, dim, device=device, dtype=torch.bfloat16)
    loc = torch.arange(0, batch * q_rows + 1, q_rows, dtype=torch.int32, device=device)
    rows = collected_rows(loc.cpu(), "c2q")
    slots = collected_row_slots(rows, batch * q_rows).to(device)
    kv_bytes = 2 * batch * context * kvh * dim * k.element_size()
    base = dict(kernel="verify_attention", sweep=sweep, shape=shape, batch=batch, context=context,
                q_rows=q_rows, heads=heads, kv_heads=kvh, head_dim=dim, copy_TBps=copy_tbps,
                layout=layout, block_size=block_size)
    out = []
    for collect in collects:
        mode = "none" if collect == "none" else rows
        for cfg in configs:
            try:
                us = _bench(lambda: verify_attention(
                    q, k, v, tables, ctx, loc, dim ** -0.5, collect=mode, max_ctx=context,
                    max_q=q_rows, row_slot=None if collect == "none" else slots,
                    c2q_tile=collect == "c2q", **cfg))
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record it
                out.append(dict(base, collect=collect, config=cfg, error=f"{type(e).__name__}: {e}"[:200]))
                continue
            out.append(dict(base, collect=collect, config=cfg, us=us,
                            read_TBps=kv_bytes / (us * 1e-6) / 1e12,
                            copy_fraction=kv_bytes / (us * 1e-6) / 1e12 / copy_tbps))
    del k, v
    torch.cuda.empty_cache()
    return out


def tune_collect(shape, batch, context, q_rows, block_size, device, copy_tbps):
    """The launch configuration per collection path (`kernels.verify_attention.launch_config`):
    tile, warps and stages for C2Q through the first/last tile and from the main tile, beside no
    collection, at one shape (records with `sweep: collect_tune`)."""
    configs = [dict(block_n=block_n, num_warps=warps, num_stages=stages)
               for block_n in (64, 128) for warps in (4, 8) for stages in (2, 3)]
    return _time_verify_configs(shape, batch, context, q_rows, block_size, device, copy_tbps,
                                "collect_tune", ("none", "c2q", "c2q-main"), configs)


def tune_merge(shape, batch, context, q_rows, block_size, device, copy_tbps):
    """The split merge inside the kernel (last split merges) against the separate merge kernel,
    and register caps (Triton's maxnreg: 0 none; 128, 144 and 168 let an SM hold 4, 3 and 3
    programs of 4 warps), then tiles and stages under a cap, for verify_attention without
    collection and with C2Q (records with `sweep: merge_tune`; the committed runs also timed
    sparse_attention's in-kernel merge and slot-addressed selections, since removed)."""
    configs = [dict(fused_merge=fused, max_registers=regs) for fused in (False, True)
               for regs in (0, 128, 168)]
    configs += [dict(fused_merge=True, max_registers=regs, block_n=block_n, num_stages=stages)
                for regs in (144, 168) for block_n, stages in ((64, 2), (128, 3), (64, 3))]
    out = _time_verify_configs(shape, batch, context, q_rows, block_size, device, copy_tbps,
                               "merge_tune", ("none", "c2q"), configs)
    print_sweep("merge_tune", shape, out, [("verify_attention", "none", None), ("verify_attention", "c2q", None)])
    return out


def tune_order(shape, batch, context, q_rows, sparsity, block_size, device, copy_tbps):
    """A/B of launch choices in one run (records with `sweep: order_tune`): verify_attention with
    the tiles that every row sees whole left unmasked or not, without collection and with C2Q, at
    `q_rows` rows and at the one row of a plain decode step; sparse_attention's pipeline stages
    and warps. (The committed kernels-2026-12-01-h200-order.json also has the grid orders and
    slot-addressed selections this sweep had then; neither gained, and both were removed.)"""
    configs = [dict(unmasked_tiles=unmasked) for unmasked in (False, True)]
    out = []
    for rows in sorted({q_rows, 1}):
        out += _time_verify_configs(shape, batch, context, rows, block_size, device, copy_tbps,
                                    "order_tune", ("none", "c2q"), configs)
    launches = [dict(num_stages=stages) for stages in (2, 3, 4)]
    launches += [dict(num_warps=2, num_stages=stages) for stages in (3, 4)]
    for launch in launches:
        rec = sparse_record(shape, batch, context, sparsity, q_rows, block_size, device, copy_tbps,
                            **launch)
        rec.update(sweep="order_tune", config=launch)
        out.append(rec)
    print_sweep("order_tune", shape, out, [("verify_attention", "none", q_rows), ("verify_attention", "c2q", q_rows),
                                           ("verify_attention", "none", 1), ("sparse_attention", "none", 1)])
    return out


def tune_placement(shape, batch, context, q_rows, sparsity, block_size, device, copy_tbps):
    """The same kernels with the pages placed differently in the pool (`page_tables`; records
    with `sweep: placement`): verify_attention at `q_rows` rows and at one row, sparse_attention.
    The kernels read whole 16-token pages either way, so what differs is locality between a
    request's consecutive pages (address translation, DRAM rows)."""
    out = []
    for placement in PLACEMENTS:
        for rows in sorted({q_rows, 1}):
            for rec in verify_records(shape, batch, context, rows, block_size, device, copy_tbps,
                                      with_sdpa=False, placement=placement):
                if rec["collect"] in ("none", "c2q"):
                    out.append(dict(rec, sweep="placement", config={"placement": placement}))
        rec = sparse_record(shape, batch, context, sparsity, q_rows, block_size, device, copy_tbps,
                            placement=placement)
        out.append(dict(rec, sweep="placement", config={"placement": placement}))
    print_sweep("placement", shape, out, [("verify_attention", "none", q_rows),
                                          ("verify_attention", "c2q", q_rows),
                                          ("verify_attention", "none", 1),
                                          ("sparse_attention", "none", 1)])
    return out


def tune_layout(shape, batch, context, q_rows, sparsity, device, copy_tbps):
    """The attention kernels over pools stored token-major (the engine's) and head-major, at page
    sizes 16 and 64 (`paged_case`; records with `sweep: layout`): verify_attention at `q_rows`
    rows and at one row (the plain decode step), a few launches at one row, sparse_attention.
    Token-major, a program of one KV head reads 128-byte rows (head dim 64, bf16) three rows apart
    (SmolLM2's 3 KV heads); head-major, a whole page of its keys is one contiguous run, as the
    dense K/V that torch SDPA reads."""
    out = []
    one_row = [{}, dict(block_n=64), dict(num_warps=8), dict(num_stages=3)]
    for layout in LAYOUTS:
        for block_size in (16, 64):
            for rows in sorted({q_rows, 1}):
                configs = one_row if rows == 1 else [{}]
                collects = ("none",) if rows == 1 else ("none", "c2q")
                out += _time_verify_configs(shape, batch, context, rows, block_size, device, copy_tbps,
                                            "layout", collects, configs, layout=layout)
            rec = sparse_record(shape, batch, context, sparsity, q_rows, block_size, device, copy_tbps,
                                layout=layout)
            out.append(dict(rec, sweep="layout", config={}))
    for r in out:
        if "us" in r:
            print(f"layout {shape} {r['layout']:11s} page {r['block_size']:2d} {r['kernel']:16s} "
                  f"{r['collect']:4s} rows {r['q_rows']:2d} {r.get('config') or ''}: {r['us']:7.1f} us "
                  f"{r['read_TBps'] / copy_tbps:4.0%} of copy")
        else:
            print(f"layout {shape} {r['layout']} page {r['block_size']} {r.get('config')}: {r.get('error')}")
    return out


def print_sweep(sweep: str, shape: str, records: list[dict], groups) -> None:
    """One line per (kernel, collection, rows) group of a sweep (rows None: any): every timed
    configuration and the fastest."""
    for kernel, collect, rows in groups:
        ok = [r for r in records if r["kernel"] == kernel and r.get("collect") == collect and "us" in r
              and (rows is None or r["q_rows"] == rows)]
        best = min(ok, key=lambda r: r["us"])
        print(f"{sweep} {shape} {kernel} {collect}{'' if rows is None else f' rows {rows}'}: "
              + ", ".join(f"{r['config']} {r['us']:.1f} us" for r in ok) + f"; best {best['config']}")


def quest_record(shape, batch, context, block_size, device, copy_tbps):
    from vegas_core.kernels.select import quest_page_scores, quest_positions, quest_sizes
    heads, kvh, dim, _ = SHAPES[shape]
    pages = context // block_size
    num_blocks = batch * pages
    tables = torch.randperm(num_blocks).view(batch, pages).to(torch.int32).to(device)
    kmin = torch.randn(num_blocks, kvh, dim, device=device, dtype=torch.bfloat16)
    kmax = kmin + torch.rand_like(kmin)
    q = torch.randn(batch, heads, dim, device=device, dtype=torch.bfloat16)
    num_pages = torch.full((batch,), pages, dtype=torch.int32, device=device)
    bases = num_pages * block_size
    budgets = torch.full((batch,), math.ceil(0.07 * context), dtype=torch.int32, device=device)
    by_tile = {bp: _bench(lambda: quest_page_scores(q, kmin, kmax, tables, num_pages, "layer", block_p=bp,
                                                     p_max=pages))
               for bp in (16, 32, 64, 128)}
    us = by_tile[16]                                       # the default tile
    s = quest_page_scores(q, kmin, kmax, tables, num_pages, "layer")
    sizes = quest_sizes([pages] * batch, [pages * block_size] * batch, [int(budgets[0])] * batch, block_size)
    pos_us = _bench(lambda: quest_positions(s, num_pages, bases, budgets, block_size, sizes=sizes))
    read = 2 * num_blocks * kvh * dim * 2
    return dict(kernel="quest_page_scores", shape=shape, batch=batch, context=context, q_rows=1,
                heads=heads, kv_heads=kvh, head_dim=dim, collect="none", us=us,
                read_TBps=read / (us * 1e-6) / 1e12, quest_positions_us=pos_us, copy_TBps=copy_tbps,
                us_by_block_p={str(k): v for k, v in by_tile.items()})


def run(args, argv: list[str]) -> str:
    device = torch.device(args.device)
    common.require_cuda(device, "kernel", "the kernels' CPU check is the test suite, under "
                                          "TRITON_INTERPRET=1")
    torch.manual_seed(0)
    _check_verify(device)
    copy_tbps = common.copy_bandwidth(device)
    sweep_b, sweep_ctx = (int(x) for x in args.sweep_shape.split("x"))
    records, tuned = [], {}
    if args.tune:
        for shape in args.shapes:
            tuned[shape], trials = tune_verify(shape, sweep_b, sweep_ctx, args.q_rows, args.block_size,
                                               device, copy_tbps)
            records += trials
    if args.collect_tune:
        for shape in args.shapes:
            trials = tune_collect(shape, sweep_b, sweep_ctx, args.q_rows, args.block_size, device, copy_tbps)
            records += trials
            for collect in ("none", "c2q", "c2q-main"):
                ok = [t for t in trials if t["collect"] == collect and "us" in t]
                if ok:
                    best = min(ok, key=lambda t: t["us"])
                    print(f"collect_tune {shape} {collect}: best {best['config']} {best['us']:.1f} us")
    if args.sparse_tune:
        for shape in args.shapes:
            records += tune_sparse(shape, sweep_b, sweep_ctx, args.sparsity, args.q_rows, args.block_size,
                                   device, copy_tbps)
    if args.merge_tune:
        for shape in args.shapes:
            records += tune_merge(shape, sweep_b, sweep_ctx, args.q_rows, args.block_size,
                                  device, copy_tbps)
    if args.order_tune:
        for shape in args.shapes:
            records += tune_order(shape, sweep_b, sweep_ctx, args.q_rows, args.sparsity,
                                  args.block_size, device, copy_tbps)
    if args.placement_sweep:
        for shape in args.shapes:
            records += tune_placement(shape, sweep_b, sweep_ctx, args.q_rows, args.sparsity,
                                      args.block_size, device, copy_tbps)
    if args.layout_sweep:
        for shape in args.shapes:
            records += tune_layout(shape, sweep_b, sweep_ctx, args.q_rows, args.sparsity, device,
                                   copy_tbps)
    grid = [(s, b, c) for s in args.shapes for b in args.batch for c in args.context]
    bar = common.progress_bar(len(grid) + 2 * len(args.shapes), "kernels")
    for shape, batch, context in grid:
        heads, kvh, dim, _ = SHAPES[shape]
        if 2 * batch * context * kvh * dim * 2 > args.max_kv_gb * 1e9:
            bar.update(1)
            continue
        records += verify_records(shape, batch, context, args.q_rows, args.block_size, device, copy_tbps,
                                  with_sdpa=True, config=_scaled(tuned.get(shape), batch, context,
                                                                 sweep_b, sweep_ctx))
        for granularity in ("kv-head", "layer"):
            records.append(sparse_record(shape, batch, context, args.sparsity, args.q_rows,
                                         args.block_size, device, copy_tbps, granularity=granularity))
        records.append(quest_record(shape, batch, context, args.block_size, device, copy_tbps))
        bar.update(1)
    for shape in args.shapes:
        for rows in args.sweep_rows:
            for rec in verify_records(shape, sweep_b, sweep_ctx, rows, args.block_size, device, copy_tbps,
                                      with_sdpa=False, config=tuned.get(shape)):
                rec["sweep"] = "collect_rows"
                records.append(rec)
        bar.update(1)
        records.append(selection_record(shape, sweep_b, sweep_ctx, args.q_rows, device, copy_tbps))
    for shape, cfg in tuned.items():
        best = min((r for r in records if r.get("sweep") == "tune" and r["shape"] == shape and "us" in r),
                   key=lambda r: r["us"])
        print(f"tuned verify_attention {shape}: {cfg} -> {best['us']:.1f} us, {best['read_TBps']:.2f} TB/s "
              f"({best['read_TBps'] / copy_tbps:.0%} of copy)")
        bar.update(1)
    bar.close()
    path = common.write_results("kernels", args.out, device, argv, records, copy_TBps=copy_tbps,
                                tuned_verify_config=tuned,
                                notes="bf16 K/V; verify q_rows rows per request; times are medians "
                                      "of triton.testing.do_bench")
    _print(records, copy_tbps, device)
    print(f"wrote {path}")
    return path


def _scaled(config, batch, context, tuned_batch, tuned_ctx):
    """The tuned tile/warp/stage choice everywhere; the split count is left to the default rule
    except at the tuned shape itself (it depends on how many programs the batch gives)."""
    if not config:
        return None
    cfg = dict(config)
    if (batch, context) != (tuned_batch, tuned_ctx):
        cfg.pop("num_splits", None)
    return cfg


def _print(records, copy_tbps, device) -> None:
    cols = ["kernel", "shape", "batch", "context", "rows", "collect/sel", "us", "TB/s", "of copy", "SDPA us",
            "SDPA/ours", "overhead"]
    rows = []
    for r in records:
        if r.get("sweep") or "us" not in r:
            continue
        kind = r.get("granularity", r["collect"]) if r["kernel"] == "sparse_attention" else r["collect"]
        rows.append([r["kernel"], r["shape"], r["batch"], r["context"], r["q_rows"], kind, r["us"],
                     r["read_TBps"], r.get("copy_fraction"), r.get("sdpa_us"), r.get("vs_sdpa"),
                     r.get("collect_overhead")])
    common.print_table(f"kernels: {common.device_description(device)}, copy {copy_tbps:.2f} TB/s", cols, rows)
    sweep = [r for r in records if r.get("sweep") == "collect_rows"]
    rows = [[r["shape"], r["q_rows"], r["collect"], r["us"], r["collect_overhead"]] for r in sweep]
    common.print_table("collection overhead vs rows (Figure 6)", ["shape", "rows", "collect", "us", "overhead"],
                       rows)
    for r in records:
        if r["kernel"] == "selection" and r.get("us_fused_by_warps"):
            fused = ", ".join(f"{k} {v:.1f}" for k, v in r["us_fused_by_warps"].items())
            print(f"selection {r['shape']} {r['batch']}x{r['context']}: two launches {r['us']:.1f} us "
                  f"(kv-head {r['us_kv_head']:.1f}); one launch (granularity/warps) {fused} us")
