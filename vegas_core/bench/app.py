"""`python -m vegas_core.bench app`: the app against the engine it drives, in one run.

The engine alone (`EngineAlone`: warmed up, graphs captured, kernels compiled; the heap frozen, as
the app's worker freezes it once ready) streams one prompt at batch 1 and generates `--clients`
prompts at once; `python app.py` runs beside it on the same device, warmed up the same way (one
request, then all clients at once), and the same prompts stream through its `stream_tokens` API with
gradio_client `Client`s, read as scripts read them (`vegas_studio_app.client.stream_tokens`): one
client (`app_1`, a new `Client`), then all clients at once (`app_n`), each in a process of its own
with its own `Client` (its own session, as separate users are; `vegas_studio_app.load_clients`), and
again with the page's own protocol (`app_n_page`: `client.page_stream`, what a browser tab sends).
The clients connect and open their sessions first, then submit together (users open the page before
they press Generate; the one-client runs use a new session). Each of `--repeats` rounds measures the
engine alone, then the app, back to back (a shared host's speed drifts over minutes), and each ratio
is the median of the rounds' ratios. Then a second request right after a first on one `Client`
(`app_1_shared_client`, as a script does). Before all that, the engine alone at batch 1 recording a
trace, as the app does (`engine_1_trace`).

Per client: tokens/s over the decode (the tokens after the first token event over the time since
it), time to first token from the submit (`engine_ttft_s`: until the engine emitted it; `api_s`:
until the app's handler started; `accept_s`: until the engine took the request in), and the largest
gap between events, with where each event was on the server (`t_engine`: the engine emitted it,
`t_sent`: the API yielded it) so a gap can be placed: engine, hand-over, or transport. Clients
together: all their tokens over the time from the first submit to the last token. Each kind is
reported by its median run. `ratio` fields: app / engine at the same batch, the median of the
rounds' (each round's in `ratios`). Greedy, chat prompts of `--prompt-tokens` tokens of real text,
`--max-tokens` generated (both stop at the same end-of-sequence token, if one comes first).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from . import common, texts

INSTRUCTION = "Summarise what the following source file provides:\n\n"


def chat_prompts(tokenizer, n: int, prompt_tokens: int) -> list[str]:
    """`n` different prompts: the instruction, then `prompt_tokens` tokens of real text each."""
    return [INSTRUCTION + tokenizer.decode(texts.long_text(prompt_tokens, tokenizer, offset=i * prompt_tokens))
            for i in range(n)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--methods", nargs="+", default=["vanilla", "stream", "vegas"])
    p.add_argument("--clients", type=int, default=8, help="clients at once in the second phase (default: 8)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="tokens of text per prompt (default: 512)")
    p.add_argument("--max-tokens", type=int, default=256, help="generated tokens per request (default: 256)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measurements of each kind; the median (by tokens/s) is reported, all rates kept (default: 3)")
    p.add_argument("--soak", type=float, default=0, metavar="SECONDS",
                   help="then this long: --clients clients streaming continuously, one aborting a request "
                        "every few seconds; checks every stream, the KV pool and the app's memory (default: off)")
    p.add_argument("--engine-in-process", action="store_true",
                   help="start the app with its engine on a thread of the server's process (app.py's flag), "
                        "not in a process of its own")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def run(args, argv: list[str]) -> str:
    from ..engine import resolve_device
    from ..loader import load_model
    from ..spec import SpecParams
    for m in args.methods:
        SpecParams(method=m)       # validate before loading anything
    device = resolve_device(args.device)
    loaded = load_model(args.model)
    tok = loaded.tokenizer
    prompts = chat_prompts(tok, args.clients, args.prompt_tokens)
    records = []
    traced = EngineAlone(args, loaded, prompts, trace=True)
    traced_1 = {m: traced.median_alone(m) for m in args.methods}
    traced.close()
    with EngineAlone(args, loaded, prompts) as engine, AppServer(args) as app:
        for method in args.methods:
            engine.warm(method)
            app.stream(prompts[0], method)                       # warm-up: graphs, kernels, at batch 1
            app.together(prompts, method)                        # and at the batch sizes clients make
            # Each repeat measures the engine alone, then the app, back to back, and a ratio is the
            # median of the repeats' ratios: on a shared host the speed drifts over minutes.
            rounds = [engine.then_app(app, method) for _ in range(max(1, args.repeats))]
            client = app.new_client()
            app.stream(prompts[0], method, client)
            shared = app.stream(prompts[0], method, client)      # right after another on one Client
            pick = {k: _median([r[k] for r in rounds]) for k in ("engine_1", "app_1", "engine_n", "app_n", "app_n_page")}
            records.append(dict(
                method=method, max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
                engine_1=pick["engine_1"], engine_1_trace=traced_1[method], engine_n=pick["engine_n"],
                app_1=pick["app_1"], app_1_shared_client=shared, app_n=pick["app_n"], app_n_page=pick["app_n_page"],
                app_idle_cpu_s=[r["app_idle_cpu_s"] for r in rounds],
                **{f"ratio_{k}": _median_of([r[f"ratio_{k}"] for r in rounds]) for k in ("1", "n", "n_page")},
                **{f"ratios_{k}": [r[f"ratio_{k}"] for r in rounds] for k in ("1", "n", "n_page")}))
        soak = app.soak(prompts, args.methods, args.soak) if args.soak > 0 else None
    path = common.write_results("app", args.out, device, argv, records, model=loaded.source,
                                clients=args.clients, soak=soak, deterministic=args.deterministic,
                                engine="in the server's process" if args.engine_in_process else "own process",
                                client_processes=True, interleaved=True)
    cols = ["method", "engine b=1 tok/s", "traced", "app 1 client", "ratio", "TTFT ms", "max gap ms",
            "shared Client: TTFT ms",
            f"engine b={args.clients}", f"app {args.clients} clients", "ratio", "page protocol", "ratio",
            "first token ms: engine", "app"]
    rows = [[r["method"], r["engine_1"]["tokens_per_s"], r["engine_1_trace"]["tokens_per_s"],
             r["app_1"]["tokens_per_s"], r["ratio_1"],
             _ms(r["app_1"]["ttft_s"]), _ms(r["app_1"]["max_gap_s"]),
             _ms(r["app_1_shared_client"]["ttft_s"]), r["engine_n"]["tokens_per_s"],
             r["app_n"]["tokens_per_s"], r["ratio_n"], r["app_n_page"]["tokens_per_s"], r["ratio_n_page"],
             _ms(r["engine_n"]["ttft_s"]), _ms(max(filter(None, r["app_n"]["per_client_engine_ttft_s"]), default=None))]
            for r in records]
    common.print_table(f"app vs engine: {common.device_description(device)}, {args.prompt_tokens}-token "
                       f"prompts, {args.max_tokens} tokens, greedy", cols, rows)
    if soak is not None:
        print(f"soak {args.soak:.0f} s: {soak['streams_ok']} streams checked, {soak['aborted']} aborted, "
              f"{soak['bad']} bad; pool free {soak['pool_free_end']} of {soak['pool_blocks']}; app RSS "
              f"{soak['rss_mb'][0]:.0f} -> {soak['rss_mb'][-1]:.0f} MB (server {soak['rss_server_mb'][0]:.0f} -> "
              f"{soak['rss_server_mb'][-1]:.0f}, engine {soak['rss_engine_mb'][0]:.0f} -> "
              f"{soak['rss_engine_mb'][-1]:.0f}); GPU memory {soak['gpu_mb'][0]} -> "
              f"{soak['gpu_mb'][-1]} MB")
    print(f"wrote {path}")
    return path


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def _ratio(a, b):
    return a / b if a and b else None


class EngineAlone:
    """The engine by itself, warmed up, on the benchmark's prompts and the app API's settings, with
    the heap frozen as the app's worker freezes it once ready: `alone` streams one prompt at batch 1
    (tokens/s from first to last token), `batch` generates every prompt at once (the batch's tokens
    over its wall time; `ttft_s`: from the call to its first token; `steps`: the engine's steps).
    `trace`: recording a trace, as the app does."""

    def __init__(self, args, loaded, prompts: list[str], trace: bool = False):
        from ..engine import Engine
        from ..options import EngineOptions
        from ..sampling import SamplingParams
        self.args, self.prompts = args, prompts
        self.sampling = SamplingParams(max_tokens=args.max_tokens)
        opts = EngineOptions(max_num_seqs=max(16, len(prompts)), kv_cache_bytes=4 << 30, trace=trace,
                             attention=args.attention, cuda_graphs="off" if args.eager else "auto",
                             deterministic=args.deterministic)
        self.engine = Engine(args.model, args.device, args.dtype, options=opts, loaded=loaded)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        del self.engine
        common.free_device_memory()

    @staticmethod
    def spec(method: str):
        from ..spec import SpecParams
        return SpecParams(method=method, gamma=4, sparsity=0.07, min_budget=16)   # the app API's settings

    def warm(self, method: str, batch: bool = True) -> None:
        if batch:
            self.engine.generate(self.prompts, self.sampling, self.spec(method), chat=True)
        for _ in self.engine.stream(self.prompts[0], self.sampling, self.spec(method), chat=True):
            pass

    def alone(self, method: str) -> dict:
        from vegas_studio_app.load_clients import decode_rate
        stamps, counts = [], []
        with common.frozen_heap():
            for ev in self.engine.stream(self.prompts[0], self.sampling, self.spec(method), chat=True):
                if ev.new_token_ids:
                    stamps.append(time.perf_counter())
                    counts.append(len(ev.new_token_ids))
        return dict(tokens=sum(counts), tokens_per_s=decode_rate(counts, stamps))

    def batch(self, method: str) -> dict:
        first = []        # when the first token came out: the start the app's clients also pay

        def seen(events):
            if not first and any(ev.new_token_ids for ev in events):
                first.append(time.perf_counter())
        with common.frozen_heap():
            t, t_wall = time.perf_counter(), time.time()
            res = self.engine.generate(self.prompts, self.sampling, self.spec(method), chat=True, progress=seen)
            wall = time.perf_counter() - t
        total = sum(r.generated_tokens for r in res)
        return dict(tokens=total, tokens_per_s=total / wall, wall_s=wall, ttft_s=first[0] - t if first else None,
                    steps=step_timeline(self.engine.core.recent_steps(), t_wall, t_wall + wall))

    def median_alone(self, method: str) -> dict:
        """Warmed up, then `alone` measured `--repeats` times: the median run."""
        self.warm(method, batch=False)
        return _median([self.alone(method) for _ in range(max(1, self.args.repeats))])

    def then_app(self, app: "AppServer", method: str) -> dict:
        """One round: the engine alone, then the app, at batch 1 and at batch n, and their ratios.
        The app's processes and its clients are stopped while the engine alone runs: an idle Gradio
        server still polls its queue (every 1 ms on a GPU, 10 ms beside a CPU engine), which would
        slow the reference. `app_idle_cpu_s`: what they took meanwhile (0 when stopped)."""
        with app.stopped() as pids:
            cpu0 = _cpu_s(pids)
            e1, en = self.alone(method), self.batch(method)
            idle_cpu = round(_cpu_s(pids) - cpu0, 3)
        a1 = app.stream(self.prompts[0], method)
        an, ap = app.together(self.prompts, method), app.together(self.prompts, method, page=True)
        return dict(engine_1=e1, engine_n=en, app_1=a1, app_n=an, app_n_page=ap, app_idle_cpu_s=idle_cpu,
                    ratio_1=_ratio(a1["tokens_per_s"], e1["tokens_per_s"]),
                    ratio_n=_ratio(an["tokens_per_s"], en["tokens_per_s"]),
                    ratio_n_page=_ratio(ap["tokens_per_s"], en["tokens_per_s"]))


def _median(runs: list[dict]) -> dict:
    """The run with the median tokens/s, with every run's rate in `runs_tokens_per_s` (one
    gradio_client stream's end can be late by its reader's 50 ms sleep)."""
    runs = sorted(runs, key=lambda r: r["tokens_per_s"] or 0)
    return dict(runs[len(runs) // 2], runs_tokens_per_s=[r["tokens_per_s"] for r in runs])


def _median_of(values: list) -> float | None:
    """The median of the values that are not None (of an even count, the mean of the middle two)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


class AppServer:
    """`python app.py` on a free port for the benchmark's model and device, and `--clients`
    client processes for it."""

    def __init__(self, args):
        self.args = args

    def __enter__(self):
        import gradio_client  # noqa: F401  (missing, it says so now, not as an app that never answers)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        cmd = [sys.executable, os.path.join(root, "app.py"), "--port", str(self.port),
               "--concurrency", str(max(8, self.args.clients)), "--queue-size", str(4 * self.args.clients)]
        for flag in ("model", "device", "dtype"):
            if getattr(self.args, flag):
                cmd += [f"--{flag}", getattr(self.args, flag)]
        if self.args.eager:
            cmd.append("--eager")
        if getattr(self.args, "engine_in_process", False):
            cmd.append("--engine-in-process")
        deterministic = getattr(self.args, "deterministic", None)
        if deterministic is not None:      # the app's own default otherwise
            cmd.append("--deterministic" if deterministic else "--no-deterministic")
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False"))
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"app.py did not start:\n{self.log.read()[-4000:]}")
            try:
                if self.new_client().predict(api_name="/pool").get("state") == "ready":
                    break
            except Exception:    # not serving yet, or the model still loading
                pass
            time.sleep(1)
        from vegas_studio_app.client import stream_tokens_fn_index
        from vegas_studio_app.load_clients import ClientProcesses
        self.clients = ClientProcesses(self.url, self.args.clients, self.args.max_tokens,
                                       stream_tokens_fn_index(self.url))
        return self

    @contextlib.contextmanager
    def stopped(self):
        """The app's processes and the client processes stopped (SIGSTOP), continued on exit;
        yields their pids."""
        pids = _process_tree(self.proc.pid) + [p.pid for p in self.clients.procs]
        _signal(pids, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5
            while not all(_state(p) in "TtZX" for p in pids):   # stopped, or exited (zombie, gone: "")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the app's processes did not stop: states "
                                       f"{[(p, _state(p)) for p in pids]}")
                time.sleep(0.01)
            yield pids
        finally:
            _signal(pids, signal.SIGCONT)

    def new_client(self):
        from vegas_studio_app.load_clients import new_client
        return new_client(self.url, page=False)

    def __exit__(self, *exc):
        if getattr(self, "clients", None) is not None:
            self.clients.close()
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def stream(self, prompt: str, method: str, client=None) -> dict:
        """One streamed request on `client` (else a new one), timed by `load_clients.timed_stream`."""
        from vegas_studio_app.load_clients import timed_stream
        return timed_stream(self.url, prompt, method, self.args.max_tokens, client or self.new_client())

    def soak(self, prompts: list[str], methods: list[str], seconds: float) -> dict:
        """Clients streaming continuously for `seconds`, each on its own `Client`; every few seconds
        one cancels its request mid-stream and starts another. Every completed stream must hold
        each token once (events in order, equal to the final output); afterwards the KV pool must
        be all free. The app's host memory (all, the server's process, its children: the engine's)
        and GPU memory are sampled throughout."""
        stop_at = time.monotonic() + seconds
        counts = dict(streams_ok=0, aborted=0, bad=0)
        errors: list[str] = []
        lock = threading.Lock()

        from vegas_studio_app.client import stream_tokens

        def client_loop(i: int):
            client, n = self.new_client(), 0
            while time.monotonic() < stop_at:
                n += 1
                method = methods[(i + n) % len(methods)]
                abort = (i + n) % 7 == 0             # about one client in seven aborts each round
                outs = []
                for out in stream_tokens(client, prompts[i], method, self.args.max_tokens, True, 0.0):
                    outs.append(out)
                    if abort and len(outs) >= 3:
                        break                         # leaving the stream cancels the request
                with lock:
                    if abort:
                        counts["aborted"] += 1
                        continue
                    problem = _check_stream(outs)
                    counts["bad" if problem else "streams_ok"] += 1
                    if problem:
                        errors.append(f"client {i} {method}: {problem}")

        memory = []
        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(len(prompts))]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            pids = _process_tree(self.proc.pid)
            # the server's process and its children (the engine's) apart, so a growth can be placed
            server, engine = _rss_mb(pids[:1]), _rss_mb(pids[1:])
            memory.append((server + engine, _gpu_mb(pids), server, engine))
            time.sleep(2)
        for th in threads:
            th.join()
        time.sleep(1)
        pool = self.new_client().predict(api_name="/pool")
        return dict(seconds=seconds, clients=len(prompts), **counts, errors=errors[:20],
                    pool_free_end=pool["num_free"], pool_blocks=pool["num_blocks"],
                    active_end=pool["active_requests"], rss_mb=[m[0] for m in memory],
                    gpu_mb=[m[1] for m in memory], rss_server_mb=[m[2] for m in memory],
                    rss_engine_mb=[m[3] for m in memory])

    def together(self, prompts: list[str], method: str, page: bool = False) -> dict:
        """Every prompt streamed by a client of its own, each in its own process, submitted at once
        once all have connected and opened their sessions: all their tokens over the time from the
        first submit to the last token. `page`: clients speaking the page's protocol, else
        gradio_client. `cpu_s`: the processor time the server's process, the engine's (its
        children) and the client processes took over the phase (`phase_s`, sessions opened
        included): on a machine whose cores the engine fills, what the others take is the engine's."""
        from ..engine_core import STEP_LOG_STEPS
        app = _process_tree(self.proc.pid)
        groups = dict(server=app[:1], engine=app[1:], clients=[p.pid for p in self.clients.procs])
        cpu0, t0 = {k: _cpu_s(v) for k, v in groups.items()}, time.monotonic()
        results = self.clients.together(prompts, method, page)
        cpu = {k: round(_cpu_s(v) - cpu0[k], 3) for k, v in groups.items()}
        phase = time.monotonic() - t0
        start, end = min(r["t_submit"] for r in results), max(r["t_last"] for r in results)
        wall = end - start
        steps = step_timeline(self.new_client().predict(STEP_LOG_STEPS, api_name="/engine_steps"), start, end)
        total = sum(r["tokens"] for r in results)
        return dict(tokens=total, tokens_per_s=total / wall, wall_s=wall, phase_s=phase, cpu_s=cpu,
                    per_client_tokens_per_s=[r["tokens_per_s"] for r in results],
                    per_client_ttft_s=[r["ttft_s"] for r in results],
                    per_client_engine_ttft_s=[r["engine_ttft_s"] for r in results],
                    per_client_api_s=[r["api_s"] for r in results],
                    per_client_accept_s=[r["accept_s"] for r in results],
                    ttft_s=max(r["ttft_s"] for r in results), max_gap_s=max(r["max_gap_s"] or 0 for r in results),
                    steps=steps)


def step_timeline(steps: list[dict], start: float, end: float) -> list[list] | None:
    """The engine steps that overlap [start, end] (wall clock), as [start ms, end ms, kind, rows,
    tokens] from `start`: where the batch's first tokens waited. None when the log (the last
    `STEP_LOG_STEPS`) no longer reaches back to `start`: a timeline without its beginning would mislead."""
    if not steps or steps[0]["start"] > start:
        return None
    return [[round(1e3 * (s["start"] - start), 2), round(1e3 * (s["end"] - start), 2), s["kind"], s["rows"],
             s["tokens"]] for s in steps if s["end"] >= start and s["start"] <= end]


def _check_stream(outs: list[dict]) -> str | None:
    """What is wrong with a finished stream, or None: it ends with its final message, its events
    are in order, and each token comes once."""
    if not outs or not outs[-1].get("finished"):
        return "the stream ended without its final message"
    final, events = outs[-1], [o for o in outs if not o.get("finished")]
    if final.get("error"):
        return final["error"]
    if [e["seq"] for e in events] != list(range(len(events))):
        return "an event was lost or repeated"
    if [t for e in events for t in e["token_ids"]] != final["all_token_ids"]:
        return "the streamed tokens differ from the final output"
    return None


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the app's engine runs in a child process)."""
    pids, i = [pid], 0
    while i < len(pids):
        try:
            for task in os.listdir(f"/proc/{pids[i]}/task"):
                with open(f"/proc/{pids[i]}/task/{task}/children", encoding="ascii") as f:
                    pids.extend(int(c) for c in f.read().split())
        except OSError:
            pass
        i += 1
    return pids


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces), from the state
    letter on (field 3 of stat); [] once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return []


def _state(pid: int) -> str:
    """The process's state letter (T: stopped), or "" once it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:     # gone since listed: it takes no processor time either
            pass


def _rss_mb(pids: list[int]) -> float:
    """Resident memory of the app's processes (`_process_tree`) together."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status", encoding="ascii") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _cpu_s(pids: list[int]) -> float:
    """Processor seconds (user and system) the processes `pids` have taken so far."""
    total = 0
    for p in pids:
        fields = _stat(p)
        try:
            total += int(fields[11]) + int(fields[12])           # utime, stime: fields 14 and 15 of stat
        except (IndexError, ValueError):                          # gone
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _gpu_mb(pids: list[int]) -> int | None:
    """The app's processes' (`_process_tree`) GPU memory from nvidia-smi (None without a GPU or the tool)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    wanted = {str(p) for p in pids}
    used = [int(mb) for p, _, mb in (line.partition(",") for line in out.splitlines()) if p.strip() in wanted]
    return sum(used) if used else None

