"""`python -m vegas_core.bench e2e`: every method on the same workload, one after another in one
process and one engine, so the ratios between them are measured side by side.

Workloads (prompts are real text: slices of the standard-library corpus, `texts.long_text`, in the
model's chat template, or plain after BOS for a base model without one; lengths spread evenly over
the range):
- `reasoning`: 100-300-token prompts, 1,024 generated tokens, batch 64, the prompt set replayed
  twice so continuous batching keeps the batch full (the paper replays its datasets the same way);
- `long-input`: 4K-7.5K-token prompts, 256 generated tokens, batch 32;
- `small`: 200-400-token prompts, 32 tokens, batch 2 (what a CPU can run in a minute or two).

`--prompt-tokens LO HI` moves a workload's prompt lengths (e.g. long-input at 7,168-7,680, contexts
near the model's 8K: issue 5's "batch 64 x ~8K").

`--trace-cost ROUNDS`: every method also runs on a second engine that records the trace the app's
views read (`EngineOptions(trace=True)`), untraced and traced runs alternating ROUNDS times; each
record gets `trace` (every run's rate, whether the tokens were the same, the traced run's chain
counters) and `trace_cost` = best untraced rate / best traced rate - 1: the decode time recording
adds (issue 33 holds it to 10 %).

Bandwidth bound (`bandwidth_bound` in the file, `of_bound` per record): the rate no
non-speculative decoder passes on this workload, from the copy bandwidth measured at the start of
the run (`common.copy_bandwidth`), the weights and the batch's KV at the workload's mean context.

Throughput: tokens emitted by decode steps / wall time of those steps, counting only steps that run
the full batch (the stable rate; prefill steps, the draining tail, the steps that captured a
CUDA graph and those during which Triton compiled a kernel are left out; every decode step counts
when none ran full). Samplings: `greedy` (temperature 0) and `model-card` (temperature 0.2,
top-p 0.9: SmolLM2-135M-Instruct's model-card example); for Qwen2.5-Coder, `qwen-card` (its
generation config's temperature 0.7, top-p 0.8, top-k 20; its repetition penalty 1.05 left out:
the engine has none, and rejection sampling needs the target's own distribution). Each method
runs with its tuned (gamma, sparsity) from `python -m vegas_core.bench tune` when a result file for
this model and device exists (or `--tuned FILE`), else with `--gamma` / `--sparsity`.

Modes (`--modes default deterministic`, or `--deterministic` alone): each mode runs every sampling
and method on an engine of its own, one mode after the other in the same process, so the records
(each with its `mode`) compare the batch-invariant kernels (`EngineOptions.deterministic`) with the
default ones: greedy exact match against the same mode's vanilla, and `vs_default`, a method's
tokens/s over its default-mode tokens/s. `--alone N` then runs the first N requests again, each by
itself (its own prefill, batch 1) with the same sampling and seed: `alone_match` is the share whose
tokens equal what the request got in the batch (1.0 is the batch-invariant mode's promise).
`--invariant-config FILE` runs the batch-invariant mode with the launches a `bench invariant`
result chose for this model's shape (or an `options.InvariantConfig` JSON; `latest`: the newest
invariant result for this device in `--out`); each deterministic record's `invariant_config` says
which launches ran (`invariant_launches`).
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import time
from dataclasses import dataclass

from ..errors import InvalidRequestError, VegasError
from . import common, texts

WORKLOADS = {   # prompt token range, generated tokens, batch, replays of the prompt set
    "reasoning": dict(prompt_tokens=(100, 300), gen_tokens=1024, batch=64, replays=2),
    "long-input": dict(prompt_tokens=(4096, 7680), gen_tokens=256, batch=32, replays=1),
    "small": dict(prompt_tokens=(200, 400), gen_tokens=32, batch=2, replays=1),
}
INSTRUCTIONS = {
    "reasoning": "Read this excerpt and explain step by step what it does:\n\n",
    "long-input": "Summarise what the following source file provides:\n\n",
    "small": "Explain what this code does:\n\n",
}
SAMPLINGS = {"greedy": dict(temperature=0.0), "model-card": dict(temperature=0.2, top_p=0.9),
             "qwen-card": dict(temperature=0.7, top_p=0.8, top_k=20)}
SAMPLING_SOURCES = {"model-card": "SmolLM2-135M-Instruct's model-card example",
                    "qwen-card": "Qwen2.5-Coder-Instruct's generation_config.json, without its "
                                 "repetition_penalty 1.05 (the engine has none)"}
# (method, granularity): vanilla, the baselines, and Vegas at both granularities.
METHODS = [("vanilla", "layer"), ("stream", "layer"), ("quest", "layer"), ("specextend", "layer"),
           ("vegas", "layer"), ("vegas-all", "layer"), ("vegas", "kv-head")]
GAMMA_SLACK = 17
MODES = ("default", "deterministic")     # EngineOptions.deterministic False / True


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    add_workload_arguments(p)
    p.add_argument("--methods", nargs="+", default=None,
                   help="method[/granularity] list (default: vanilla stream quest specextend vegas vegas-all "
                        "vegas/kv-head)")
    p.add_argument("--sampling", nargs="+", default=["greedy", "model-card"], choices=list(SAMPLINGS))
    p.add_argument("--tuned", nargs="+", default=None, metavar="FILE",
                   help="tune result file(s) (default: the latest for this model and device); several files, "
                        "e.g. one tune per group of methods, are read together, a method tuned in two is an error")
    p.add_argument("--gamma", type=int, default=6, help="gamma without a tuned setting (default: 6)")
    p.add_argument("--sparsity", type=float, default=0.07, help="sparsity without a tuned setting (default: 0.07)")
    p.add_argument("--modes", nargs="+", default=None, choices=list(MODES),
                   help="run every method in each mode, on an engine of its own (default: deterministic with "
                        "--deterministic, else default)")
    p.add_argument("--alone", type=int, default=None, metavar="N",
                   help="after each run, run its first N requests again one at a time: alone_match "
                        "(default: 4 on a GPU, 0 on a CPU)")
    p.add_argument("--no-pdl", action="store_true",
                   help="launch the Triton kernels without programmatic dependent launch "
                        "(on by default on Hopper and later)")
    p.add_argument("--invariant-config", default=None, metavar="FILE",
                   help="the batch-invariant mode's launches: a `bench invariant` result (its best for this "
                        "model's shape) or an InvariantConfig JSON; 'latest': the newest invariant result for "
                        "this device in --out (default: the built-in defaults)")
    p.add_argument("--trace-cost", type=int, default=0, metavar="ROUNDS",
                   help="also run every method recording a trace (a second engine), alternating untraced and "
                        "traced runs ROUNDS times: trace_cost = best untraced / best traced rate - 1 (default: off)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default=None, choices=list(WORKLOADS),
                   help="default: long-input on a GPU, small on a CPU")
    p.add_argument("--batch", type=int, default=None, help="override the workload's batch")
    p.add_argument("--gen-tokens", type=int, default=None, help="override the workload's generated tokens")
    p.add_argument("--replays", type=int, default=None, help="override how often the prompt set is replayed")
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                   help="override the workload's prompt lengths (tokens of text, spread evenly over "
                        "[LO, HI]); e.g. 7168 7680 puts long-input's contexts near the model's 8K")
    p.add_argument("--min-budget", type=int, default=16,
                   help="floor on the kept entries, the same for every method (default: 16)")


# -- the workload --------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    prompts: list[list[int]]        # every request, replays included (the unique ones first)
    gen_tokens: int
    batch: int
    prompt_range: tuple[int, int]
    unique: int = 0                 # distinct prompts

    def __post_init__(self):
        self.unique = self.unique or len(self.prompts)

    @property
    def max_context(self) -> int:
        return max(len(p) for p in self.prompts) + self.gen_tokens


def build_workload(args, tokenizer, config, on_gpu: bool) -> Workload:
    name = args.workload or ("long-input" if on_gpu else "small")
    spec = dict(WORKLOADS[name])
    batch = args.batch or spec["batch"]
    gen = args.gen_tokens or spec["gen_tokens"]
    replays = args.replays or spec["replays"]
    lo, hi = spec["prompt_tokens"]
    limit = config.max_position_embeddings - gen - GAMMA_SLACK - 64   # room for the template
    if args.prompt_tokens:
        lo, hi = args.prompt_tokens
        if not 1 <= lo <= hi:
            raise SystemExit(f"--prompt-tokens needs 1 <= LO <= HI, got {lo} {hi}")
        if hi > limit:
            raise SystemExit(f"--prompt-tokens up to {hi} do not fit the model's "
                             f"{config.max_position_embeddings} positions with {gen} generated tokens: "
                             f"HI may be at most {limit}")
    hi = min(hi, limit)
    lo = min(lo, hi)
    lengths = [lo + (hi - lo) * i // max(1, batch - 1) for i in range(batch)]
    prompts, offset = [], 0
    for n in lengths:
        excerpt = tokenizer.decode(texts.long_text(n, tokenizer, offset))
        offset += n
        prompts.append(prompt_ids(tokenizer, INSTRUCTIONS[name] + excerpt))
    return Workload(name, prompts * replays, gen, batch, (lo, hi), unique=len(prompts))


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The text in the model's chat template; a base model without one (Gemma-3-270M) gets the
    plain text after its BOS, as a base model is prompted."""
    if tokenizer.chat_template is None:
        return tokenizer.encode(text, add_special_tokens=True)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return tokenizer.encode(chat)


def bandwidth_bound(workload: Workload, config, weight_bytes: int, itemsize: int,
                    copy_tbps: float) -> dict:
    """The rate no non-speculative decoder passes on this workload (DESIGN.md's "about 22,000
    tokens/s" at batch 64 x 8K): each step of `batch` requests reads at least the weights once and
    every request's whole KV, at best at the measured copy bandwidth. A request's context over its
    generated tokens averages prompt + (gen - 1) / 2 tokens. Issue 5 holds vanilla to 75 % of it."""
    kv_per_token = config.kv_bytes_per_token(itemsize)
    mean_context = sum(len(p) for p in workload.prompts) / len(workload.prompts) \
        + (workload.gen_tokens - 1) / 2
    # a sliding-window layer (Gemma 3) reads its window only
    step_bytes = weight_bytes + workload.batch * config.kv_bytes_read(mean_context, itemsize)
    step_s = step_bytes / (copy_tbps * 1e12)
    return dict(copy_TBps=copy_tbps, mean_context=mean_context, kv_bytes_per_token=kv_per_token,
                weight_bytes=weight_bytes, step_bytes=step_bytes, step_ms=1e3 * step_s,
                tokens_per_s=workload.batch / step_s)


def read_weight_bytes(weights: dict, itemsize: int) -> int:
    """Bytes of the weights a decode step reads: all but an untied embedding table (of which a
    step reads only its tokens' rows; a tied one is the head and counts)."""
    skip = "model.embed_tokens.weight" if "lm_head.weight" in weights else None
    return sum(w.numel() for name, w in weights.items() if name != skip) * itemsize


# -- one run -------------------------------------------------------------------------------------
@dataclass
class RunStats:
    tokens_per_s: float
    decode_s: float
    full_steps: int
    decode_steps: int
    warmup_steps: int
    generated_tokens: int
    mean_acceptance_length: float | None
    per_position_acceptance: list[float] | None
    draft_ms: float
    verify_ms: float
    select_ms: float
    iteration_ms: float
    outputs: list[list[int]]
    chains: dict          # the engine's chain counters over the run (launched, ahead, used, early)
    step_ms: dict         # the rate's steps' wall times: median, slowest, fastest
    gc: dict              # Python's garbage collections during the run (`GcPauses.summary`)
    page_adjacency: float | None = None   # at the first full-batch step (BlockAllocator.adjacency)
    phase_steps: int = 0  # the rate's steps whose phase times are averaged (not one right after a warm-up)


PHASES = ("draft_ms", "verify_ms", "select_ms")


def prefill_parents(engine, workload: Workload, on_step=None) -> list:
    """Prefill every distinct prompt once, as held vanilla requests that never decode; each run
    then forks its requests from them (`Engine.fork` copies the KV), so every method starts from
    the same cache bit for bit and no run pays for the prefill. `on_step(0)` after every step
    (as `run_workload`'s `progress`)."""
    from ..sampling import SamplingParams
    from ..spec import SpecParams
    parents = [engine.add(p, SamplingParams(max_tokens=1), SpecParams(method="vanilla"))
               for p in workload.prompts[:workload.unique]]
    for p in parents:
        engine.pause(p.request_id)
    while any(p.needs_prefill for p in parents):
        engine.step()
        if on_step is not None:
            on_step(0)
    return parents


def run_workload(engine, workload: Workload, sampling, spec, progress=None, parents=None,
                 compiles=None, trace: bool | None = None) -> RunStats:
    """Run every request of the workload to completion, forked from `parents` when given (see
    `prefill_parents`; requests the pool has no room to copy for prefill when they are admitted);
    the stable decode rate (see the module docstring) and the phase times per iteration, over the
    same steps as the rate but a step right after a warm-up step (its chain, launched ahead during
    the warm-up, was timed across the capture or compile, so its draft time could read three
    times the iteration's: bench/NOTES.md, bench.e2e.run_workload). `compiles`: a callable giving
    the number of Triton compiles so far (`common.TritonCompiles`); a step that moves it is left
    out like a graph capture. `trace`: whether the requests record their iterations (None: the
    engine's `EngineOptions.trace`)."""
    core = engine.core
    graphs = core.runner.graphs
    if parents is None:
        reqs = [engine.add(p, sampling, spec, trace=trace) for p in workload.prompts]
    else:
        reqs = [engine.fork(parents[i % len(parents)], sampling, spec, trace) for i in range(len(workload.prompts))]
    full_s = all_s = 0.0
    full_tok = all_tok = full_steps = decode_steps = warmup_steps = 0
    full_ph, all_ph = dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0.0)
    full_timed = all_timed = 0            # steps whose phase times are averaged
    after_warmup = False
    chains_before = dict(core.chains)
    full_dts, all_dts = [], []
    adjacency, probed, skip_next = None, False, False
    with common.frozen_heap(), GcPauses() as pauses:
        common.sync(engine.device)
        last = time.perf_counter()
        while any(not r.finished for r in reqs):
            running = sum(not r.held for r in core.scheduler.running)   # held parents sit out
            captured = graphs.captures if graphs is not None else 0
            compiled = compiles() if compiles is not None else 0
            core.reset_phase_totals()
            events = engine.step()
            # No synchronisation between steps: the engine may have launched the next iteration's
            # chain already (run-ahead), so a step costs the wall time from the last step's end to its
            # own (host work between steps included, as a server would pay it).
            now = time.perf_counter()
            dt, last = now - last, now
            if progress is not None:
                progress(sum(len(e.new_token_ids) for e in events))
            if not events:
                continue                                    # a prefill step
            if skip_next:                                   # it paid for the locality probe below
                skip_next = False
                continue
            if ((graphs is not None and graphs.captures != captured)
                    or (compiles is not None and compiles() != compiled)):
                warmup_steps += 1                           # it captured or compiled: not the rate
                after_warmup = True
                continue
            # The step after a capture or compile counts for the rate (it paid neither) but not for
            # the phase times: its chain was launched, and its start marked, before that warm-up.
            timed, after_warmup = not after_warmup, False
            emitted = sum(len(e.new_token_ids) for e in events)
            decode_steps += 1
            all_dts.append(dt)
            all_s += dt
            all_tok += emitted
            if timed:
                _add_phases(all_ph, core.phase_totals)
                all_timed += 1
            if running >= workload.batch and not probed:
                # Page locality once (host work between steps: the next step is left out).
                adjacency = core.allocator.adjacency([r.request_id for r in reqs if not r.finished])
                probed = skip_next = True
            if running >= workload.batch:
                full_dts.append(dt)
                full_steps += 1
                full_s += dt
                full_tok += emitted
                if timed:
                    _add_phases(full_ph, core.phase_totals)
                    full_timed += 1
    results = [engine.result(r) for r in reqs]
    for r in reqs:
        engine._trackers.pop(r.request_id, None)
    tok, sec = (full_tok, full_s) if full_steps else (all_tok, all_s)
    spec_iters = sum(r.spec_iterations for r in results)
    accepted = sum(r.accepted for r in results)
    per_pos = None
    if spec_iters:
        width = max(len(r.per_position_accepted) for r in results)
        per_pos = [sum(r.per_position_accepted[j] for r in results if j < len(r.per_position_accepted)) / spec_iters
                   for j in range(width)]
    ph, timed = (full_ph, full_timed) if full_steps else (all_ph, all_timed)
    n, timed_n = max(1, full_steps if full_steps else decode_steps), max(1, timed)
    return RunStats(
        tokens_per_s=tok / sec if sec > 0 else 0.0, decode_s=all_s, full_steps=full_steps,
        decode_steps=decode_steps, warmup_steps=warmup_steps, generated_tokens=sum(r.generated_tokens for r in results),
        mean_acceptance_length=1 + accepted / spec_iters if spec_iters else None,
        per_position_acceptance=per_pos, draft_ms=ph["draft_ms"] / timed_n,
        verify_ms=ph["verify_ms"] / timed_n, select_ms=ph["select_ms"] / timed_n,
        iteration_ms=1e3 * sec / n, phase_steps=timed,
        outputs=[r.token_ids for r in results],
        chains={k: v - chains_before.get(k, 0) for k, v in core.chains.items()},
        step_ms=_spread(full_dts if full_steps else all_dts), gc=pauses.summary(),
        page_adjacency=adjacency)


class GcPauses:
    """Python's garbage collections while installed (`gc.callbacks`): how many, how long in all,
    the slowest. A collection of the older generations walks every tracked object and can stop
    the host for milliseconds in the middle of a step."""

    def __init__(self):
        self.count, self.ms, self.slowest, self._start = 0, 0.0, 0.0, None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            ms = 1e3 * (time.perf_counter() - self._start)
            self.count, self.ms, self.slowest = self.count + 1, self.ms + ms, max(self.slowest, ms)
            self._start = None

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict:
        return dict(collections=self.count, ms=self.ms, slowest_ms=self.slowest)


def _spread(dts: list[float]) -> dict:
    """Median, slowest and fastest step in ms: a mean pulled up by a few slow steps (a host
    pause) reads differently from one that every step pays."""
    if not dts:
        return {}
    ms = sorted(1e3 * d for d in dts)
    return dict(median=ms[len(ms) // 2], max=ms[-1], min=ms[0])


def alone_check(engine, workload: Workload, sampling, spec, outputs, n: int) -> dict:
    """Requests 0..n-1 of the workload again, each by itself (prefilled alone, decoded at batch 1),
    with the same sampling and seed: does each get the tokens it got in the batch (`outputs`)?"""
    differs = []
    for i in range(min(n, workload.unique)):
        req = engine.add(workload.prompts[i], sampling, spec)
        while not req.finished:
            engine.step()
        if engine.result(req).token_ids != outputs[i]:
            differs.append(i)
        engine._trackers.pop(req.request_id, None)
    count = min(n, workload.unique)
    return dict(alone_match=1 - len(differs) / count if count else None, alone_requests=count,
                alone_differs=differs)


def divergences(engine, prompts, outputs, vanilla_outputs, limit: int = 8) -> list[dict]:
    """Where greedy outputs differ from vanilla's: the first differing position of (up to `limit`)
    requests and the logit gap there, logit(vanilla's token) - logit(this run's token), under
    one full-attention forward of the common prefix (eager). A gap of a few bf16 steps means
    a near-tie that the batch's different reduction order broke the other way."""
    out = []
    for j, (got, want) in enumerate(zip(outputs, vanilla_outputs)):
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if i is None:
            continue
        logits = engine.core.next_token_logits(prompts[j] + want[:i])
        out.append(dict(request=j, position=i, vanilla_token=want[i], token=got[i],
                        logit_gap=float(logits[want[i]] - logits[got[i]])))
        if len(out) >= limit:
            break
    return out


def _add_phases(acc: dict, totals: dict) -> None:
    for key in PHASES:
        acc[key] += totals[key]


def _linear_configs() -> dict:
    from vegas_core.kernels.fused_linear import CONFIGS, DEFAULT_CONFIG
    return {"default": list(DEFAULT_CONFIG), **{f"{n}x{k}{' silu' if silu else ''}": list(c)
                                                for (n, k, silu), c in CONFIGS.items()}}


# -- tuned settings ------------------------------------------------------------------------------
def find_tuned(paths: list[str] | str | None, out_dir: str, model_name: str, device) -> tuple[dict, str | None]:
    """{"method/granularity": {"gamma", "sparsity"}} from tune results, and their paths ("; "-joined)."""
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        tag = common.device_tag(device)
        for cand in sorted(glob.glob(os.path.join(out_dir, f"tune-*-{tag}.json")), reverse=True):
            try:
                with open(cand, encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if doc.get("model_name") == model_name and doc.get("complete"):
                paths = [cand]
                break
        if not paths:
            return {}, None
    tuned: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("model_name") not in (None, model_name):
            raise SystemExit(f"--tuned {path}: tuned for {doc['model_name']}, not {model_name}")
        twice = set(tuned) & set(doc.get("tuned", {}))
        if twice:
            raise SystemExit(f"--tuned {path}: {', '.join(sorted(twice))} already tuned in an earlier file")
        tuned.update(doc.get("tuned", {}))
    return tuned, "; ".join(paths)


def parse_methods(items: list[str] | None) -> list[tuple[str, str]]:
    if not items:
        return list(METHODS)
    out = []
    for item in items:
        method, _, gran = item.partition("/")
        out.append((method, gran or "layer"))
    return out


def run(args, argv: list[str]) -> str:
    from ..sampling import SamplingParams
    from ..spec import SpecParams

    methods = parse_methods(args.methods)
    for m, g in methods:      # validate before loading anything
        SpecParams(method=m, granularity=g)
    # The default mode first: the other's records compare their rate with it (`vs_default`).
    modes = [m for m in MODES if m in args.modes] if args.modes else \
        ["deterministic" if args.deterministic else "default"]
    from ..engine import resolve_device
    from ..loader import load_model
    loaded = load_model(args.model)     # the workload needs the tokenizer, the engine's size the workload
    on_gpu = resolve_device(args.device).type == "cuda"
    workload = build_workload(args, loaded.tokenizer, loaded.config, on_gpu)
    alone = args.alone if args.alone is not None else (4 if on_gpu else 0)
    records, vanilla, header = [], {}, {}
    runs = 2 * args.trace_cost if args.trace_cost > 0 else 1
    total = len(modes) * len(args.sampling) * len(methods) * \
        (len(workload.prompts) * runs + min(alone, workload.unique)) * workload.gen_tokens
    bar = common.progress_bar(total, f"e2e {workload.name}")
    bar.unit = "tok"
    compiles = common.TritonCompiles().install()
    for mode in modes:
        engine = engine_for(args, workload, loaded, deterministic=mode == "deterministic")
        parents = prefill_parents(engine, workload)
        traced = None
        if args.trace_cost > 0:
            traced = engine_for(args, workload, loaded, deterministic=mode == "deterministic", trace=True)
            traced = (traced, prefill_parents(traced, workload))
        if not header:     # the machine, the model and the bound: measured once, for every mode
            header, tuned = _header(args, engine, workload, loaded, modes)
            bound = header["bandwidth_bound"]
        for sampling_name in args.sampling:
            sampling = SamplingParams(max_tokens=workload.gen_tokens, ignore_eos=True, seed=0,
                                      **SAMPLINGS[sampling_name])
            for method, gran in methods:
                key = f"{method}/{gran}"
                setting = tuned.get(key, {})
                spec = SpecParams(method=method, granularity=gran, gamma=int(setting.get("gamma", args.gamma)),
                                  sparsity=float(setting.get("sparsity", args.sparsity)),
                                  min_budget=args.min_budget)
                bar.set_postfix_str(f"{mode} {sampling_name} {key}")
                stats = run_workload(engine, workload, sampling, spec, progress=bar.update, parents=parents,
                                     compiles=lambda: compiles.count)
                if method == "vanilla":
                    vanilla[mode, sampling_name] = stats
                rec = _record(mode, sampling_name, method, gran, spec, key in tuned, args, workload, stats,
                              vanilla.get((mode, sampling_name)), bound, records)
                if traced is not None:
                    rec["trace"] = trace_cost((engine, parents), traced, workload, sampling, spec, stats,
                                              args.trace_cost,
                                              dict(progress=bar.update, compiles=lambda: compiles.count))
                    rec["trace_cost"] = rec["trace"]["trace_cost"]
                if sampling_name == "greedy" and (mode, sampling_name) in vanilla:
                    base = vanilla[mode, sampling_name]
                    same = [a == b for a, b in zip(stats.outputs, base.outputs)]
                    rec["exact_match_vs_vanilla"] = sum(same) / len(same)
                    rec["divergences"] = divergences(engine, workload.prompts, stats.outputs, base.outputs)
                rec["invariant_config"] = invariant_launches(engine)
                if alone:
                    rec.update(alone_check(engine, workload, sampling, spec, stats.outputs, alone))
                    bar.update(min(alone, workload.unique) * workload.gen_tokens)
                records.append(rec)
                path = common.write_results(
                    "e2e", args.out, engine.device, argv, records, **header,
                    complete=len(records) == len(modes) * len(args.sampling) * len(methods))
        device = engine.device
        del engine, parents, traced
        common.free_device_memory()
    compiles.uninstall()
    bar.close()
    print_table(records, header, bound, device)
    print(f"wrote {path}")
    return path


def _header(args, engine, workload: Workload, loaded, modes) -> tuple[dict, dict]:
    """The result file's fields besides the records, and the tuned settings."""
    itemsize = engine.dtype.itemsize
    bound = bandwidth_bound(workload, loaded.config, read_weight_bytes(loaded.weights, itemsize),
                            itemsize, common.copy_bandwidth(engine.device))
    tuned, tuned_path = find_tuned(args.tuned, args.out, engine.config.name, engine.device)
    header = dict(
        model=engine.source, model_name=engine.config.name,
        dtype=str(engine.dtype).replace("torch.", ""), attention=engine.core.runner.attention,
        tuned_from=tuned_path, invariant_config_from=getattr(args, "invariant_config", None),
        cuda_graphs=engine.core.runner.graphs is not None,
        kernel_options=kernel_options(engine), linear_configs=_linear_configs(),
        bandwidth_bound=bound, modes=modes,
        workload=dict(name=workload.name, prompt_tokens=list(workload.prompt_range),
                      mean_context=bound["mean_context"], text=texts.corpus_info(),
                      instruction=INSTRUCTIONS[workload.name],
                      samplings={k: SAMPLINGS[k] for k in args.sampling},
                      sampling_source={k: SAMPLING_SOURCES[k] for k in args.sampling
                                       if k in SAMPLING_SOURCES}))
    return header, tuned


def _record(mode, sampling_name, method, gran, spec, tuned, args, workload, stats, base, bound,
            records) -> dict:
    default = next((r for r in records if r["mode"] == "default" and r["sampling"] == sampling_name
                    and r["method"] == method and r["granularity"] == (gran if method != "vanilla" else None)),
                   None)
    speculative = method != "vanilla"
    return dict(
        mode=mode, method=method, granularity=gran if speculative else None, workload=workload.name,
        sampling=sampling_name, batch=workload.batch, context=workload.max_context,
        prompt_tokens=list(workload.prompt_range), gen_tokens=workload.gen_tokens,
        requests=len(workload.prompts), gamma=spec.gamma if speculative else None,
        sparsity=spec.sparsity if speculative else None, min_budget=args.min_budget,
        tuned=tuned, tokens_per_s=stats.tokens_per_s,
        mean_acceptance_length=stats.mean_acceptance_length,
        per_position_acceptance=stats.per_position_acceptance,
        draft_ms=stats.draft_ms, select_ms=stats.select_ms, verify_ms=stats.verify_ms,
        iteration_ms=stats.iteration_ms,
        select_overhead=stats.select_ms / stats.iteration_ms if stats.iteration_ms else None,
        speedup_vs_vanilla=stats.tokens_per_s / base.tokens_per_s if base and base.tokens_per_s else None,
        vs_default=stats.tokens_per_s / default["tokens_per_s"]
        if mode != "default" and default and default["tokens_per_s"] else None,
        of_bound=stats.tokens_per_s / bound["tokens_per_s"],
        full_batch_steps=stats.full_steps, decode_steps=stats.decode_steps,
        graph_warmup_steps=stats.warmup_steps, phase_steps=stats.phase_steps,
        generated_tokens=stats.generated_tokens, chains=stats.chains, step_ms=stats.step_ms,
        host_gc=stats.gc, page_adjacency=stats.page_adjacency)


def trace_cost(untraced: tuple, traced: tuple, workload: Workload, sampling, spec, first: RunStats,
               rounds: int, run_args: dict) -> dict:
    """Untraced runs (`first` is one) and traced ones alternated `rounds` times (each side: an
    engine and its parents), so a slow spell of a shared machine hits both; the best rate of each
    side gives `trace_cost`, the decode time that recording adds over the untraced time."""
    plain, recorded = [first], []
    for r in range(rounds):
        if r:
            plain.append(run_workload(untraced[0], workload, sampling, spec, parents=untraced[1], **run_args))
        recorded.append(run_workload(traced[0], workload, sampling, spec, parents=traced[1], **run_args))
    best, best_traced = max(s.tokens_per_s for s in plain), max(s.tokens_per_s for s in recorded)
    return dict(rounds=rounds, tokens_per_s=[s.tokens_per_s for s in plain],
                tokens_per_s_traced=[s.tokens_per_s for s in recorded],
                trace_cost=best / best_traced - 1 if best_traced else None,
                same_tokens=all(s.outputs == first.outputs for s in plain + recorded),
                traced_iteration_ms=recorded[-1].iteration_ms, traced_chains=recorded[-1].chains)


def engine_for(args, workload: Workload, loaded, deterministic: bool | None = None, trace: bool = False):
    """An engine sized for the workload: the held parents (`prefill_parents`) and `batch`
    sequences at once, all their pages resident (and one more request, `alone_check`'s).
    `deterministic`: the batch-invariant mode (None: `--deterministic`); `trace`: recording every
    iteration's record."""
    from ..engine import Engine
    from ..options import EngineOptions, KernelOptions
    block = 16
    per_request = -(-(workload.max_context + GAMMA_SLACK) // block) + 1
    seqs = workload.unique + workload.batch
    if deterministic is None:
        deterministic = bool(getattr(args, "deterministic", False))
    kernels = KernelOptions(pdl=not getattr(args, "no_pdl", False),
                            invariant=invariant_config(args, loaded.config))
    opts = EngineOptions(block_size=block, num_blocks=per_request * (seqs + 1) + 8, trace=trace,
                         max_num_seqs=seqs, max_prefill_tokens=16384, attention=args.attention,
                         cuda_graphs="off" if args.eager else "auto", deterministic=deterministic,
                         kernels=kernels)
    return Engine(args.model, args.device, args.dtype, options=opts, loaded=loaded)


def invariant_config(args, config):
    """`--invariant-config` for a model of `config`'s attention shape (`InvariantConfig.from_file`;
    'latest': the newest `invariant-*-<device>.json` in `--out` with an entry for it), or the
    defaults."""
    from ..engine import resolve_device
    from ..options import InvariantConfig
    path = getattr(args, "invariant_config", None)
    if not path:
        return InvariantConfig()
    shape = (config.num_heads, config.num_kv_heads, config.head_dim)
    if path == "latest":
        tag = common.device_tag(resolve_device(args.device))
        for cand in sorted(glob.glob(os.path.join(args.out, f"invariant-*-{tag}.json")), reverse=True):
            try:
                return InvariantConfig.from_file(cand, *shape)
            except VegasError:
                continue
        raise InvalidRequestError(f"no invariant result in {args.out} for this device ({tag}) and "
                                  f"{shape[0]}/{shape[1]} heads of dim {shape[2]}")
    return InvariantConfig.from_file(path, *shape)


def model_linear_shapes(config) -> list[tuple[int, int, bool]]:
    """The (N, K, silu_mul) of a Llama-family layer's four fused products (`fused_linear`'s keys)."""
    c = config
    return [((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, c.hidden_size, False),
            (c.hidden_size, c.num_heads * c.head_dim, False),
            (c.intermediate_size, c.hidden_size, True),
            (c.hidden_size, c.intermediate_size, False)]


def invariant_launches(engine) -> dict | None:
    """The batch-invariant launches the engine ran (None outside that mode): the configuration as
    given (`InvariantConfig.record`: its fields and source), the attention launch it gives at this
    model's shape, and each product's and the head's launch (under Triton's interpreter, the
    interpreter's own, as there)."""
    from ..kernels.fused_linear import config_for, head_config
    from ..options import linear_key
    runner = engine.core.runner
    if not runner.kernels or not runner.model.deterministic:
        return None
    cfg, c = runner.options.kernels.invariant, engine.config
    table = cfg.linear_table()
    return dict(config=cfg.record(),
                attention=runner.model.backend.invariant_launch(c.head_dim, c.num_heads // c.num_kv_heads),
                linear={linear_key(s): list(config_for(*s, table)) for s in model_linear_shapes(c)},
                head=list(head_config(cfg.head)))


def kernel_options(engine) -> dict | None:
    """The kernel options the run used, as they took effect (None on the reference path)."""
    from dataclasses import asdict

    from ..kernels import pdl
    runner = engine.core.runner
    if not runner.kernels:
        return None
    opts = runner.options.kernels
    return dict(asdict(opts), pdl=pdl.active(engine.device, opts.pdl),
                rotary_epilogue=runner.model.rotary_in_qkv())


def print_table(records, header: dict, bound: dict, device) -> None:
    cols = ["mode", "sampling", "method", "gran.", "gamma", "sparsity", "tok/s", "x vanilla", "x default",
            "of bound %", "MAL", "draft ms", "verify ms", "select ms", "select %", "= vanilla", "max gap",
            "alone = batch"]
    rows = [[r["mode"], r["sampling"], r["method"], r["granularity"] or "-", r["gamma"], r["sparsity"],
             r["tokens_per_s"], r["speedup_vs_vanilla"], r["vs_default"], 100 * r["of_bound"],
             r["mean_acceptance_length"], r["draft_ms"], r["verify_ms"], r["select_ms"],
             None if r["select_overhead"] is None else 100 * r["select_overhead"],
             r.get("exact_match_vs_vanilla"),
             max((d["logit_gap"] for d in r.get("divergences") or []), default=None),
             r.get("alone_match")] for r in records]
    if any("trace" in r for r in records):     # --trace-cost
        cols += ["best tok/s", "traced tok/s", "trace cost %", "same tokens"]
        for row, r in zip(rows, records):
            t = r.get("trace") or {}
            row += [max(t["tokens_per_s"]) if t else None, max(t["tokens_per_s_traced"]) if t else None,
                    None if t.get("trace_cost") is None else 100 * t["trace_cost"], t.get("same_tokens")]
    r0 = records[0]
    common.print_table(f"e2e: {common.device_description(device)}, {r0['workload']} workload, batch "
                       f"{r0['batch']}, up to {r0['context']} tokens "
                       f"(mean {bound['mean_context']:.0f}), {r0['requests']} requests, "
                       f"{header['dtype']}, {header['attention']} attention; bandwidth bound "
                       f"{bound['tokens_per_s']:,.0f} tok/s at {bound['copy_TBps']:.3g} TB/s copy", cols, rows)
