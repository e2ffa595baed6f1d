"""The app's behaviour behind the Gradio layout in app.py: parameter checks, the streaming generator,
pause / step (during a run the engine really holds the request and Step runs one iteration at a time;
after a run, or for an uploaded trace, Step walks through the recorded iterations), compare, export and
replay. Everything reaches the engine through the `EngineWorker`,
and everything drawn comes from `visualizations` applied to traces (live ones or uploaded ones).

Handlers return plain values or `gr.update`/`gr.skip()` in the order app.py wires their outputs;
user mistakes become a `gr.Warning` plus a readable status line, never an exception page.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
import uuid
from pathlib import Path

import gradio as gr

import visualizations as viz
from vegas_core.errors import TraceError, VegasError
from vegas_core.sampling import SamplingParams
from vegas_core.spec import METHODS, SpecParams
from vegas_core.trace import Iteration, ModelInfo, RequestTrace, RunConfig, Trace, aggregates, load_trace, save_trace
from vegas_core.trace.export import write_chrome_trace, write_csv, write_parquet
from visualizations.export import write_figures
from visualizations.tokens import stream_pieces

from .session import Session, SessionStore
from .worker import EngineWorker

# Only a bound on what the tokenizer is asked to read: the model's context, in tokens, is the real
# limit, and the engine says so when a prompt does not fit (32 characters a token at 32K positions).
MAX_PROMPT_CHARS = 1_000_000
# A trace file in memory, as pydantic models, takes up to ~20x its size (measured: dense drafts are
# the worst case), and replaying it costs about 0.35 s a MB on a 2-core machine: 8 MB keeps any
# upload within 5 s and 300 MB (tests/vegas_studio_app/test_replay_limits.py).
MAX_UPLOAD_BYTES = 8 * 1024 * 1024
UPLOAD_MEMORY_FACTOR = 20
RENDER_INTERVAL_S = 0.15
STEP_WAIT_S = 30.0      # how long Pause / Step wait for the engine's iteration before the stream shows it


def _session(request: gr.Request | None, store: SessionStore) -> Session:
    return store.get(getattr(request, "session_hash", None) if request is not None else None)


def _num(x, name: str, integer: bool = False):
    """Gradio may hand us None or a float for a blank / typed number field: make it a clean value."""
    if x is None or (isinstance(x, str) and not x.strip()):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise VegasError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v):
        raise VegasError(f"{name} must be finite, got {x!r}")
    if integer:
        if v != int(v):
            raise VegasError(f"{name} must be a whole number, got {x!r}")
        return int(v)
    return v


def build_params(method, gamma, sparsity, min_budget, granularity, record_recall, temperature, top_p, top_k,
                 seed, max_tokens) -> tuple[SamplingParams, SpecParams]:
    """Validated parameters; raises a VegasError with a readable message for anything out of range."""
    if method not in METHODS:
        raise VegasError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    gamma_v = _num(gamma, "gamma", integer=True)
    spec = SpecParams(method=method, gamma=6 if gamma_v is None else gamma_v,
                      sparsity=_num(sparsity, "sparsity") or 0.07,
                      min_budget=_num(min_budget, "min budget", integer=True) or 0,
                      granularity=granularity or "layer", record_recall=bool(record_recall))
    max_t = _num(max_tokens, "max tokens", integer=True)
    top_k_v = _num(top_k, "top-k", integer=True)
    sampling = SamplingParams(temperature=_num(temperature, "temperature") or 0.0,
                              top_p=1.0 if top_p is None else _num(top_p, "top-p"),
                              top_k=-1 if top_k_v in (None, 0) else top_k_v,
                              seed=_num(seed, "seed", integer=True), max_tokens=64 if max_t is None else max_t)
    return sampling, spec


def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise VegasError("the prompt is empty: type something to generate from")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise VegasError(f"the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    return prompt


class Studio:
    def __init__(self, worker: EngineWorker | None, results_dir: str = "bench/results",
                 export_root: str | None = None, max_upload_bytes: int = MAX_UPLOAD_BYTES):
        self.worker = worker
        self.store = SessionStore()
        self.results_dir = results_dir
        # Removed when the Studio is garbage-collected or the process exits (exports live with it).
        self._export_dir = None if export_root else tempfile.TemporaryDirectory(prefix="vegas-studio-")
        self.export_root = Path(export_root or self._export_dir.name)
        self.max_upload_bytes = max_upload_bytes

    # -- status --------------------------------------------------------------------------------
    def status(self):
        if self.worker is None:
            return "Replay-only mode (started with --no-model): upload a trace in Export / Replay.", \
                gr.Timer(active=False)
        line = self.worker.status_line()
        return line, gr.Timer(active=self.worker.state == "loading")

    def switch_model(self, value: str):
        """The model picker: load `value` in a new engine (in the background, as at start) and stop
        the old one; requests still running on it end. Returns (status, timer, chat box)."""
        from .models import load_argument, picker_value, wants_chat
        if self.worker is None:
            return "Replay-only mode (started with --no-model): no model to switch.", \
                gr.Timer(active=False), gr.Checkbox()
        if value == picker_value(self.worker.model) and self.worker.state != "failed":
            return (*self.status(), gr.Checkbox())
        # the new worker stops the old one and frees its engine before it loads
        self.worker = self.worker.with_model(load_argument(value)).start()
        return (*self.status(), gr.Checkbox(value=wants_chat(value)))

    def pool(self) -> dict:
        """KV pool occupancy (for tests and monitoring): num_free == num_blocks when idle."""
        if self.worker is None:
            return {"state": "no-model", "num_free": None, "num_blocks": None, "active_requests": 0}
        return self.worker.pool()

    def api_stream(self, prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                   temperature: float = 0.0, request: gr.Request = None):
        """Streaming API for scripts and load tests: one dict per engine event
        ({seq, token_ids, text}), then a final dict with the whole output ({finished, finish_reason,
        all_token_ids, all_text}); a refused request yields one dict with `error`."""
        try:
            if self.worker is None:
                raise VegasError("started with --no-model")
            check_prompt(prompt)
            sampling, spec = build_params(method, 4, 0.07, 16, "layer", False, temperature, 1.0, -1, None, max_tokens)
            handle = self.worker.submit(prompt, sampling, spec, chat=bool(chat))
        except (VegasError, TimeoutError) as e:
            yield {"finished": True, "error": str(e)}
            return
        seq = 0
        try:
            while True:
                ev = handle.get(timeout=0.5)
                if ev is None:
                    continue
                if ev.finished:
                    res = ev.result
                    yield {"finished": True, "finish_reason": ev.finish_reason, "error": ev.error,
                           "all_token_ids": list(res.token_ids) if res else [], "all_text": res.text if res else ""}
                    return
                # Server times (wall clock) place any delay: engine thread -> this handler -> client.
                yield {"seq": seq, "token_ids": ev.new_token_ids, "text": ev.text_delta, "finished": False,
                       "t_engine": ev.t, "t_sent": time.time()}
                seq += 1
        finally:
            if not handle.done:
                handle.abort()

    # -- rendering of the Generate tab ---------------------------------------------------------
    def _render_generate(self, s: Session, status: str, final_result=None, show_all: bool = False):
        its = s.live_iterations
        # While streaming, Pause holds the engine, so the view shows every iteration it has produced.
        shown = its if (s.streaming or not s.paused or show_all) else its[:s.revealed]
        cap = s.live_output if len(shown) == len(its) and s.live_output else None
        pieces = stream_pieces(shown, s.live_texts, cap)
        stream = viz.token_stream_html(pieces, placeholder="Tokens appear here as they are accepted.")
        emitted = [p for p in pieces if p.kind != "rejected"]
        if final_result is not None and len(shown) == len(its):
            tps = final_result.decode_tokens_per_s
        else:
            tps = self._live_tps(s, shown)
        counters = viz.counters_html(len(emitted), tps, aggregates.mean_acceptance_length(shown), len(shown), status)
        cur = shown[-1] if shown else None
        nxt = its[len(shown)] if cur is not None and len(shown) < len(its) else None
        n_layers = s.trace.model.num_layers if s.trace is not None else None
        stages = viz.iteration_stages_html(cur, s.live_texts, n_layers, next_iteration=nxt,
                                           label=f"(of {len(its)} so far)" if s.streaming else f"(of {len(its)})")
        return stream, counters, stages

    @staticmethod
    def _live_status(s: Session, elapsed: float) -> str:
        if s.paused:
            return (f"paused at iteration {len(s.live_iterations)} — the engine holds this request (its KV pages "
                    "kept): Step runs one more iteration, Resume lets it run on")
        return f"generating… {elapsed:.0f} s"

    @staticmethod
    def _live_tps(s: Session, shown) -> float | None:
        if not shown:
            return None
        steps = {it.step: it for it in shown}
        seconds = sum((it.draft_ms + it.select_ms + it.verify_ms) for it in steps.values()) / 1000.0
        tokens = sum(len(it.emitted) for it in shown)
        return tokens / seconds if seconds > 0 else None

    # -- generate ------------------------------------------------------------------------------
    def generate(self, prompt, chat, method, gamma, sparsity, min_budget, granularity, record_recall,
                 temperature, top_p, top_k, seed, max_tokens, request: gr.Request = None):
        s = _session(request, self.store)
        try:
            if self.worker is None:
                raise VegasError("this app was started with --no-model: it can only replay uploaded traces")
            check_prompt(prompt)
            sampling, spec = build_params(method, gamma, sparsity, min_budget, granularity, record_recall,
                                          temperature, top_p, top_k, seed, max_tokens)
            if s.running:
                raise VegasError("a generation is already running in this tab: press Stop first")
            handle = self.worker.submit(prompt, sampling, spec, chat=bool(chat))
        except (VegasError, TimeoutError) as e:
            msg = str(e) or type(e).__name__
            gr.Warning(msg)
            yield gr.skip(), viz.counters_html(0, None, None, 0, f"⚠ {msg}"), gr.skip()
            return
        with s.lock:
            s.handle, s.paused, s.revealed, s.source, s.streaming = handle, False, 0, "live", True
            s.live_iterations, s.live_output, s.trace = [], [], None
            s.live_texts = dict(handle.prompt_texts)
            s.run_info = (spec, sampling)
        yield self._render_generate(s, "generating… (prefill)")
        yield from self._stream(s, handle)

    def _stream(self, s: Session, handle):
        last_render, seen_version, dirty, final = 0.0, s.version, False, None
        t0 = time.monotonic()
        try:
            while True:
                ev = handle.get(timeout=0.25)      # keeps polling while paused: no stale-request abort
                if ev is not None:
                    if ev.iteration is not None:
                        s.live_iterations.append(Iteration.model_validate(ev.iteration))
                    s.live_texts.update(ev.token_texts)
                    s.live_output.extend(ev.new_token_ids)
                    dirty = True
                    if ev.finished:
                        final = ev
                        break
                if s.version != seen_version:      # Pause / Step / Resume changed the status line
                    seen_version, dirty = s.version, True
                now = time.monotonic()
                if dirty and now - last_render >= RENDER_INTERVAL_S:
                    last_render, dirty = now, False
                    yield self._render_generate(s, self._live_status(s, now - t0))
        finally:
            if not handle.done:
                handle.abort()      # the tab closed or the event was cancelled: free the KV pages
            with s.lock:
                if s.handle is handle:
                    s.streaming = False
                    s.revealed = len(s.live_iterations)    # a paused view holds at the last iteration
        if s.handle is not handle:  # a replay replaced this run meanwhile
            return
        if final.trace is not None:
            s.trace = final.trace
            req = final.trace.requests[0]
            s.live_output = list(req.output_token_ids)
            s.live_texts.update(final.trace.token_texts)
        if final.error:
            gr.Warning(final.error)
            status = f"⚠ {final.error}"
        elif final.finish_reason == "abort":
            status = "stopped: the request was aborted and its KV pages freed"
        else:
            status = f"done ({final.finish_reason}); decode {final.result.decode_time_s:.2f} s"
        if s.paused:
            status += (f" — paused at iteration {s.revealed} of {len(s.live_iterations)}: Step walks through the "
                       "run from its first iteration, Resume shows all")
        yield self._render_generate(s, status, final_result=final.result)

    # -- stop / pause / step -------------------------------------------------------------------
    def stop(self, request: gr.Request = None):
        s = _session(request, self.store)
        if not s.stop():
            gr.Info("Nothing is running.")

    def pause(self, label: str | None = None, request: gr.Request = None):
        """Pause / Resume (`label` is the button's text, so the click does what the button says; without
        it the call toggles). During a run the engine holds the request between iterations: it keeps
        its KV pages and its place, the other requests in the shared batch go on, and Step runs it one
        iteration at a time. After a run (or for an uploaded trace) the view holds its iteration and
        Step reveals the next recorded one; Resume shows the whole run."""
        s = _session(request, self.store)
        want = (label == "Pause") if label in ("Pause", "Resume") else not s.paused
        new_label = "Resume" if want else "Pause"
        if s.streaming:
            try:
                sent = s.handle.pause() if want else s.handle.resume()
            except TimeoutError:
                gr.Warning("the engine did not answer in time; try again")
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            with s.lock:
                s.paused = want
                s.version += 1
            if not want:        # running on: the stream renders
                return gr.update(value=new_label), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return (gr.update(value=new_label), *self._render_held(s, sent))
        with s.lock:
            if want and not s.paused:
                s.paused, s.revealed = True, len(s.live_iterations)
            elif not want:
                s.paused = False
        kv = self._kv_slider(s) if s.paused else gr.skip()
        status = (f"paused at iteration {s.revealed} of {len(s.live_iterations)}" if s.paused else "showing the whole run")
        return (gr.update(value=new_label), *self._render_generate(s, status), kv)

    def _render_held(self, s: Session, iterations: int):
        """Stream, counters, stages and the KV slider once the stream has taken in the engine's first
        `iterations` iterations of this run (the engine holds the request; the stream renders too)."""
        deadline = time.monotonic() + STEP_WAIT_S
        while s.streaming and len(s.live_iterations) < iterations and time.monotonic() < deadline:
            time.sleep(0.02)
        with s.lock:
            s.revealed = len(s.live_iterations)
        if s.streaming and len(s.live_iterations) < iterations:
            status = "paused — the next iteration is still running (prefill?); the view shows it when it arrives"
        elif s.streaming:
            status = self._live_status(s, 0)
        else:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()     # finished meanwhile: the stream's last view
        return (*self._render_generate(s, status), self._kv_slider(s))

    @staticmethod
    def _kv_slider(s: Session):
        """Point the KV view's iteration slider at the iteration the step-through shows."""
        return gr.update(value=max(0, s.revealed - 1), maximum=max(1, len(s.live_iterations) - 1))

    def step(self, request: gr.Request = None):
        """During a run: pause if needed and let the engine run exactly one more iteration (its draft,
        verify, accept and select stages are then shown). Otherwise: reveal the next recorded iteration
        (from the first one again after the last)."""
        s = _session(request, self.store)
        if s.streaming:
            with s.lock:
                s.paused = True
                s.version += 1
            try:
                before = s.handle.advance()
            except TimeoutError:
                gr.Warning("the engine did not answer in time; try again")
                return gr.update(value="Resume"), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return (gr.update(value="Resume"), *self._render_held(s, before + 1))
        with s.lock:
            if not s.live_iterations:
                gr.Warning("Nothing to step through yet: press Generate (or upload a trace) first.")
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            if not s.paused or s.revealed >= len(s.live_iterations):
                s.paused, s.revealed = True, 0
            s.revealed += 1
        status = f"paused at iteration {s.revealed} of {len(s.live_iterations)} — Step to advance, Resume to show all"
        return (gr.update(value="Resume"), *self._render_generate(s, status), self._kv_slider(s))

    def rerender(self, request: gr.Request = None):
        s = _session(request, self.store)
        return self._render_generate(s, "")

    # -- traces behind the views ---------------------------------------------------------------
    def current_trace(self, s: Session):
        if s.trace is not None:
            return s.trace
        if not s.live_iterations or self.worker is None or self.worker.engine is None:
            return None
        return self._provisional_trace(s)

    def _provisional_trace(self, s: Session):
        """A Trace of the run in flight (for the KV view while paused), built from the live records."""
        e = self.worker.engine
        cfg = e.config
        spec, sampling = s.run_info
        try:
            return Trace(
                model=ModelInfo(name=cfg.name or e.source, arch=cfg.arch, num_layers=cfg.num_layers,
                                num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                vocab_size=cfg.vocab_size, dtype=str(e.dtype).replace("torch.", ""),
                                device=str(e.device)),
                config=RunConfig(method=spec.method, granularity=spec.granularity, gamma=spec.gamma,
                                 sparsity=spec.sparsity, min_budget=spec.min_budget, sink=spec.sink,
                                 page_size=spec.page_size, temperature=sampling.temperature, top_p=sampling.top_p,
                                 top_k=max(sampling.top_k, 0), min_p=sampling.min_p, seed=sampling.seed,
                                 max_tokens=sampling.max_tokens),
                requests=[RequestTrace(request_id=str(s.handle.request_id), prompt_token_ids=s.handle.prompt_ids,
                                       output_token_ids=list(s.live_output), finish_reason="abort",
                                       iterations=list(s.live_iterations))],
                token_texts=dict(s.live_texts))
        except Exception:
            return None

    def _runs(self, s: Session, trace) -> dict:
        runs = {}
        if trace is not None:
            runs[f"{trace.config.method} (this run)"] = trace
        for method, t in s.runs.items():
            runs[f"{method} (compare)"] = t
        return runs

    # -- KV selection and the other views ------------------------------------------------------
    def render_kv(self, request_id, iteration, zoom_start, zoom_width, request: gr.Request = None):
        s = _session(request, self.store)
        trace = self.current_trace(s)
        if trace is None:
            overview, zoom = viz.selection_heatmaps(_EmptyTrace())
            return overview, zoom, viz.prompt_selection_html(_EmptyTrace()), viz.recall_figure(_EmptyTrace())
        r = _request_index(trace, request_id)
        it = int(iteration or 0)
        overview, zoom = viz.selection_heatmaps(trace, r, it, window_start=int(zoom_start or 0),
                                                window=int(zoom_width or 128))
        return overview, zoom, viz.prompt_selection_html(trace, r, it), viz.recall_figure(trace, r, it)

    def refresh_views(self, request: gr.Request = None):
        """Every view after a run, a compare or a replay: KV controls (ranges set to the trace), the KV
        figures, acceptance figures and the iteration breakdown."""
        s = _session(request, self.store)
        trace = self.current_trace(s)
        runs = self._runs(s, trace)
        if trace is not None and trace.requests:
            ids = [r.request_id for r in trace.requests]
            req = trace.requests[0]
            n_it = max(1, len(req.iterations))
            # Paused: the iteration on screen. Finished: the last one that selected, since a run's
            # final iteration drafts nothing when a single token is left to emit.
            cur = (s.revealed - 1) if s.paused and s.revealed else _last_selecting(req.iterations, n_it - 1)
            length = max((it.position for it in req.iterations), default=1)
            start = max(0, length - 128)
            req_u = gr.update(choices=ids, value=ids[0])
            it_u = gr.update(maximum=n_it - 1, value=max(0, cur))
            zs_u = gr.update(maximum=max(1, length - 1), value=start)
            kv = self.render_kv(ids[0], max(0, cur), start, 128, request)
        else:
            req_u, it_u, zs_u = gr.update(), gr.update(), gr.update()
            kv = self.render_kv(None, 0, 0, 128, request)
        return (req_u, it_u, zs_u, *kv, viz.per_position_acceptance_figure(runs), viz.accepted_length_histogram(runs),
                viz.running_mean_figure(runs), viz.breakdown_figure(runs))

    def overhead(self):
        latest = viz.pick_kernel_results(viz.load_kernel_results(self.results_dir))
        if latest is None:
            note = ("**No kernel benchmark results committed yet** (`bench/results/kernels-*.json`). "
                    "The iteration breakdown below is measured live by this app's engine.")
        else:
            note = f"Kernel overhead {latest.label}. The iteration breakdown below is measured live by this app's engine."
        engine = None if self.worker is None else self.worker.engine
        device = "" if engine is None else f" Engine device: {engine.device}."
        e2e = viz.pick_results(viz.load_e2e_results(self.results_dir), None if engine is None else engine.device.type)
        if e2e is not None:
            note += f" End-to-end throughput {e2e.label}."
        return viz.overhead_figure(latest), note + device, viz.throughput_figure(e2e)

    # -- compare -------------------------------------------------------------------------------
    def compare(self, prompt, chat, methods, gamma, sparsity, min_budget, granularity, temperature, max_tokens,
                request: gr.Request = None):
        s = _session(request, self.store)
        try:
            if self.worker is None:
                raise VegasError("this app was started with --no-model: compare needs the model")
            check_prompt(prompt)
            methods = [m for m in METHODS if m in (methods or [])]
            if "vanilla" not in methods:
                methods = ["vanilla"] + methods
            if len(methods) < 2:
                raise VegasError("pick at least one method besides vanilla to compare")
            params = {m: build_params(m, gamma, sparsity, min_budget, granularity, False, temperature, 1.0, -1, 0,
                                      max_tokens) for m in methods}
            if s.running:
                raise VegasError("a generation is already running in this tab: press Stop first")
        except VegasError as e:
            gr.Warning(str(e))
            yield gr.skip(), f"⚠ {e}"
            return
        s.runs, s.cancel_compare = {}, False
        for i, m in enumerate(methods):
            sampling, spec = params[m]
            yield viz.compare_table_html(s.runs), f"running {m} ({i + 1} of {len(methods)})…"
            try:
                h = self.worker.submit(prompt, sampling, spec, chat=bool(chat))
            except (VegasError, TimeoutError) as e:
                gr.Warning(str(e))
                yield viz.compare_table_html(s.runs), f"⚠ {m}: {e}"
                return
            s.handle = h
            final = None
            try:
                while final is None:
                    ev = h.get(timeout=0.5)
                    if ev is not None and ev.finished:
                        final = ev
            finally:
                if not h.done:
                    h.abort()
            if final.error or final.trace is None:
                yield viz.compare_table_html(s.runs), f"⚠ {m}: {final.error or 'no trace'}"
                return
            if final.finish_reason == "abort" or s.cancel_compare:
                yield viz.compare_table_html(s.runs), f"stopped during {m}"
                return
            s.runs[m] = final.trace
        check = viz.lossless_check(s.runs)
        verdict = {True: "lossless check passed", False: "lossless check FAILED", None: "lossless check n/a"}[check["passed"]]
        yield viz.compare_table_html(s.runs), f"done: {len(methods)} methods, {verdict}"

    # -- export / replay -----------------------------------------------------------------------
    def export(self, request: gr.Request = None):
        s = _session(request, self.store)
        trace = s.trace
        if trace is None and not s.runs:
            gr.Warning("Nothing to export yet: generate, compare or upload a trace first.")
            return None, "Nothing to export yet."
        out = self.export_root / uuid.uuid4().hex
        out.mkdir(parents=True)
        files = []
        for label, t in ([("run", trace)] if trace is not None else []) + [(f"compare-{m}", t) for m, t in s.runs.items()]:
            stem = f"vegas-{label}-{t.config.method}" if label == "run" else f"vegas-{label}"
            save_trace(t, out / f"{stem}.trace.json")
            write_chrome_trace(t, out / f"{stem}.perfetto.json")
            write_csv(t, out / f"{stem}.iterations.csv")
            files += [out / f"{stem}.trace.json", out / f"{stem}.perfetto.json", out / f"{stem}.iterations.csv"]
            try:
                write_parquet(t, out / f"{stem}.iterations.parquet")
                files.append(out / f"{stem}.iterations.parquet")
            except ImportError:
                pass
        note = (f"{len(files)} files: trace JSON (re-import it below), Perfetto / Chrome trace JSON "
                "(open at ui.perfetto.dev or chrome://tracing), per-iteration tables as CSV and Parquet.")
        return [str(f) for f in files], note

    def export_figures(self, request_id, iteration, zoom_start, zoom_width, request: gr.Request = None):
        s = _session(request, self.store)
        trace = self.current_trace(s)
        if trace is None:
            gr.Warning("Nothing to draw yet: generate, compare or upload a trace first.")
            return None, "Nothing to export yet."
        overview, zoom, _, recall = self.render_kv(request_id, iteration, zoom_start, zoom_width, request)
        runs = self._runs(s, trace)
        figs = {"kv-selection-overview": overview, "kv-selection-zoom": zoom, "recall-per-layer": recall,
                "per-position-acceptance": viz.per_position_acceptance_figure(runs),
                "accepted-length-histogram": viz.accepted_length_histogram(runs),
                "running-mean-acceptance": viz.running_mean_figure(runs),
                "iteration-breakdown": viz.breakdown_figure(runs), "collection-overhead": self.overhead()[0]}
        out = self.export_root / uuid.uuid4().hex
        files, note = write_figures(figs, out)
        return files, f"Exported {len(figs)} {note}."

    def replay(self, path, request: gr.Request = None):
        s = _session(request, self.store)
        if not path:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            if os.path.getsize(path) > self.max_upload_bytes:
                raise TraceError(f"the file is {os.path.getsize(path):,} bytes, over the "
                                 f"{self.max_upload_bytes:,}-byte limit for uploads")
            trace = load_trace(path, max_bytes=self.max_upload_bytes)
            if not trace.requests:
                raise TraceError("the trace holds no requests")
        except (TraceError, OSError) as e:
            msg = f"Could not load this trace: {e}"
            gr.Warning(msg)
            return f"⚠ {msg}", gr.skip(), gr.skip(), gr.skip(), None    # clear the box for the next try
        if s.running:
            s.stop()
        with s.lock:
            req = trace.requests[0]
            s.trace, s.runs, s.source, s.paused, s.revealed = trace, {}, "replay", False, 0
            s.handle, s.streaming = None, False
            s.live_iterations = list(req.iterations)
            s.live_texts = dict(trace.token_texts)
            s.live_output = list(req.output_token_ids)
        self.store.charge_upload(s, UPLOAD_MEMORY_FACTOR * os.path.getsize(path))
        n_it = sum(len(r.iterations) for r in trace.requests)
        status = (f"Replaying {os.path.basename(path)}: {trace.model.name} on {trace.model.device}, method "
                  f"{trace.config.method}, {len(trace.requests)} request(s), {n_it} iterations, recorded {trace.created}.")
        stream, counters, stages = self._render_generate(
            s, "replay", final_result=_ReplayResult(req.decode_tokens_per_s))
        return status, stream, counters, stages, None


class _ReplayResult:
    def __init__(self, tps):
        self.decode_tokens_per_s = tps


class _EmptyTrace:
    requests: list = []
    token_texts: dict = {}


def _last_selecting(iterations, default: int) -> int:
    """The index of the last iteration that recorded a KV selection, else `default`."""
    return next((i for i in reversed(range(len(iterations))) if iterations[i].selection is not None),
                default)


def _request_index(trace, request_id) -> int:
    for i, r in enumerate(trace.requests):
        if r.request_id == request_id:
            return i
    return 0
