"""`python -m vegas_core.bench collect`: what Collect-2-Query costs the engine, against collecting
every verification row and against collecting nothing, on one model at one batch x context: per
verification, per iteration and per attention layer. The paper's Figure 6 (its attention kernel
with collection against without) and its overhead contrast (about 5 % on Qwen3-8B, 37 % on
gpt-oss-20b, whose sliding-window layers leave little else in a step), on our models.

The batch's requests hold `--context` cached tokens each, random K/V: collecting and selecting cost
the same whatever the values, and no prefill is paid. Per mode (`none`: a verification that
collects nothing, as stream's and vanilla's; `c2q`: vegas's first and last rows; `all`:
vegas-all's gamma + 1 rows), one `verification` record:
- `verify_ms`: one verification forward of gamma + 1 rows per request, the engine's own
  (`ModelRunner.forward`, through its CUDA graphs on a GPU), the median of `--repeats`;
- `select_ms`: the next selection from those rows (vegas's or vegas-all's, batched as the engine
  does on the kernel path), 0 for none;
- `draft_ms`: gamma draft steps over vegas's selection (the engine's chain on a GPU), the same
  for every mode;
- `iteration_ms` = draft + verify + select; `overhead_verification` = verify / verify(none) - 1;
  `overhead_iteration` = (verify - verify(none) + select) / iteration, the share of an iteration
  that collecting and selecting cost.
One `layer` record per mode and layer kind: the verification attention alone (`verify_attention`,
or its PyTorch reference on a CPU) on the first global layer, and without collection on the first
sliding-window layer where the model has them. `overhead` = us / us(none) - 1 on that layer;
`model_share` = (us - us(none)) x global layers / verify_ms(none): the collection's kernel time
over the whole model's verification. On a hybrid model (Gemma 3) only the global layers collect
and select; the sliding ones attend their window.
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from . import common

MODES = {"none": None, "c2q": "vegas", "all": "vegas-all"}   # mode -> the method that collects so


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--batch", type=int, default=64, help="requests (default: 64)")
    p.add_argument("--context", type=int, default=16384,
                   help="cached tokens of each request before the verification (default: 16384)")
    p.add_argument("--gamma", type=int, default=6, help="drafts per iteration (default: 6)")
    p.add_argument("--sparsity", type=float, default=0.07, help="the drafts' budget (default: 0.07)")
    p.add_argument("--min-budget", type=int, default=16, help="floor on the budget (default: 16)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each step (default: 20)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def run(args, argv: list[str]) -> str:
    from ..engine import Engine
    from ..loader import load_model
    from ..options import EngineOptions
    from ..spec import SpecParams

    if args.batch < 1 or args.context < 1 or args.repeats < 1:
        raise SystemExit("--batch, --context and --repeats must be >= 1")
    specs = {mode: SpecParams(method=method, gamma=args.gamma, sparsity=args.sparsity,
                              min_budget=args.min_budget)
             for mode, method in MODES.items() if method}
    loaded = load_model(args.model)
    cfg = loaded.config
    rows = args.gamma + 1
    if args.context + rows > cfg.max_position_embeddings:
        raise SystemExit(f"--context {args.context} + {rows} rows pass the model's "
                         f"{cfg.max_position_embeddings} positions")
    block = 16
    per = -(-(args.context + rows) // block)
    opts = EngineOptions(block_size=block, num_blocks=args.batch * per + 8, max_num_seqs=args.batch,
                         attention=args.attention, cuda_graphs="off" if args.eager else "auto")
    engine = Engine(args.model, args.device, args.dtype, options=opts, loaded=loaded)
    runner, alloc, device = engine.core.runner, engine.core.allocator, engine.device
    for i in range(args.batch):
        alloc.ensure(i, args.context + rows)
    runner.pool.kv.normal_()
    bench = _Bench(runner, alloc, args, specs)

    verify = {mode: bench.time_ms(lambda m=mode: bench.verify(m)) for mode in MODES}
    select, views = {"none": 0.0}, None
    for mode, spec in specs.items():
        collector = bench.verify(mode)
        select[mode] = bench.time_ms(lambda c=collector, s=spec: bench.select(c, s))
        if mode == "c2q":
            views = bench.select(collector, spec)
    draft = bench.time_ms(lambda: bench.draft(views))
    records = []
    for mode in MODES:
        iteration = draft + verify[mode] + select[mode]
        records.append(dict(kind="verification", mode=mode, method=MODES[mode], verify_ms=verify[mode],
                            select_ms=select[mode], draft_ms=draft, iteration_ms=iteration,
                            collect_ms=verify[mode] - verify["none"],
                            overhead_verification=verify[mode] / verify["none"] - 1,
                            overhead_iteration=(verify[mode] - verify["none"] + select[mode]) / iteration,
                            **bench.shape))
    records += bench.layer_records(verify["none"])
    path = common.write_results(
        "collect", args.out, device, argv, records, model=engine.source, model_name=cfg.name,
        dtype=str(engine.dtype).replace("torch.", ""), attention=runner.attention,
        cuda_graphs=runner.graphs is not None, layers=cfg.num_layers,
        global_layers=list(cfg.global_layers), sliding_window=cfg.sliding_window)
    _print(records, engine, cfg)
    print(f"wrote {path}")
    return path


class _Bench:
    """The steps timed, on the engine's model runner: its verification, selection and drafts."""

    def __init__(self, runner, alloc, args, specs):
        self.runner, self.alloc, self.args, self.specs = runner, alloc, args, specs
        self.device = runner.device
        cfg = runner.config
        self.rows = args.gamma + 1
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, cfg.vocab_size, (args.batch, self.rows), generator=g).tolist()
        spec = next(iter(specs.values()))
        self.shape = dict(batch=args.batch, context=args.context, gamma=args.gamma,
                          sparsity=args.sparsity, budget=spec.budget(args.context),
                          heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                          layers=cfg.num_layers, collecting_layers=len(cfg.global_layers))

    def time_ms(self, fn) -> float:
        """Median ms of fn() over --repeats, after two warm-up runs (kernel compiles, graph
        captures), each run synchronised on both sides."""
        for _ in range(2):
            fn()
        times = []
        for _ in range(self.args.repeats):
            common.sync(self.device)
            start = time.perf_counter()
            fn()
            common.sync(self.device)
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)

    def verify(self, mode: str):
        """One verification forward (the engine's `_verify`): each request's pending token and
        gamma drafts at its context, collecting `mode`'s rows. Returns its collector."""
        from ..attention import LogitCollector
        from ..model_runner import BatchEntry
        spec = self.specs.get(mode)
        collect = spec.proposer.collect_rows(self.rows) if spec else None
        collector = LogitCollector() if spec else None
        entries = [BatchEntry(i, self.tokens[i], self.args.context, collect_rows=collect, logits="all")
                   for i in range(self.args.batch)]
        self.runner.forward(entries, self.alloc, collector, graph=True)
        return collector

    def select(self, collector, spec) -> list:
        """The next draft phase's selections from the collected rows, as the engine makes them
        (`EngineCore._select`): batched on the kernel path, one request at a time otherwise."""
        from ..spec.batched import SelectItem, select_batch
        from ..spec.proposers import SelectContext
        cfg, base, n = self.runner.config, self.args.context, self.args.batch
        rows = spec.proposer.collect_rows(self.rows)
        if self.runner.kernels:
            reqs = [SimpleNamespace(request_id=i, spec=spec, policy_cache={}) for i in range(n)]
            items = [SelectItem(i, reqs[i], base, 0, rows) for i in range(n)]
            new = select_batch(items, collector, cfg.num_layers, cfg.num_kv_heads, self.device,
                               self.runner.page_bounds, self.alloc.block_table, trace=False)
            return [new[i] for i in range(n)]
        return [spec.proposer.select(SelectContext(
            spec, base, cfg.num_layers, cfg.num_kv_heads, (collector.logits[i], collector.lse[i]),
            rows, 0, None, {})) for i in range(n)]

    def draft(self, views) -> None:
        """gamma draft steps over `views` (the engine's greedy chain where graphs run it)."""
        from ..model_runner import BatchEntry
        n, base, gamma = self.args.batch, self.args.context, self.args.gamma
        entries = [BatchEntry(i, self.tokens[i][:1], base, sparse=views[i], logits="last") for i in range(n)]
        if self.runner.chain(entries, self.alloc, gamma, [gamma] * n, to_host=False) is not None:
            return
        for j in range(gamma):
            step = [BatchEntry(i, [self.tokens[i][j]], base + j, sparse=views[i], logits="last")
                    for i in range(n)]
            self.runner.forward(step, self.alloc, graph=True)

    def layer_records(self, verify_none_ms: float) -> list[dict]:
        """The verification attention alone on the first global layer per mode, and on the first
        sliding layer without collection (see the module docstring)."""
        cfg = self.runner.config
        windows = cfg.layer_windows
        sliding = next((i for i, w in enumerate(windows) if w is not None), None)
        kinds = [("global", cfg.global_layers[0], mode) for mode in MODES]
        if sliding is not None:
            kinds.append(("sliding", sliding, "none"))
        out, none_us = [], None
        for kind, layer, mode in kinds:
            us = self._layer_us(layer, mode, windows[layer] or 0)
            if kind == "global" and mode == "none":
                none_us = us
            rec = dict(kind="layer", layer_kind=kind, layer=layer, mode=mode, us=us,
                       window=windows[layer], **self.shape)
            if kind == "global":
                rec["overhead"] = us / none_us - 1
                rec["model_share"] = (us - none_us) * len(cfg.global_layers) / 1e3 / verify_none_ms
            out.append(rec)
        return out

    def _layer_us(self, layer: int, mode: str, window: int) -> float:
        from vegas_core.attention.kernel_backend import window_splits
        from vegas_core.kernels.verify_attention import (collected_row_slots, collected_rows,
                                                         default_num_splits, verify_attention,
                                                         verify_attention_reference)
        cfg, n, rows, dev = self.runner.config, self.args.batch, self.rows, self.device
        pool = self.runner.pool
        ctx_len = self.args.context + rows
        blocks = -(-ctx_len // pool.block_size)
        tables = torch.tensor([self.alloc.block_table(i)[:blocks] for i in range(n)], dtype=torch.int32,
                              device=dev)
        ctx = torch.full((n,), ctx_len, dtype=torch.int32, device=dev)
        loc = torch.arange(0, n * rows + 1, rows, dtype=torch.int32, device=dev)
        q = torch.randn(n * rows, cfg.num_heads, cfg.head_dim, device=dev).to(pool.kv.dtype)
        args = (q, pool.k[layer], pool.v[layer], tables, ctx, loc, cfg.attention_scale)
        if not self.runner.kernels:
            fn = lambda: verify_attention_reference(*args, collect=mode, window=window)  # noqa: E731
        else:   # as the kernel backend launches it (collected rows and splits built beforehand)
            collect = collected_rows(loc.cpu(), mode)
            slots = collected_row_slots(collect, n * rows).to(dev) if mode != "none" else None
            splits = default_num_splits(n, cfg.num_kv_heads, ctx_len)
            if window:
                splits = window_splits(splits, n, cfg.num_kv_heads, window, rows)
            fn = lambda: verify_attention(  # noqa: E731
                *args, collect=collect if mode != "none" else "none", max_ctx=ctx_len, max_q=rows,
                row_slot=slots, c2q_tile=mode == "c2q", num_splits=splits, window=window)
        if dev.type == "cuda":
            from .kernels import _bench     # replayed from a CUDA graph: no launch cost in it
            return _bench(fn)
        return 1e3 * self.time_ms(fn)


def _print(records, engine, cfg) -> None:
    ver = [r for r in records if r["kind"] == "verification"]
    r0 = ver[0]
    common.print_table(
        f"collect: {common.device_description(engine.device)}, {cfg.name or cfg.arch}, batch {r0['batch']} "
        f"x {r0['context']}, gamma {r0['gamma']}, budget {r0['budget']}, "
        f"{r0['collecting_layers']} of {r0['layers']} layers collect",
        ["mode", "verify ms", "+ verify %", "select ms", "draft ms", "iteration ms", "of iteration %"],
        [[r["mode"], r["verify_ms"], 100 * r["overhead_verification"], r["select_ms"], r["draft_ms"],
          r["iteration_ms"], 100 * r["overhead_iteration"]] for r in ver])
    lay = [r for r in records if r["kind"] == "layer"]
    common.print_table("one layer's verification attention",
                       ["layer", "kind", "mode", "us", "+ %", "of model verify %"],
                       [[r["layer"], r["layer_kind"], r["mode"], r["us"],
                         None if r.get("overhead") is None else 100 * r["overhead"],
                         None if r.get("model_share") is None else 100 * r["model_share"]] for r in lay])
