"""What every benchmark shares: describing the machine, timing an engine run step by step, writing
the result file and printing a table.

A result file is one JSON object: `date`, `device` (in words), `command` (the exact command line),
`torch` (version), `python`, then whatever the benchmark adds (`model`, `workload`...) and its
`records`. Files are named `<kind>-<YYYY-MM-DD>-<device tag>.json`.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import json
import math
import os
import platform
import re
import shlex
import time
from dataclasses import dataclass

import torch

DEFAULT_OUT = os.path.join("bench", "results")


# -- the machine -------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@contextlib.contextmanager
def frozen_heap():
    """Measure with the heap as it is now out of the garbage collector's generations: collect
    the garbage there is, then `gc.freeze()` what is alive (the model, the imported libraries:
    millions of objects), so a full collection in the middle of a step no longer walks them (one
    stopped a step for 162 ms, bench/NOTES.md version 21). Undone on exit (`gc.unfreeze`), so
    objects that die later, cycles included, are collected again: a freeze inside the engine
    kept every engine of a test process alive for good. Where the heap is frozen already (the app's
    worker, whose live sweep measures through here) it stays frozen: `gc.unfreeze` has no undo of
    one freeze alone, and unfreezing would hand the app's whole heap back to the collector."""
    was_frozen = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not was_frozen:
            gc.unfreeze()


class TritonCompiles:
    """How many Triton kernels were compiled (or loaded from Triton's disk cache) since `install`:
    a step during which the count moves paid for a compile that no later step pays, so a
    benchmark leaves it out of the rate, as it leaves out the steps that captured a CUDA graph
    (one such compile once put SpecExtend at 37 ms a step: bench/NOTES.md,
    bench.common.TritonCompiles). Chains any hook already installed; `count` stays 0 where Triton
    is absent or interpreting (no compiles)."""

    def __init__(self):
        self.count = 0
        self._previous = None
        self._installed = False

    def _hook(self, *args, **kwargs):
        self.count += 1
        if self._previous is not None:
            return self._previous(*args, **kwargs)
        return None

    def install(self) -> "TritonCompiles":
        try:
            import triton
        except ImportError:
            return self
        runtime = triton.knobs.runtime
        self._previous, runtime.jit_post_compile_hook = runtime.jit_post_compile_hook, self._hook
        self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            import triton
            triton.knobs.runtime.jit_post_compile_hook = self._previous
            self._installed = False

    def __enter__(self) -> "TritonCompiles":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


def device_description(device: torch.device) -> str:
    """'cpu: Intel(R) Xeon(R) Processor, 2 threads' or 'cuda: NVIDIA H200'."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model()}, {torch.get_num_threads()} threads"


def device_tag(device: torch.device) -> str:
    """Short name for file names: 'cpu', or the GPU model ('NVIDIA H200' -> 'h200')."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    name = re.sub(r"^(NVIDIA|AMD)\s+", "", name, flags=re.I)
    words = re.findall(r"[a-z0-9]+", name.lower())
    return "-".join(words[:2]) or "cuda"


def require_cuda(device: torch.device, what: str, cpu_check: str) -> None:
    """GPU-only benchmarks end with one clear error on a CPU (exit status 2), naming where the
    code they time is checked there instead."""
    if device.type != "cuda":
        from ..errors import InvalidRequestError
        raise InvalidRequestError(f"the {what} benchmark needs a CUDA GPU ({cpu_check})")


def copy_bandwidth(device: torch.device) -> float:
    """TB/s of a device-to-device copy, bytes read plus written: the ceiling a bandwidth-bound
    kernel or decoder is held to. On a GPU 1 GiB, timed eagerly with events (launch cost is nothing
    next to 0.5 ms). Not from a graph replay: captured into a CUDA graph, the copy becomes a memcpy
    node that ran at 2.7 TB/s on the H200 against 4.25 eagerly (the copy engines instead of the
    SMs), which is not the ceiling a kernel is held to. On a CPU 128 MiB, the median of 5 copies
    on the wall clock."""
    device = torch.device(device)
    if device.type == "cuda":
        import triton
        src = torch.randn(1 << 28, device=device)          # 1 GiB of float32
        dst = torch.empty_like(src)
        torch.cuda.synchronize()
        us = 1e3 * triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    else:
        src = torch.randn(1 << 25)
        dst = torch.empty_like(src)
        dst.copy_(src)                                    # touch the pages once
        times = []
        for _ in range(5):
            t = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t)
        us = 1e6 * sorted(times)[len(times) // 2]
    tbps = 2 * src.numel() * 4 / (us * 1e-6) / 1e12
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return tbps


def free_device_memory() -> None:
    """After an engine is dropped: its pool and graphs go (collected, then the GPU's cache emptied)
    before the next one is built."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- timing an engine run ------------------------------------------------------------------------
@dataclass
class RunTiming:
    """One batch through the engine. Decode throughput is `generated_tokens / decode_s`: every
    token the batch generated over the wall time of the decode steps (prefill steps excluded)."""
    results: list
    prefill_s: float
    decode_s: float
    prefill_steps: int
    decode_steps: int

    @property
    def generated_tokens(self) -> int:
        return sum(r.generated_tokens for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0


def timed_generate(engine, prompts: list[list[int]], sampling, spec=None, on_step=None) -> RunTiming:
    """Run `prompts` to completion, timing every engine step. A prefill step emits no events (the
    core returns nothing for it); a decode step emits one per running request. The engine
    prefills every waiting prompt before it decodes, so with `max_num_seqs >= len(prompts)` and a
    big enough KV pool the decode steps run the whole batch."""
    reqs = [engine.add(p, sampling, spec) for p in prompts]
    prefill_s = decode_s = 0.0
    prefill_steps = decode_steps = 0
    sync(engine.device)
    while any(not r.finished for r in reqs):
        t = time.perf_counter()
        events = engine.step()
        sync(engine.device)
        dt = time.perf_counter() - t
        if events:
            decode_s += dt
            decode_steps += 1
        else:
            prefill_s += dt
            prefill_steps += 1
        if on_step is not None:
            on_step(events)
    results = [engine.result(r) for r in reqs]
    for r in reqs:
        engine._trackers.pop(r.request_id, None)
    return RunTiming(results, prefill_s, decode_s, prefill_steps, decode_steps)


# -- results -------------------------------------------------------------------------------------
def command_line(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "vegas_core.bench", *argv])


def write_results(kind: str, out_dir: str, device: torch.device, argv: list[str], records: list[dict],
                  command: str | None = None, **extra) -> str:
    """Write `<out_dir>/<kind>-<date>-<tag>.json` and return its path. `command` replaces the
    bench command built from `argv` (a probe script names itself)."""
    date = datetime.date.today().isoformat()
    doc = {"date": date, "device": device_description(device), "command": command or command_line(argv),
           "torch": torch.__version__, "python": platform.python_version(), **extra,
           "records": records}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{kind}-{date}-{device_tag(device)}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_finite(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    return path


def _finite(x):
    """NaN/inf have no JSON spelling: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


# -- output --------------------------------------------------------------------------------------
def fmt(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    """A rich table when rich is installed, plain aligned text otherwise."""
    cells = [[fmt(c) for c in row] for row in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(columns)]
        print(title)
        print("  ".join(h.rjust(w) for h, w in zip(columns, widths)))
        for r in cells:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        return
    table = Table(title=title)
    for h in columns:
        table.add_column(h, justify="right")
    for r in cells:
        table.add_row(*r)
    console = Console()
    if not console.is_terminal:  # a pipe or a file: don't squeeze the table into 80 columns
        console = Console(width=240)
    console.print(table)


def progress_bar(total: int, desc: str):
    """A tqdm bar (to stderr) when tqdm is installed, else a do-nothing stand-in."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="run", dynamic_ncols=True)


class _NoBar:
    n = total = 0

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s, refresh=True):
        pass

    def close(self):
        pass


def add_model_arguments(p, attention: bool = True) -> None:
    """The options every benchmark shares: which model, where, in what precision (and, unless the
    benchmark runs both attention paths itself, which one)."""
    p.add_argument("--model", default=None, help="GGUF file, Hugging Face directory or packaged model name "
                   "(qwen2.5-coder-0.5b, gemma-3-270m; default: embedded SmolLM2)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's own choice, usually one per core)")
    p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--deterministic", action="store_true",
                   help="batch-invariant kernels (EngineOptions.deterministic): the same bits whatever the "
                        "batch, at a cost in throughput; the CPU reference path has no such mode")
    if not attention:
        return
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graphs: every GPU forward runs eagerly (debugging)")
    p.add_argument("--attention", default="auto", choices=["auto", "reference", "triton"],
                   help="auto: Triton kernels on a GPU, PyTorch reference on a CPU; reference: force the reference (debugging)")
