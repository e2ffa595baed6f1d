"""`python -m vegas_core.bench invariant`: the batch-invariant launches, timed and bit-checked on the GPU.

Issue 36: the batch-invariant mode's launches timed beside the default mode's and checked for
bit-invariance on this GPU, to choose a faster invariant launch per model shape.

Per model shape (`--shapes`: SmolLM2-135M 9/3 heads, head dim 64; Qwen2.5-0.5B 14/2, 64), at the
e2e shape (`--batch` 64 requests, contexts spread over the 512 keys below `--context` 8,192):
1. Attention (`verify_attention`), the decode step's call (1 row, no collection) and the
   verifications' (`--verify-rows` 10, 11 and 17 rows a request, collecting the first and last
   rows as Collect-2-Query does): the default mode's launches (`launch_config`, `default_num_splits`, the
   first/last tile), then the invariant launch of `options.InvariantConfig()` (today's defaults),
   then candidates by one-knob-at-a-time descent (`attention_axes`, at most ~14 trials): each knob in
   turn (tile rows, keys per tile, warps, stages, split size, register cap, page prefetch, fused
   merge, unmasked tiles) takes each of its other values with the others at the best so far; a
   trial becomes the best when its estimate (decode + the first verification row count, per
   layer) is 1 % lower AND its bits are invariant on this GPU (`kernels.invariance.
   attention_mismatches`: a row alone, among 64 decode rows, as one of 1-17 verification rows,
   in a prefill piece with the splits folded in the program, out/lse/logits bit for bit).
   `--candidates JSON` replaces the descent with a list of `InvariantConfig` fields to try.
2. Projections and the head (`fused_linear`; qkv through `norm_linear_rotary` as the engine runs
   it): at the decode step's 64 rows and the verifications' 64 x rows, the default mode's (the
   fused kernels' `CONFIGS` at 64 rows, cuBLAS's product above; the head cuBLAS's always) and each
   of `LINEAR_CANDIDATES` / `HEAD_CANDIDATES` (plus today's choice); the best per product is the
   fastest at 64 + 64 x the first verification row count whose rows are invariant
   (`kernels.invariance.rows_mismatches`, over the verification's rows).
Times: a captured CUDA graph replayed (`triton.testing.do_bench_cudagraph`: CUDA events, warm-up,
median of 40 ms of replays); on a CPU (the tests, under Triton's interpreter) the wall clock of one
call, meaningless as a timing. A verdict on a CPU is the interpreter's (run it inside `tests.row_dot.row_by_row_dot`).

Writes `bench/results/invariant-<date>-<device>.json`: every trial (`records`, each with its
config, times, registers and spills where Triton reports them, `invariant` and the first
mismatches), `summary` (per shape and mode: attention, products and head per call, and the
estimated decode and verification forwards in ms: layers x (attention + products) + head), and
`best` ({shape: {"shape", "config"}}), which `bench e2e --invariant-config FILE` and
`options.InvariantConfig.from_file` read.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from . import common

# name: attention and product shapes (the e2e models' own; tiny: the CPU tests').
SHAPES = {
    "smollm2": dict(heads=9, kv_heads=3, head_dim=64, hidden=576, intermediate=1536, vocab=49152,
                    layers=30, qkv_bias=False),
    "qwen2.5-0.5b": dict(heads=14, kv_heads=2, head_dim=64, hidden=896, intermediate=4864,
                         vocab=151936, layers=24, qkv_bias=True),
    "tiny": dict(heads=6, kv_heads=2, head_dim=32, hidden=96, intermediate=128, vocab=320, layers=2,
                 qkv_bias=False),
}
# fused_linear launches tried for every projection (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages),
# beside today's (`fused_linear.config_for`): wider row blocks read each weight tile for more rows
# (the verification's 640 rows), narrower ones give the 64-row decode step more programs.
LINEAR_CANDIDATES = [(16, 64, 64, 4, 3), (32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3),
                     (32, 32, 128, 4, 4), (128, 64, 64, 8, 3)]
HEAD_CANDIDATES = [(64, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (32, 128, 64, 4, 3),
                   (64, 128, 128, 8, 3)]
IMPROVES = 0.99     # a trial must beat the best estimate by 1 % (timing noise) to replace it


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", nargs="+", default=["smollm2", "qwen2.5-0.5b"], choices=list(SHAPES))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=8192,
                   help="the longest context; the batch's spread over the 512 keys below (default: 8192)")
    p.add_argument("--verify-rows", type=int, nargs="+", default=[10, 11, 17],
                   help="verification rows a request; the first is the estimate's (default: 10 11 17: "
                        "vegas's and stream's tuned gamma 9 and 10 at 8K, and the most)")
    p.add_argument("--candidates", default=None,
                   help="JSON list of InvariantConfig field dicts to try instead of the descent")
    p.add_argument("--max-trials", type=int, default=24, help="attention trials per shape at most")
    p.add_argument("--linear", action=argparse.BooleanOptionalAction, default=True,
                   help="time and choose the projections' and the head's launches (default: on)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


# -- timing ---------------------------------------------------------------------------------------
def _time_us(fn, device) -> float:
    """Median microseconds of ``fn()``: on a GPU replayed from a captured CUDA graph (launch cost
    out, as in the engine's graphs; `bench.kernels._bench`'s way, over 40 ms of replays), else
    one call on the wall clock."""
    if device.type == "cuda":
        import triton
        torch.cuda.synchronize()
        try:
            return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
        except Exception:   # noqa: BLE001 - a host sync inside fn: time it eagerly
            torch.cuda.synchronize()
            return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    t = time.perf_counter()                    # the interpreter compiles nothing: one call
    fn()
    return 1e6 * (time.perf_counter() - t)


def _kernel_stats(launched) -> dict:
    """Registers and spills of a compiled Triton kernel (None under the interpreter)."""
    return dict(registers=getattr(launched, "n_regs", None), spills=getattr(launched, "n_spills", None))


# -- attention --------------------------------------------------------------------------------------
def attention_axes(head_dim: int, group: int) -> list[tuple[str, list]]:
    """The descent's knobs in the order it tries them, each with its values (see the module
    docstring). Screened offline for sm_90 (Triton 3.6's ptxas, bench/NOTES.md 'bench invariant'):
    - tile rows from the 17-row tile down to 16: smaller tiles take a request's rows in chunks
      (a decode step's MMA work shrinks, a verification's programs multiply); the 64- and
      128-row tiles compile to Hopper's warp-group MMA, 32 and 16 rows to mma.sync, each the same
      in every call of one tile (decode, verification, prefill piece, collecting or not);
      a tile change resets the warps to its default (8 from 128 rows, else 4);
    - keys per tile (64 halves the registers of a 64-row tile: 4 programs an SM instead of 2);
    - warps; stages 2 or 3 (4 compiled to the same code as 3);
    - split size;
    - a register cap of 168 (3 programs of 4 warps an SM; 128 spilled in most collecting
      launches, 168 spills in the 64-row tile of 128 keys only, which then loses anyway);
    - page-table prefetch (the default decode step's gain), the merge by the last split,
      unmasked tiles."""
    from vegas_core.kernels.verify_attention import MAX_Q_ROWS, tile_rows
    top = tile_rows(MAX_Q_ROWS, group)
    tiles = [m for m in (top, top // 2, top // 4, top // 8) if m >= max(16, group)]
    return [("block_m", tiles), ("block_n", [128, 64] if head_dim <= 64 else [64, 128]),
            ("num_warps", [4, 8]), ("num_stages", [2, 3]), ("split_keys", [1024, 512, 2048]),
            ("max_registers", [0, 168]), ("page_ahead", [0, 1]), ("fused_merge", [False, True]),
            ("unmasked_tiles", [False, True])]


def resolved(cfg, head_dim: int, group: int):
    """``cfg`` with its zeros replaced by the per-shape defaults (`batch_invariant_launch`)."""
    from dataclasses import replace

    from vegas_core.kernels.verify_attention import batch_invariant_launch
    launch = batch_invariant_launch(head_dim, group, cfg)
    return replace(cfg, block_m=launch["block_m"], block_n=launch["block_n"], num_warps=launch["num_warps"])


class AttentionCase:
    """One shape's paged pool at the e2e batch and the calls the engine makes on it."""

    def __init__(self, shape: dict, batch: int, context: int, verify_rows: list[int], device):
        from .kernels import paged_case
        self.shape, self.device = shape, device
        h, kvh, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
        self.k, self.v, self.tables, _ = paged_case(batch, context, kvh, d, 16, device)
        spread = min(512, context // 2)
        self.ctx = torch.tensor([context - spread * i // max(1, batch - 1) for i in range(batch)],
                                dtype=torch.int32, device=device)
        self.batch, self.context = batch, context
        self.rows = [1] + list(verify_rows)
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.q = {r: torch.randn(batch * r, h, d, generator=gen).to(torch.bfloat16).to(device)
                  for r in self.rows}

    def call(self, rows: int, launch: dict | None):
        """A no-argument function running the call of ``rows`` rows a request (collecting the
        first and last rows when > 1, as Collect-2-Query does) with ``launch`` (None: the default
        mode's: `launch_config`, `default_num_splits`, the first/last tile); it returns the
        launched kernel. Outputs are allocated once, as in the engine's graphs."""
        from vegas_core.kernels.verify_attention import (collected_row_slots, collected_rows,
                                                         default_num_splits, invariant_num_splits,
                                                         verify_attention_into)
        q, total = self.q[rows], self.batch * rows
        heads, kvh = self.shape["heads"], self.shape["kv_heads"]
        loc = torch.arange(0, total + 1, rows, dtype=torch.int32)
        out = torch.empty_like(q)
        lse = torch.empty(total, heads, dtype=torch.float32, device=self.device)
        logits = slots = None
        if rows > 1:
            kept = collected_rows(loc, "c2q")
            logits = torch.empty(len(kept), heads, self.context, dtype=torch.bfloat16, device=self.device)
            slots = collected_row_slots(kept, total).to(self.device)
        loc = loc.to(self.device)
        if launch is None:
            kw = dict(num_splits=default_num_splits(self.batch, kvh, self.context), c2q_tile=rows > 1)
        else:
            kw = dict(launch, num_splits=invariant_num_splits(self.context, launch["split_keys"]))

        def fn():
            return verify_attention_into(q, self.k, self.v, self.tables, self.ctx, loc,
                                         self.shape["head_dim"] ** -0.5, out, lse, max_q=rows,
                                         logits=logits, row_slot=slots, logits_len=self.context, **kw)
        return fn

    def time(self, launch: dict | None) -> dict:
        rec = {}
        for rows in self.rows:
            fn = self.call(rows, launch)
            launched = fn()
            rec[f"us_{rows}"] = _time_us(fn, self.device)
            stats = _kernel_stats(launched)
            rec[f"registers_{rows}"], rec[f"spills_{rows}"] = stats["registers"], stats["spills"]
        return rec


def check_attention(launch: dict, shape: dict, cfg, batch: int, device) -> list[str]:
    """`kernels.invariance.attention_mismatches` at this launch: on a GPU over contexts whose 17
    verification rows straddle position 4,096 (a split and tile boundary of every candidate),
    with 64 decode rows; on a CPU the interpreter's small contexts."""
    from vegas_core.kernels.invariance import attention_mismatches
    from vegas_core.kernels.verify_attention import invariant_piece_rows
    group = shape["heads"] // shape["kv_heads"]
    ctx = (4104, 2100, 6000, 300) if device.type == "cuda" else (70, 44, 90, 23)
    rows_alone = None if device.type == "cuda" else (0, 16)
    return attention_mismatches(launch, shape["heads"], shape["kv_heads"], shape["head_dim"],
                                ctx=ctx, rows_alone=rows_alone, others=max(1, batch - 17),
                                piece_rows=invariant_piece_rows(group, cfg), device=device)


def attention_trials(name: str, shape: dict, args, device, bar) -> tuple[list[dict], object]:
    """The default mode's and the invariant candidates' attention records, and the best config
    (None when no candidate, not even today's, is invariant here)."""
    from dataclasses import replace

    from vegas_core.kernels.verify_attention import batch_invariant_launch
    from vegas_core.options import InvariantConfig
    d, group = shape["head_dim"], shape["heads"] // shape["kv_heads"]
    case = AttentionCase(shape, args.batch, args.context, args.verify_rows, device)
    first = f"us_{args.verify_rows[0]}"
    base = dict(kind="attention", shape=name, batch=args.batch, context=args.context)
    records = [dict(base, mode="default", candidate="default mode", **case.time(None))]
    bar.update(1)
    state = dict(best=None, cfg=None, trials=0)

    def consider(label: str, cfg) -> None:
        """Time ``cfg``, check its bits, and keep it when it is invariant and beats the best."""
        state["trials"] += 1
        rec = dict(base, mode="deterministic", candidate=label, step=state["trials"], config=cfg.to_dict())
        records.append(rec)
        bar.update(1)
        try:
            launch = batch_invariant_launch(d, group, cfg)
            rec.update(case.time(launch))
            bad = check_attention(launch, shape, cfg, args.batch, device)
        except Exception as e:   # noqa: BLE001 - out of shared memory, an invalid combination
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
            return
        rec["estimate_us"] = rec["us_1"] + rec[first]
        rec["invariant"], rec["mismatches"] = not bad, bad[:5]
        best = state["best"]
        if not bad and (best is None or rec["estimate_us"] < IMPROVES * best["estimate_us"]):
            state.update(best=rec, cfg=cfg)

    today = resolved(InvariantConfig(), d, group)
    consider("today's defaults", today)
    if args.candidates:
        for i, fields in enumerate(json.loads(args.candidates)):
            if state["trials"] < args.max_trials:
                consider(f"listed {i}: {json.dumps(fields)}", replace(today, **fields))
    else:
        for knob, values in attention_axes(d, group):
            for value in values:
                current = state["cfg"] or today
                if state["trials"] >= args.max_trials or getattr(current, knob) == value:
                    continue
                change = {knob: value, "num_warps": 0} if knob == "block_m" else {knob: value}
                consider(f"{knob}={value}", resolved(replace(current, **change), d, group))
    if state["best"] is not None:
        state["best"]["best"] = True
    return records, state["cfg"]


# -- projections and the head ---------------------------------------------------------------------
class LinearCase:
    """One shape's products at `rows` row counts: weights, inputs, and how each mode runs them."""

    def __init__(self, shape: dict, row_counts: list[int], device):
        self.shape, self.device, self.rows = shape, device, row_counts
        h, kvh, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
        hid, inter, vocab = shape["hidden"], shape["intermediate"], shape["vocab"]
        gen = torch.Generator(device="cpu").manual_seed(1)

        def rand(*s, scale=1.0):
            return (scale * torch.randn(*s, generator=gen)).to(torch.bfloat16).to(device)
        n_qkv = (h + 2 * kvh) * d
        top = max(row_counts)
        self.w = dict(qkv=rand(n_qkv, hid, scale=0.05), o_proj=rand(hid, h * d, scale=0.05),
                      gate_up=rand(2 * inter, hid, scale=0.05), down_proj=rand(hid, inter, scale=0.05),
                      head=rand(vocab, hid, scale=0.05))
        self.bias = rand(n_qkv, scale=0.1) if shape["qkv_bias"] else None
        self.norm = rand(hid, scale=0.1) + 1
        self.x = dict(qkv=rand(top, hid), o_proj=rand(top, h * d), gate_up=rand(top, hid),
                      down_proj=rand(top, inter), head=rand(top, hid))
        self.res = rand(top, hid)
        self.cos, self.sin = rand(top, d), rand(top, d)
        self.cache = torch.zeros(top // 16 + 2, 16, kvh, d, dtype=torch.bfloat16, device=device)
        self.slots = torch.arange(top, device=device)

    def key(self, product: str) -> tuple[int, int, bool]:
        """The (N, K, silu_mul) that `fused_linear.config_for` and `InvariantConfig.linear` use."""
        w = self.w[product]
        n = w.shape[0] // 2 if product == "gate_up" else w.shape[0]
        return n, w.shape[1], product == "gate_up"

    def fused(self, product: str, config, rows):
        """A function of a row slice running the product as the invariant mode does."""
        from vegas_core.kernels.fused_linear import linear_add, norm_linear
        from vegas_core.kernels.qkv_rotary import norm_linear_rotary
        s, w, x = self.shape, self.w[product], self.x[product]
        if product == "qkv":
            return lambda r=rows: norm_linear_rotary(
                x[r], self.norm, 1e-6, w, self.bias, self.cos[r], self.sin[r], s["heads"],
                s["kv_heads"], s["head_dim"], self.cache, self.cache, self.slots[r], config=config)
        if product in ("o_proj", "down_proj"):
            return lambda r=rows: linear_add(x[r], w, self.res[r].clone(), config=config)
        return lambda r=rows: norm_linear(x[r], self.norm, 1e-6, w, silu_mul=product == "gate_up",
                                          config=config)

    def cublas(self, product: str, rows):
        import torch.nn.functional as F
        bias = self.bias if product == "qkv" else None
        return lambda r=rows: F.linear(self.x[product][r], self.w[product], bias)


def linear_trials(name: str, shape: dict, args, device, bar) -> tuple[list[dict], dict, tuple]:
    """Every product's records (default mode, today's invariant launch, candidates) and the best
    {(N, K, silu): config} and head config among the invariant ones."""
    from vegas_core.kernels.fused_linear import CONFIGS, DEFAULT_CONFIG, HEAD_CONFIG
    from vegas_core.kernels.invariance import rows_mismatches
    from vegas_core.options import KernelOptions
    fused_rows = KernelOptions().fused_linear_rows      # the default mode's fused forwards, at most
    on_cpu = device.type != "cuda"
    decode = 16 if on_cpu else 64
    counts = [decode] + [decode * r for r in args.verify_rows]
    case = LinearCase(shape, counts, device)
    records, table, head = [], {}, None
    for product in ("qkv", "o_proj", "gate_up", "down_proj", "head"):
        key = case.key(product)
        today = HEAD_CONFIG if product == "head" else CONFIGS.get(key, DEFAULT_CONFIG)
        base = dict(kind="linear", shape=name, product=product, n=key[0], k=key[1], silu=key[2])
        rec = dict(base, mode="default", candidate="default mode")
        for rows in counts:
            fn = case.cublas(product, slice(0, rows)) if (rows > fused_rows or product == "head") else \
                case.fused(product, today, slice(0, rows))
            rec[f"us_{rows}"] = _time_us(fn, device)
        records.append(rec)
        cands = [today] + [c for c in (HEAD_CANDIDATES if product == "head" else LINEAR_CANDIDATES)
                           if c != today]
        if on_cpu:
            cands = cands[:2]
        best = None
        for config in cands:
            rec = dict(base, mode="deterministic", config=list(config),
                       candidate="today's" if config == today else "candidate")
            try:
                for rows in counts:
                    rec[f"us_{rows}"] = _time_us(case.fused(product, config, slice(0, rows)), device)
                bad = rows_mismatches(lambda r: case.fused(product, config, r)(), counts[1])
            except Exception as e:   # noqa: BLE001 - shared memory, a tile wider than the product
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
                records.append(rec)
                continue
            rec["invariant"], rec["mismatches"] = not bad, bad[:5]
            rec["estimate_us"] = rec[f"us_{counts[0]}"] + rec[f"us_{counts[1]}"]
            records.append(rec)
            if not bad and (best is None or rec["estimate_us"] < IMPROVES * best["estimate_us"]):
                best = rec
        bar.update(1)
        if best is not None:
            best["best"] = True
            if product == "head":
                head = tuple(best["config"])
            else:
                table[key] = tuple(best["config"])
    return records, table, head


# -- the summary ------------------------------------------------------------------------------------
def summarize(name: str, shape: dict, records: list[dict], verify_rows: list[int],
              decode_rows: int) -> list[dict]:
    """Per mode (default; deterministic with today's launches; deterministic with the best), the
    per-call times and the estimated decode and verification forwards (ms): layers x (attention +
    the four products) + the head. The default mode's verification products are cuBLAS's product
    alone (its norms, rotary and SiLU run as kernels of their own, not timed here)."""
    att = [r for r in records if r["kind"] == "attention" and r["shape"] == name and "us_1" in r]
    lin = [r for r in records if r["kind"] == "linear" and r["shape"] == name and "error" not in r]
    picks = {"default": (lambda r: r["mode"] == "default"),
             "deterministic (today)": (lambda r: r["mode"] == "deterministic"
                                       and r.get("candidate") in ("today's defaults", "today's")),
             "deterministic (best)": (lambda r: r["mode"] == "deterministic" and r.get("best"))}
    out = []
    for mode, pick in picks.items():
        a = next((r for r in att if pick(r)), None)
        products = {r["product"]: r for r in lin if pick(r)}
        if a is None:
            continue
        row = dict(shape=name, mode=mode, layers=shape["layers"])
        for rows in [1] + verify_rows:
            tokens = decode_rows * rows
            prod = sum(products[p][f"us_{tokens}"] for p in ("qkv", "o_proj", "gate_up", "down_proj")
                       if p in products)
            head = products["head"][f"us_{tokens}"] if "head" in products else 0.0
            row[f"attention_us_{rows}"] = a[f"us_{rows}"]
            row[f"products_us_{rows}"] = prod
            row[f"head_us_{rows}"] = head
            row[f"forward_ms_{rows}"] = (shape["layers"] * (a[f"us_{rows}"] + prod) + head) / 1e3
        out.append(row)
    return out


def gap_lines(summary: list[dict], rows_cols: list[int]) -> list[str]:
    """Per shape and forward: the default mode's estimate, the deterministic mode's today (and
    where its extra time goes: attention, the four products, the head) and with the best launches."""
    lines = []
    for name in dict.fromkeys(s["shape"] for s in summary):
        by_mode = {s["mode"]: s for s in summary if s["shape"] == name}
        base, today = by_mode.get("default"), by_mode.get("deterministic (today)")
        if base is None or today is None:
            continue
        best = by_mode.get("deterministic (best)")
        for n in rows_cols:
            layers = base["layers"]
            d_att = layers * (today[f"attention_us_{n}"] - base[f"attention_us_{n}"]) / 1e3
            d_prod = layers * (today[f"products_us_{n}"] - base[f"products_us_{n}"]) / 1e3
            d_head = (today[f"head_us_{n}"] - base[f"head_us_{n}"]) / 1e3
            b, t = base[f"forward_ms_{n}"], today[f"forward_ms_{n}"]
            line = (f"{name} {n}-row forward: default {b:.3f} ms, deterministic today {t:.3f} ms "
                    f"({100 * (t / b - 1):+.0f} %: attention {d_att:+.3f}, products {d_prod:+.3f}, "
                    f"head {d_head:+.3f} ms)")
            if best is not None:
                line += f", best {best[f'forward_ms_{n}']:.3f} ms ({100 * (best[f'forward_ms_{n}'] / b - 1):+.0f} %)"
            lines.append(line)
    return lines


def planned_trials(shape: dict, args) -> int:
    """Attention trials a shape takes at most: today's, then the listed candidates or one per
    other value of each knob of the descent."""
    if args.candidates:
        return min(args.max_trials, 1 + len(json.loads(args.candidates)))
    axes = attention_axes(shape["head_dim"], shape["heads"] // shape["kv_heads"])
    return min(args.max_trials, 1 + sum(len(v) - 1 for _, v in axes))


def run(args, argv: list[str]) -> str:
    from ..engine import resolve_device
    device = resolve_device(args.device)
    torch.manual_seed(0)
    records, best, summary = [], {}, []
    products = 5 if args.linear else 0
    bar = common.progress_bar(sum(1 + planned_trials(SHAPES[n], args) + products for n in args.shapes),
                              "invariant")
    for name in args.shapes:
        shape = SHAPES[name]
        recs, cfg = attention_trials(name, shape, args, device, bar)
        records += recs
        table, head = {}, None
        if args.linear:
            recs, table, head = linear_trials(name, shape, args, device, bar)
            records += recs
        decode_rows = 64 if device.type == "cuda" else 16
        if cfg is not None:
            from dataclasses import replace
            cfg = replace(cfg, linear=tuple(table.items()), head=head)
            best[name] = dict(shape={k: shape[k] for k in ("heads", "kv_heads", "head_dim", "hidden",
                                                           "intermediate", "vocab")},
                              config=cfg.to_dict())
        summary += summarize(name, shape, records, args.verify_rows, decode_rows)
        path = common.write_results(
            "invariant", args.out, device, argv, records, batch=args.batch, context=args.context,
            verify_rows=args.verify_rows, shapes={n: SHAPES[n] for n in args.shapes},
            linear_candidates=[list(c) for c in LINEAR_CANDIDATES],
            head_candidates=[list(c) for c in HEAD_CANDIDATES], summary=summary, best=best,
            complete=name == args.shapes[-1])
    bar.close()
    _print(records, summary, best, device, args.verify_rows)
    print(f"wrote {path}")
    return path


def _print(records, summary, best, device, verify_rows) -> None:
    rows_cols = [1] + verify_rows
    att = [r for r in records if r["kind"] == "attention"]
    common.print_table(
        f"invariant: attention, {common.device_description(device)} (us per call; estimate = 1 + "
        f"{verify_rows[0]} rows)",
        ["shape", "mode", "candidate", *[f"{r} rows us" for r in rows_cols], "estimate", "regs", "spills",
         "invariant", "best"],
        [[r["shape"], r["mode"], r.get("candidate"), *[r.get(f"us_{n}") for n in rows_cols],
          r.get("estimate_us"), r.get(f"registers_{verify_rows[0]}"), r.get(f"spills_{verify_rows[0]}"),
          r.get("invariant"), "*" if r.get("best") else r.get("error", "")[:40]] for r in att])
    lin = [r for r in records if r["kind"] == "linear"]
    if lin:
        counts = sorted({int(k[3:]) for r in lin for k in r if k.startswith("us_")})
        common.print_table(
            "invariant: projections and head (us per call)",
            ["shape", "product", "mode", "config", *[f"{n} rows" for n in counts], "invariant", "best"],
            [[r["shape"], r["product"], r["mode"], "cuBLAS/CONFIGS" if r["mode"] == "default" else
              "x".join(map(str, r["config"])), *[r.get(f"us_{n}") for n in counts], r.get("invariant"),
              "*" if r.get("best") else r.get("error", "")[:40]] for r in lin])
    if summary:
        common.print_table(
            "invariant: estimated forwards (ms) = layers x (attention + products) + head",
            ["shape", "mode", *[f"{n}-row fwd ms" for n in rows_cols],
             *[f"attn {n} us" for n in rows_cols], *[f"products {n} us" for n in rows_cols]],
            [[s["shape"], s["mode"], *[s[f"forward_ms_{n}"] for n in rows_cols],
              *[s[f"attention_us_{n}"] for n in rows_cols], *[s[f"products_us_{n}"] for n in rows_cols]]
             for s in summary])
    for line in gap_lines(summary, rows_cols):
        print(line)
    for name, b in best.items():
        c = b["config"]
        att_cfg = {k: v for k, v in c.items() if k not in ("linear", "head")}
        print(f"best invariant config for {name}: {json.dumps(att_cfg)}; linear {json.dumps(c['linear'])}; "
              f"head {c['head']}")
