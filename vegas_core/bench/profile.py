"""`python -m vegas_core.bench profile`: where a decode iteration's time goes, kernel by kernel.

The e2e workload (same prompts, tuned settings, engine) runs each method; once the batch is full
and warmed up (graphs captured, kernels compiled), `--steps` engine steps run under
`torch.profiler`. Per method: the wall time of those steps, the GPU's busy time (the union of its
kernels' intervals; the rest is the GPU waiting on the host), and every kernel's total time, launch
count and share of the busy time, largest first. Kernels replayed from CUDA graphs are recorded
like eager ones. With programmatic dependent launch (Hopper's default) a kernel starts while the one
before it runs and waits for it, so its time includes that wait: `--no-pdl` for each kernel's own.
On a CPU the records are the operators' own CPU time instead.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

from . import common, e2e

WARM_STEPS = 3      # decode steps at full batch before profiling (captures and compiles happen there)


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    e2e.add_workload_arguments(p)
    p.add_argument("--methods", nargs="+", default=["vanilla", "stream", "vegas"],
                   help="method[/granularity] list (default: vanilla stream vegas)")
    p.add_argument("--tuned", nargs="+", default=None, metavar="FILE",
                   help="tune result file(s) (default: the latest for this model and device)")
    p.add_argument("--gamma", type=int, default=6, help="gamma without a tuned setting (default: 6)")
    p.add_argument("--sparsity", type=float, default=0.07, help="sparsity without a tuned setting (default: 0.07)")
    p.add_argument("--sampling", default="greedy", choices=list(e2e.SAMPLINGS),
                   help="the e2e sampling settings (default: greedy)")
    p.add_argument("--steps", type=int, default=4,
                   help="engine steps that emit tokens profiled per method (default: 4)")
    p.add_argument("--no-pdl", action="store_true",
                   help="launch without programmatic dependent launch: with it a kernel starts before "
                        "the one it depends on ends, and its time includes that wait")
    p.add_argument("--top", type=int, default=12, help="kernels printed per method (default: 12)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def run(args, argv: list[str]) -> str:
    from ..engine import resolve_device
    from ..loader import load_model
    from ..sampling import SamplingParams
    from ..spec import SpecParams
    methods = e2e.parse_methods(args.methods)
    for m, g in methods:
        SpecParams(method=m, granularity=g)
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    loaded = load_model(args.model)
    on_gpu = resolve_device(args.device).type == "cuda"
    workload = e2e.build_workload(args, loaded.tokenizer, loaded.config, on_gpu)
    engine = e2e.engine_for(args, workload, loaded)
    tuned, tuned_path = e2e.find_tuned(args.tuned, args.out, engine.config.name, engine.device)
    parents = e2e.prefill_parents(engine, workload)
    sampling = SamplingParams(max_tokens=workload.gen_tokens, ignore_eos=True, seed=0, **e2e.SAMPLINGS[args.sampling])
    records = []
    for method, gran in methods:
        setting = tuned.get(f"{method}/{gran}", {})
        spec = SpecParams(method=method, granularity=gran, gamma=int(setting.get("gamma", args.gamma)),
                          sparsity=float(setting.get("sparsity", args.sparsity)), min_budget=args.min_budget)
        rec = profile_method(engine, workload, parents, sampling, spec, args.steps)
        records.append(dict(method=method, granularity=gran if method != "vanilla" else None,
                            gamma=spec.gamma if method != "vanilla" else None,
                            sparsity=spec.sparsity if method != "vanilla" else None,
                            tuned=f"{method}/{gran}" in tuned, sampling=args.sampling, batch=workload.batch, **rec))
    path = common.write_results("profile", args.out, engine.device, argv, records, model=engine.source,
                                model_name=engine.config.name, tuned_from=tuned_path, pdl=not args.no_pdl,
                                workload=dict(name=workload.name, prompt_tokens=list(workload.prompt_range),
                                              gen_tokens=workload.gen_tokens))
    for r in records:
        title = (f"{r['method']}: {r['steps']} steps, {r['tokens']} tokens in {r['wall_ms']:.1f} ms, "
                 f"GPU busy {r['busy_ms']:.1f} ms ({100 * r['busy_share']:.0f} %)" if r["busy_ms"] is not None else
                 f"{r['method']}: {r['steps']} steps, {r['tokens']} tokens in {r['wall_ms']:.1f} ms (CPU operators)")
        common.print_table(title, ["kernel", "ms", "calls", "% of busy"],
                           [[k["name"][:70], k["ms"], k["calls"], 100 * k["share"]] for k in r["kernels"][:args.top]])
    print(f"wrote {path}")
    return path


def profile_method(engine, workload, parents, sampling, spec, steps: int) -> dict:
    """Fork the workload's requests, step until the batch is full and `WARM_STEPS` decode steps
    have run, then profile `steps` steps; the requests are aborted afterwards."""
    import time

    from torch.profiler import ProfilerActivity, profile
    core = engine.core
    reqs = [engine.fork(parents[i % len(parents)], sampling, spec) for i in range(workload.batch)]
    warm = 0
    while warm < WARM_STEPS:
        if all(r.finished for r in reqs):
            raise SystemExit(f"{spec.method}: the requests finished before {WARM_STEPS} warm steps; "
                             f"raise --gen-tokens")
        running = sum(not r.held for r in core.scheduler.running)
        if engine.step() and running >= workload.batch:
            warm += 1
    on_gpu = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    tokens = emitted = 0
    common.sync(engine.device)
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        while emitted < steps:          # a step whose chain is still running emits nothing
            if all(r.finished for r in reqs):
                raise SystemExit(f"{spec.method}: the requests finished while profiled; raise --gen-tokens")
            n = sum(len(e.new_token_ids) for e in engine.step())
            tokens += n
            emitted += n > 0
        common.sync(engine.device)
        wall = time.perf_counter() - t
    for r in reqs:
        engine.abort(r.request_id)          # frees its pages; the parents stay for the next method
    kernels, busy = kernel_times(prof.events(), on_gpu)
    return dict(steps=steps, tokens=tokens, wall_ms=1e3 * wall, busy_ms=busy,
                busy_share=busy / (1e3 * wall) if busy is not None else None, kernels=kernels)


def kernel_times(events, on_gpu: bool) -> tuple[list[dict], float | None]:
    """[{name, ms, calls, share}] largest first, and the GPU's busy ms (None on a CPU, where the
    operators' self CPU time is aggregated instead)."""
    from torch.autograd import DeviceType
    total, calls, spans = defaultdict(float), defaultdict(int), []
    for ev in events:
        if on_gpu:
            if ev.device_type != DeviceType.CUDA:
                continue
            us = ev.time_range.elapsed_us()
            spans.append((ev.time_range.start, ev.time_range.end))
        else:
            us = ev.self_cpu_time_total
        total[ev.name] += us
        calls[ev.name] += 1
    busy = _union_us(spans) / 1e3 if on_gpu else None
    denom = (busy * 1e3 if on_gpu else sum(total.values())) or 1.0
    rows = [dict(name=n, ms=us / 1e3, calls=calls[n], share=us / denom) for n, us in total.items()]
    return sorted(rows, key=lambda r: r["ms"], reverse=True), busy


def _union_us(spans: list[tuple[float, float]]) -> float:
    out, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if a > end:
            out += b - a
            end = b
        elif b > end:
            out += b - end
            end = b
    return out
