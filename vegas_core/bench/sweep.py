"""Where does speculation pay off? `python -m vegas_core.bench sweep`, and the app's live sweep.

On an engine that is already loaded (the app's own, or one the command builds), for every cell of a
grid of batch sizes x contexts, vanilla, stream and vegas decode the same prompts one after another:
real text (`texts.long_text`) in the model's chat template after `e2e`'s long-input instruction,
`context - gen_tokens` tokens exactly, then `gen_tokens` greedy tokens each. Rates are `e2e`'s
(`e2e.run_workload`: full-batch decode steps only; prefill, graph captures and Triton compiles left
out) and so is each cell's bandwidth bound (`e2e.bandwidth_bound`, at the copy rate measured once
at the start). A cell's prompts are prefilled once and forked for each method when the engine has
room for twice the batch, else each method prefills its own (untimed either way). Its requests record
no trace whatever the engine's default (the app's engine traces its page's runs).

Contract:
- `run_sweep(engine, grid, spec, ...)` returns the sweep document (plain JSON): `date` (local time),
  device, model, mode, settings, and one record per cell with `bound` and a record per method, or
  `refused` saying why the cell was not run. Nothing is clamped: a cell beyond the model's positions,
  with more requests than the engine runs at once, or needing more KV pages than the pool has free
  is refused.
- The engine must be idle (other requests would share the sweep's steps); the sweep calls
  `between_steps()` after every engine step (the app's worker answers its queue there) and stops
  when `stop` is set or `between_steps` raises `SweepStopped`: the requests it made are aborted
  and the document says `stopped`.
- `progress` (a `SweepProgress`) is rebound field by field as the sweep runs, for another thread
  to show; `progress.doc` is the document so far.
"""
from __future__ import annotations

import argparse
import datetime
import threading
from dataclasses import dataclass

from ..errors import InvalidRequestError, VegasError
from ..sampling import SamplingParams
from ..spec import SpecParams
from . import common, e2e, texts

METHODS = ("vanilla", "stream", "vegas")
# The sweep measures the engine: its requests record no trace (recording every layer's selections for
# 64 requests costs more host time an iteration than the GPU work), whatever the engine's default.
TRACE = False
INSTRUCTION = e2e.INSTRUCTIONS["long-input"]


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]      # tokens in the KV at the end of a request: prompt + generated
    gen_tokens: int

    @property
    def cells(self) -> list[tuple[int, int]]:
        """(batch, context), smallest context first: the largest cell, the slowest, comes last."""
        return [(b, c) for c in self.contexts for b in self.batches]


# The GPU grid spans launch-bound (batch 1) to KV-bound (batch 64 x 8K); the CPU one is what two
# cores measure in well under a minute.
GRIDS = {"cuda": Grid((1, 4, 16, 64), (1024, 4096, 8192), 128),
         "cpu": Grid((1, 4), (256, 512), 16)}
MAX_BATCH = max(max(g.batches) for g in GRIDS.values())   # sequences an engine needs for every grid


def grid_for(device) -> Grid:
    return GRIDS["cuda" if device.type == "cuda" else "cpu"]


class SweepStopped(VegasError):
    """The sweep was asked to stop; it ends after the current engine step."""


@dataclass
class SweepProgress:
    """What a running sweep does, for a reader on another thread (fields are rebound, not mutated)."""
    cells: int = 0                 # cells in the grid
    cell: int = 0                  # the cell being measured, from 1
    batch: int | None = None
    context: int | None = None
    method: str | None = None
    tokens: int = 0                # generated so far, over the whole sweep
    total_tokens: int = 0          # of the cells that fit
    doc: dict | None = None
    done: bool = False

    @property
    def line(self) -> str:
        if self.doc is None:
            return "starting: measuring the device's copy bandwidth…"
        if self.done:
            return "stopped" if self.doc.get("stopped") else "done"
        share = f", {self.tokens:,} of {self.total_tokens:,} tokens" if self.total_tokens else ""
        return (f"cell {self.cell} of {self.cells}: batch {self.batch} × {self.context:,} tokens, "
                f"{self.method or 'starting'}{share}")


def template_parts(tokenizer, instruction: str = INSTRUCTION) -> tuple[list[int], list[int]]:
    """Token ids before and after the text of a user turn in the model's chat template, the
    instruction first; a base model without a template gets BOS + instruction and nothing after."""
    if tokenizer.chat_template is None:
        return tokenizer.encode(instruction, add_special_tokens=True), []
    marker = "\u2063SWEEP-TEXT\u2063"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": instruction + marker}],
                                         add_generation_prompt=True)
    before, after = chat.split(marker)
    return tokenizer.encode(before), tokenizer.encode(after)


def cell_prompts(tokenizer, batch: int, prompt_tokens: int, parts) -> list[list[int]]:
    """`batch` distinct prompts of exactly `prompt_tokens` tokens (template + excerpt + template)."""
    before, after = parts
    n = prompt_tokens - len(before) - len(after)
    return [before + texts.long_text(n, tokenizer, i * n) + after for i in range(batch)]


def pages_per_request(context: int, block_size: int) -> int:
    return -(-(context + e2e.GAMMA_SLACK) // block_size) + 1   # as e2e sizes its engine


def refusal(engine, batch: int, context: int, gen_tokens: int, overhead: int) -> str | None:
    """Why the cell cannot run on this engine as it is, or None."""
    positions = engine.config.max_position_embeddings
    if context > positions:
        return f"context {context:,} is beyond the model's {positions:,} positions"
    if context - gen_tokens <= overhead:
        return (f"context {context:,} leaves no room for text: the chat template and instruction take "
                f"{overhead} tokens and {gen_tokens} are generated")
    seqs = engine.core.options.max_num_seqs
    if batch > seqs:
        return f"batch {batch} is more than the {seqs} requests this engine runs at once"
    need, free = batch * pages_per_request(context, engine.core.options.block_size), engine.core.allocator.num_free
    if need > free:
        return f"batch {batch} × {context:,} tokens needs {need:,} KV pages; the pool has {free:,} free"
    return None


def weight_bytes(engine) -> int:
    """What a decode step reads of the weights, counted as `bench e2e` counts them."""
    return e2e.read_weight_bytes(engine.core.runner.model.state_dict(), engine.dtype.itemsize)


def _specs(spec) -> dict:
    return {m: SpecParams(method="vanilla") if m == "vanilla" else
            SpecParams(method=m, gamma=spec.gamma, sparsity=spec.sparsity, min_budget=spec.min_budget,
                       granularity=spec.granularity) for m in METHODS}


def _header(engine, grid: Grid, spec, copy_tbps: float) -> dict:
    return dict(
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        device=common.device_description(engine.device), device_tag=common.device_tag(engine.device),
        model=engine.config.name or engine.source, dtype=str(engine.dtype).replace("torch.", ""),
        mode=engine.mode, traced=TRACE,
        grid=dict(batches=list(grid.batches), contexts=list(grid.contexts), gen_tokens=grid.gen_tokens),
        methods=list(METHODS), sampling="greedy",
        settings=dict(gamma=spec.gamma, sparsity=spec.sparsity, min_budget=spec.min_budget,
                      granularity=spec.granularity),
        copy_TBps=copy_tbps, instruction=INSTRUCTION, text=texts.corpus_info(),
        records=[], complete=False, stopped=False)


def run_sweep(engine, grid: Grid, spec, progress: SweepProgress | None = None,
              stop: threading.Event | None = None, between_steps=None) -> dict:
    """Measure every cell (see the module docstring); `spec` gives gamma, sparsity, min budget and
    granularity to stream and vegas."""
    progress = progress or SweepProgress()
    sweep = _Sweep(engine, grid, spec, progress)
    progress.cells = len(grid.cells)
    progress.total_tokens = sum(b * grid.gen_tokens * len(METHODS)
                                for (b, _), why in sweep.refused.items() if not why)
    doc = _header(engine, grid, spec, common.copy_bandwidth(engine.device))
    progress.doc = doc
    before = set(engine.core.requests)

    def on_step(tokens: int) -> None:
        progress.tokens += tokens
        if between_steps is not None:
            between_steps()
        if stop is not None and stop.is_set():
            raise SweepStopped("stopped")

    compiles = common.TritonCompiles().install()
    try:
        for i, (batch, context) in enumerate(grid.cells):
            progress.cell, progress.batch, progress.context, progress.method = i + 1, batch, context, None
            on_step(0)
            record = dict(batch=batch, context=context, prompt_tokens=context - grid.gen_tokens,
                          refused=sweep.refused[batch, context], bound=None, methods={})
            doc["records"] = doc["records"] + [record]    # rebound: a reader sees the cell fill in
            if not record["refused"]:
                sweep.measure(record, doc["copy_TBps"], dict(progress=on_step, compiles=lambda: compiles.count))
        doc["complete"] = True
    except SweepStopped:
        doc["stopped"] = True
    finally:
        compiles.uninstall()
        for rid in set(engine.core.requests) - before:    # a stopped cell's requests and parents
            engine.abort(rid)
        progress.done = True
    return doc


class _Sweep:
    """One sweep's fixed parts: the engine, the grid, each method's settings, the prompt template."""

    def __init__(self, engine, grid: Grid, spec, progress: SweepProgress):
        self.engine, self.grid, self.progress = engine, grid, progress
        self.specs = _specs(spec)
        self.parts = template_parts(engine.tokenizer)
        overhead = len(self.parts[0]) + len(self.parts[1])
        self.refused = {cell: refusal(engine, *cell, grid.gen_tokens, overhead) for cell in grid.cells}
        self.sampling = SamplingParams(max_tokens=grid.gen_tokens, ignore_eos=True, seed=0)

    def measure(self, record: dict, copy_tbps: float, run_args: dict) -> None:
        """Every method on one cell, into `record` (its parents, if any, aborted after)."""
        engine, batch, context = self.engine, record["batch"], record["context"]
        prompts = cell_prompts(engine.tokenizer, batch, record["prompt_tokens"], self.parts)
        workload = e2e.Workload(f"sweep {batch}x{context}", prompts, self.grid.gen_tokens, batch,
                                (record["prompt_tokens"],) * 2)
        record["bound"] = e2e.bandwidth_bound(workload, engine.config, weight_bytes(engine),
                                              engine.dtype.itemsize, copy_tbps)
        opts = engine.core.options
        twice = 2 * batch <= opts.max_num_seqs and \
            2 * batch * pages_per_request(context, opts.block_size) <= engine.core.allocator.num_free
        parents = e2e.prefill_parents(engine, workload, run_args["progress"]) if twice else None
        try:
            for method in METHODS:
                self.progress.method = method
                stats = e2e.run_workload(engine, workload, self.sampling, self.specs[method], parents=parents,
                                         trace=TRACE, **run_args)
                record["methods"] = {**record["methods"], method: _method_record(self.specs[method], stats, record)}
        finally:
            for p in parents or ():
                engine.abort(p.request_id)


def _method_record(spec, stats, record) -> dict:
    base = record["methods"].get("vanilla")
    speculative = spec.method != "vanilla"
    return dict(
        gamma=spec.gamma if speculative else None, sparsity=spec.sparsity if speculative else None,
        tokens_per_s=stats.tokens_per_s,
        speedup_vs_vanilla=stats.tokens_per_s / base["tokens_per_s"] if base and base["tokens_per_s"] else None,
        of_bound=stats.tokens_per_s / record["bound"]["tokens_per_s"],
        mean_acceptance_length=stats.mean_acceptance_length, full_batch_steps=stats.full_steps,
        decode_steps=stats.decode_steps, graph_warmup_steps=stats.warmup_steps,
        generated_tokens=stats.generated_tokens, step_ms=stats.step_ms)


# -- the command ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--batches", type=int, nargs="+", default=None,
                   help="batch sizes (default: 1 4 16 64 on a GPU, 1 4 on a CPU)")
    p.add_argument("--contexts", type=int, nargs="+", default=None,
                   help="contexts in tokens, prompt + generated (default: 1024 4096 8192 on a GPU, 256 512 on a CPU)")
    p.add_argument("--gen-tokens", type=int, default=None, help="tokens per request (default: 128 GPU, 16 CPU)")
    p.add_argument("--gamma", type=int, default=4, help="stream's and vegas's gamma (default: the app's 4)")
    p.add_argument("--sparsity", type=float, default=0.07, help="kept fraction (default: 0.07)")
    p.add_argument("--min-budget", type=int, default=16, help="floor on kept entries (default: the app's 16)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def run(args, argv: list[str]) -> str:
    """An engine built as the app builds its own (tracing by default, `MAX_BATCH` requests at once, the KV
    pool from free memory; `--deterministic` for the app's default batch-invariant kernels), so
    the file's numbers are the ones the app's live sweep shows."""
    from ..engine import Engine, resolve_device
    from ..options import EngineOptions

    spec = SpecParams(method="vegas", gamma=args.gamma, sparsity=args.sparsity, min_budget=args.min_budget)
    base = grid_for(resolve_device(args.device))
    grid = Grid(tuple(args.batches or base.batches), tuple(args.contexts or base.contexts),
                args.gen_tokens or base.gen_tokens)
    if min(grid.batches + grid.contexts + (grid.gen_tokens,)) < 1:
        raise InvalidRequestError("--batches, --contexts and --gen-tokens must be >= 1")
    opts = EngineOptions(trace=True, max_num_seqs=max(MAX_BATCH, *grid.batches), attention=args.attention,
                         cuda_graphs="off" if args.eager else "auto", deterministic=args.deterministic)
    engine = Engine(args.model, args.device, args.dtype, options=opts)
    progress = SweepProgress()
    bar = common.progress_bar(0, "sweep")
    bar.unit = "tok"
    shown = [None]

    def show() -> None:     # cheap: it runs between timed steps
        if progress.line != shown[0]:
            bar.total, shown[0] = progress.total_tokens, progress.line
            bar.set_postfix_str(shown[0], refresh=False)
        bar.update(progress.tokens - bar.n)

    doc = run_sweep(engine, grid, spec, progress, between_steps=show)
    bar.close()
    extra = {k: v for k, v in doc.items() if k not in ("records", "device")}   # write_results writes the device
    path = common.write_results("sweep", args.out, engine.device, argv, doc["records"], **extra)
    _print(doc["records"], doc)
    print(f"wrote {path}")
    return path


def _print(records: list[dict], doc: dict) -> None:
    cols = ["batch", "context", *(f"{m} tok/s" for m in METHODS), "bound tok/s", "vegas of bound %", "vegas x vanilla"]
    rows = []
    for r in records:
        m, bound = r["methods"], (r["bound"] or {}).get("tokens_per_s")
        if r["refused"]:
            rows.append([r["batch"], r["context"], f"refused: {r['refused']}", *[None] * (len(cols) - 3)])
            continue
        vegas = m.get("vegas", {})
        rows.append([r["batch"], r["context"], *(m.get(x, {}).get("tokens_per_s") for x in METHODS), bound,
                     None if vegas.get("of_bound") is None else 100 * vegas["of_bound"],
                     vegas.get("speedup_vs_vanilla")])
    s = doc["settings"]
    common.print_table(f"sweep: {doc['device']}, {doc['model']}, {doc['dtype']}, {doc['mode']} mode, gamma "
                       f"{s['gamma']}, sparsity {s['sparsity']}, {doc['grid']['gen_tokens']} tokens per request",
                       cols, rows)
