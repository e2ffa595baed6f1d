"""Where does a GPU decode iteration go? (on the device, after stage.sh:
`python3 scripts/device/profile_step.py [method] [batch] [context] [--eager] [--gamma N]
[--sparsity S] [--multi-step N] [--temperature T --top-p P] [--trace FILE]`). Prefills a batch of
real-text prompts, runs a few iterations so every CUDA graph is captured, then profiles three with
torch.profiler (CUPTI sees the kernels inside graph replays) and prints:
- the top GPU kernels by total time and the top host operators;
- the iteration's wall time against the GPU's busy time;
- where the GPU sat idle: each idle microsecond is charged to the innermost host phase running
  at that moment (the engine's phases are labelled here with `record_function`, so the engine
  itself carries no profiling code). That says which host work to overlap or remove."""
import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from vegas_core import engine as engine_mod
from vegas_core import engine_core, graphs, scheduler
from vegas_core.bench import texts
from vegas_core.engine import Engine
from vegas_core.engine_core import EngineOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams


# The host phases to label: (owner, method name).
PHASES = [(engine_mod.Engine, "step"), (engine_mod._Tracker, "update"),
          (engine_core.EngineCore, "_draft"), (engine_core.EngineCore, "_verify"),
          (engine_core.EngineCore, "_accept_all"), (engine_core.EngineCore, "_select_all"),
          (engine_core.EngineCore, "_emit"), (engine_core.EngineCore, "_wait"),
          (engine_core.EngineCore, "_run_ahead"), (engine_core.EngineCore, "_launch_early"),
          (engine_core.EngineCore, "_keep_early"), (engine_core.EngineCore, "_launch_sampled"),
          (engine_core.EngineCore, "_decode_chained"), (scheduler.Scheduler, "schedule"),
          (graphs.GraphRunner, "_fill"), (graphs.GraphRunner, "run"), (graphs.GraphRunner, "run_chain"),
          (graphs._Graph, "replay")]


def label(owner, name):
    fn = getattr(owner, name)

    def wrapped(*a, **k):
        with record_function(f"{owner.__name__}.{name}"):
            return fn(*a, **k)
    setattr(owner, name, wrapped)


def idle_report(trace_path: str, iterations: int) -> None:
    """GPU-idle time inside the profiled steps, charged to the innermost labelled host phase."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    labels = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("cat") == "user_annotation" and "." in e["name"]),
                    key=lambda x: (x[0], -x[1]))          # outer before inner at equal starts
    steps = [(s, t) for s, t, n in labels if n == "Engine.step"]
    if not gpu or not steps:
        print("no GPU or step events in the trace")
        return
    lo, hi = min(s for s, _ in steps), max(t for _, t in steps)
    grid = np.arange(lo, hi, 2.0)                  # 2 us samples over the profiled steps
    busy = np.zeros(grid.shape, dtype=bool)
    for s, t in gpu:
        busy[np.searchsorted(grid, s):np.searchsorted(grid, t)] = True
    owner = np.full(grid.shape, -1)
    depth = np.full(grid.shape, -np.inf)
    for k, (s, t, _) in enumerate(labels):         # innermost: the label that started last
        a, b = np.searchsorted(grid, s), np.searchsorted(grid, t)
        take = depth[a:b] <= s
        owner[a:b][take], depth[a:b][take] = k, s
    idle = ~busy
    names = [n for _, _, n in labels]
    charge: dict[str, float] = {}
    for k in owner[idle]:
        name = names[k] if k >= 0 else "(between steps)"
        charge[name] = charge.get(name, 0.0) + 2.0
    cpu: dict[str, float] = {}
    for s, t, n in labels:
        cpu[n] = cpu.get(n, 0.0) + (t - s)
    span = (hi - lo) / iterations
    print(f"GPU idle {idle.sum() * 2.0 / iterations / 1e3:.2f} ms of {span / 1e3:.2f} ms per iteration "
          f"(busy {busy.mean():.1%}); idle charged to the host phase running then, per iteration:")
    for name, us in sorted(charge.items(), key=lambda kv: -kv[1]):
        print(f"  {name:34s} idle {us / iterations / 1e3:7.3f} ms   host {cpu.get(name, 0) / iterations / 1e3:7.3f} ms")
    gap_report(gpu, labels, lo, hi, iterations)


def gap_report(gpu, labels, lo, hi, iterations: int) -> None:
    """The idle time as gaps between the GPU's busy intervals (kernels merged where they
    overlap): many short gaps are launch latency between kernels (inside a graph too), a few long
    ones are the GPU waiting for the host. Each long gap is named by the innermost host phase
    running when it began."""
    merged = []
    for s, t in gpu:
        if t <= lo or s >= hi:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], t)
        else:
            merged.append([s, t])
    gaps = [(b[0] - a[1], a[1]) for a, b in zip(merged, merged[1:])]
    bins = [(0, 2), (2, 5), (5, 20), (20, 100), (100, float("inf"))]
    print(f"GPU gaps per iteration ({len(merged) / iterations:.0f} busy intervals an iteration):")
    for a, b in bins:
        sel = [g for g, _ in gaps if a <= g < b]
        print(f"  {a:>4}-{b:<5} us  {len(sel) / iterations:7.1f} gaps  {sum(sel) / iterations / 1e3:7.3f} ms")
    for g, at in sorted(gaps, reverse=True)[:12]:
        inner = [n for s, t, n in labels if s <= at < t]
        print(f"  gap {g:8.1f} us at +{(at - lo) / 1e3:8.3f} ms  host in {' > '.join(inner[-3:]) or '-'}")


ap = argparse.ArgumentParser()
ap.add_argument("method", nargs="?", default="vanilla")
ap.add_argument("batch", nargs="?", type=int, default=64)
ap.add_argument("context", nargs="?", type=int, default=6000)
ap.add_argument("--gamma", type=int, default=6)
ap.add_argument("--sparsity", type=float, default=0.07)
ap.add_argument("--multi-step", type=int, default=8)
ap.add_argument("--eager", action="store_true")
ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
ap.add_argument("--top-p", type=float, default=1.0)
ap.add_argument("--trace", default=None, help="where to write the chrome trace (default: a temp file)")
opt = ap.parse_args()
method, batch, context, gamma = opt.method, opt.batch, opt.context, opt.gamma
graphs_choice = "off" if opt.eager else "auto"
for owner, name in PHASES:
    label(owner, name)
engine = Engine(os.environ.get("VEGAS_DEVICE_MODEL"), "cuda", "bfloat16",
                options=EngineOptions(num_blocks=batch * (context // 16 + 24), max_num_seqs=batch,
                                      max_prefill_tokens=16384, cuda_graphs=graphs_choice,
                                      multi_step=opt.multi_step))
tok = engine.tokenizer
spec = SpecParams(method=method, gamma=gamma, sparsity=opt.sparsity, min_budget=16)
for i in range(batch):
    engine.add(texts.long_text(context, tok, offset=i * context),
               SamplingParams(max_tokens=200, ignore_eos=True, temperature=opt.temperature, top_p=opt.top_p,
                              seed=i), spec)
while not any(engine.step()):      # prefill steps emit nothing
    pass
for _ in range(4):                  # captures, compiles, first selections
    engine.step()
# No synchronisation around the measured steps: in steady state the next iteration's chain is
# already running when a step starts (run-ahead), and a step ends when it returns.
t = time.perf_counter()
n = sum(len(e.new_token_ids) for _ in range(3) for e in engine.step())
wall = (time.perf_counter() - t) / 3
print(f"{method} b{batch} ctx~{context} gamma {gamma} sparsity {opt.sparsity} graphs={graphs_choice} "
      f"temperature {opt.temperature} top-p {opt.top_p}: "
      f"{wall * 1e3:.2f} ms per iteration, {n / 3 / wall:.0f} tokens/s unprofiled")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
events = prof.key_averages()
# Kernels' own time (the labels' GPU ranges left out), over the three steps and the chain the
# last one launched ahead: about three iterations' work.
gpu = sum(getattr(e, "self_device_time_total", 0) for e in events if "." not in e.key) / 3
print(f"GPU kernel time per iteration {gpu / 1e3:.2f} ms (of {wall * 1e3:.2f} ms wall)")
print(events.table(sort_by="device_time_total", row_limit=22, max_name_column_width=70))
print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=70))
trace = opt.trace or os.path.join(tempfile.gettempdir(), f"profile-{method}.json")
prof.export_chrome_trace(trace)
idle_report(trace, 3)
