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
from vegas_core.trace import (Iteration, ModelInfo, RequestTrace, RunConfig, Selection, Trace, aggregates,
                              load_trace)
from visualizations.export import write_figures
from visualizations.provenance import live_provenance, settings_line, stamp
from visualizations.tokens import stream_pieces

from .exports import write_bundle, write_run_files, wrong_file
from .session import Session, SessionStore
from .sweep_view import SweepView
from .unread import UnreadWatch
from .worker import EngineWorker

# Only a bound on what the tokenizer is asked to read: the model's context, in tokens, is the real
# limit, and the engine says so when a prompt does not fit (32 characters a token at 32K positions).
MAX_PROMPT_CHARS = 1_000_000
# A trace file in memory, as pydantic models, takes up to ~20x its size (measured: dense drafts are
# the worst case), and replaying it costs about 0.35 s a MB on a 2-core machine: 8 MB keeps any
# upload within 5 s and 300 MB (tests/vegas_studio_app/test_replay_limits.py).
MAX_UPLOAD_BYTES = 8 * 1024 * 1024
UPLOAD_MEMORY_FACTOR = 20
MAX_TOKENS_LIMIT = 1024      # the Generate tab's max tokens (CPU-friendly); compare's is COMPARE_TOKENS_LIMIT
COMPARE_TOKENS_LIMIT = 512
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
                 seed, max_tokens, max_tokens_limit: int | None = None) -> tuple[SamplingParams, SpecParams]:
    """Validated parameters; raises a VegasError with a readable message for anything out of range
    (never a silent clamp: a value shown in a field is the value used, or the run is refused)."""
    if method not in METHODS:
        raise VegasError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    gamma_v = _num(gamma, "gamma", integer=True)
    spec = SpecParams(method=method, gamma=6 if gamma_v is None else gamma_v,
                      sparsity=_num(sparsity, "sparsity") or 0.07,
                      min_budget=_num(min_budget, "min budget", integer=True) or 0,
                      granularity=granularity or "layer", record_recall=bool(record_recall))
    max_t = _num(max_tokens, "max tokens", integer=True)
    if max_t is not None and max_tokens_limit is not None and not 1 <= max_t <= max_tokens_limit:
        raise VegasError(f"max tokens must be between 1 and {max_tokens_limit} here, got {max_t:,}")
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


def compare_mode(mode: str, dtype, asked: bool = False) -> str:
    """What Compare's lossless check rests on with this engine (`Engine.mode`; `asked`: the app
    asked for the batch-invariant mode), for its verdict."""
    name = str(dtype).replace("torch.", "")
    if mode == "deterministic":
        return f"batch-invariant kernels, {name}: equal means bit for bit"
    if mode == "default" and asked:
        return f"Triton kernels, {name}: this model's layers are not batch-invariant, a near-tie may round apart"
    if mode == "default":
        return f"default kernels, {name}: a near-tie may round apart; start the app with --deterministic"
    if name == "float32":
        return "float32 reference path"
    return f"{name} reference path: a near-tie may round apart"


class Studio:
    def __init__(self, worker: EngineWorker | None, results_dir: str = "bench/results",
                 export_root: str | None = None, max_upload_bytes: int = MAX_UPLOAD_BYTES,
                 abandon_after_s: float = 30.0, sweep_cache_dir: str | None = None):
        self.worker = worker
        self.blocks = None                 # the gr.Blocks serving this Studio (build_ui sets it)
        self.abandon_after_s = abandon_after_s
        self.store = SessionStore()
        self.results_dir = results_dir
        # Removed when the Studio is garbage-collected or the process exits (exports live with it).
        self._export_dir = None if export_root else tempfile.TemporaryDirectory(prefix="vegas-studio-")
        self.export_root = Path(export_root or self._export_dir.name)
        self.max_upload_bytes = max_upload_bytes
        self.sweep = SweepView(self, sweep_cache_dir)   # the Overhead tab's live sweep, cached per device

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

    def pool(self, steps: int = 0) -> dict:
        """KV pool occupancy (for tests and monitoring): num_free == num_blocks when idle; `steps`:
        the engine's last steps too."""
        if self.worker is None:
            return {"state": "no-model", "num_free": None, "num_blocks": None, "active_requests": 0}
        return self.worker.pool(steps)

    def api_stream(self, prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                   temperature: float = 0.0, request: gr.Request = None):
        """Streaming API for scripts and load tests: one dict per message ({seq, token_ids, text,
        events}: the engine events ready since the last message, usually one), then a final dict with
        the whole output ({finished, finish_reason, all_token_ids, all_text}); a refused request
        yields one dict with `error`."""
        t_api = time.time()       # the handler started: Gradio's queue has handed the request over
        try:
            if self.worker is None:
                raise VegasError("started with --no-model")
            check_prompt(prompt)
            sampling, spec = build_params(method, 4, 0.07, 16, "layer", False, temperature, 1.0, -1, None, max_tokens)
            handle = self.worker.submit(prompt, sampling, spec, chat=bool(chat), trace=False)
        except (VegasError, TimeoutError) as e:
            yield {"finished": True, "error": str(e)}
            return
        seq = 0
        watch = UnreadWatch(self.blocks, getattr(request, "session_hash", None), self.abandon_after_s)
        try:
            while True:
                if watch.abandoned():
                    print(f"Vegas Studio: stopped request {handle.request_id}: no client read its stream "
                          f"for {self.abandon_after_s:g} s", flush=True)
                    return
                ev = handle.get(timeout=0.5)
                if ev is None:
                    continue
                # Events that queued up while Gradio sent the last message go out as one, so the
                # server keeps pace with a GPU that emits an event every millisecond or so.
                ready = [ev, *handle.ready()]
                tokens = [e for e in ready if not e.finished]
                if tokens:
                    # Server times (wall clock) place any delay: client submit -> this handler started
                    # -> the engine accepted it -> the engine thread emitted -> this handler sent -> client.
                    yield {"seq": seq, "token_ids": [t for e in tokens for t in e.new_token_ids],
                           "text": "".join(e.text_delta for e in tokens), "finished": False,
                           "events": len(tokens), "t_api": t_api, "t_accepted": handle.t_accepted,
                           "t_engine": tokens[0].t, "t_sent": time.time()}
                    seq += 1
                end = ready[-1]
                if end.finished:
                    res = end.result
                    yield {"finished": True, "finish_reason": end.finish_reason, "error": end.error,
                           "all_token_ids": list(res.token_ids) if res else [], "all_text": res.text if res else ""}
                    return
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
        model, config = self._header(s)
        selected, draws = self._stage_extras(s, cur, config)
        stages = viz.iteration_stages_html(cur, s.live_texts, config, model, selected=selected, accept_draws=draws,
                                           label=f"of {len(its)} so far" if s.streaming else f"of {len(its)}")
        return stream, counters, stages

    def _stage_extras(self, s: Session, cur, config):
        """The set Select chose in `cur` (the engine's, live; else the next iteration's, except for
        quest, which chooses while drafting) and the acceptance draws (live runs only)."""
        if cur is None:
            return None, None
        sel = s.live_selected.get(cur.index)
        if sel is None and getattr(config, "method", "quest") != "quest" and cur.index + 1 < len(s.live_iterations):
            sel = s.live_iterations[cur.index + 1].selection
        return sel, s.live_draws.get(cur.index)

    def _header(self, s: Session):
        """(ModelInfo, RunConfig) of the run on the Generate tab: its trace's, or the live run's."""
        if s.trace is not None and not s.streaming:
            return s.trace.model, s.trace.config
        if s.run_info is None or self.worker is None or self.worker.info is None:
            return None, None
        e = self.worker.info
        cfg = e.config
        spec, sampling = s.run_info
        return (ModelInfo(name=cfg.name or e.source, arch=cfg.arch, num_layers=cfg.num_layers,
                          num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                          vocab_size=cfg.vocab_size, dtype=str(e.dtype).replace("torch.", ""), device=str(e.device)),
                RunConfig(method=spec.method, granularity=spec.granularity, gamma=spec.gamma,
                          sparsity=spec.sparsity, min_budget=spec.min_budget, sink=spec.sink,
                          page_size=spec.page_size, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=max(sampling.top_k, 0), min_p=sampling.min_p, seed=sampling.seed,
                          max_tokens=sampling.max_tokens))

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
                                          temperature, top_p, top_k, seed, max_tokens, MAX_TOKENS_LIMIT)
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
            s.live_selected, s.live_draws = {}, {}
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
                        it = Iteration.model_validate(ev.iteration)
                        s.live_iterations.append(it)
                        if ev.selected is not None:
                            s.live_selected[it.index] = Selection.model_validate(ev.selected)
                        if ev.accept_draws is not None:
                            s.live_draws[it.index] = ev.accept_draws
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
            run = s.runlog.add("generate", final.trace, keep=s.selected_run)
            run.selected_sets, run.draws = s.live_selected, s.live_draws
            s.selected_run = run.run_id
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
        if not s.live_iterations:
            return self._nothing_loaded("Pause")
        with s.lock:
            if want and not s.paused:
                s.paused, s.revealed = True, len(s.live_iterations)
            elif not want:
                s.paused = False
        kv = self._kv_slider(s) if s.paused else gr.skip()
        status = (f"paused at iteration {s.revealed} of {len(s.live_iterations)}: Step shows the next one, Resume "
                  "shows all" if s.paused else "showing the whole run")
        return (gr.update(value=new_label), *self._render_generate(s, status), kv)

    @staticmethod
    def _nothing_loaded(button: str):
        """Pause / Step with no run and no trace: say so in a toast and in the status line."""
        msg = f"Nothing to {button.lower()}: press Generate, or pick a run or upload a trace first."
        gr.Warning(msg)
        return gr.update(value="Pause"), gr.skip(), viz.counters_html(0, None, None, 0, f"⚠ {msg}"), gr.skip(), gr.skip()

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
        """Point the KV view's iteration slider (numbered from 1, as the step-through) at the iteration
        the step-through shows."""
        return gr.update(value=max(1, s.revealed), minimum=1, maximum=max(1, len(s.live_iterations)))

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
        if not s.live_iterations:
            return self._nothing_loaded("Step")
        with s.lock:
            if not s.paused or s.revealed >= len(s.live_iterations):
                s.paused, s.revealed = True, 0
            s.revealed += 1
        status = f"paused at iteration {s.revealed} of {len(s.live_iterations)} — Step to advance, Resume to show all"
        return (gr.update(value="Resume"), *self._render_generate(s, status), self._kv_slider(s))

    def rerender(self, request: gr.Request = None):
        s = _session(request, self.store)
        return self._render_generate(s, "")

    # -- runs and the traces behind the views --------------------------------------------------
    def current_trace(self, s: Session):
        """What every view draws: the run in flight while it streams, else the selected run."""
        if s.streaming:
            return self._provisional_trace(s)
        run = s.runlog.get(s.selected_run)
        return run.trace if run is not None else s.trace

    def _provisional_trace(self, s: Session):
        """A Trace of the run in flight (for the KV view while paused), built from the live records."""
        model, config = self._header(s)
        if model is None or not s.live_iterations or s.handle is None:
            return None
        try:
            return Trace(model=model, config=config, token_texts=dict(s.live_texts), requests=[RequestTrace(
                request_id=str(s.handle.request_id), prompt_token_ids=s.handle.prompt_ids,
                prompt_text=s.handle.prompt_text, output_token_ids=list(s.live_output), finish_reason="abort",
                iterations=list(s.live_iterations))])
        except Exception:
            return None

    def _tags(self, s: Session, trace) -> tuple[str, str]:
        """(settings, provenance) of one trace's figures."""
        run = None if s.streaming else s.runlog.get(s.selected_run)
        prov = run.provenance if run is not None and run.trace is trace else live_provenance(trace)
        return settings_line(trace), prov

    def _figure_runs(self, s: Session) -> tuple[dict, str | None, str | None]:
        """(legend -> trace, settings, provenance) of the runs plotted together: the selected run and
        the runs on exactly its prompt, so no plot mixes prompts."""
        if s.streaming:
            trace = self._provisional_trace(s)
            return ({f"{trace.config.method} (running)": trace}, *self._tags(s, trace)) if trace else ({}, None, None)
        run = s.runlog.get(s.selected_run)
        if run is None:
            return {}, None, None
        runs = s.runlog.same_prompt(run)
        settings = settings_line(run.trace, method=len(runs) == 1)
        return {r.legend: r.trace for r in runs}, settings, "; ".join(dict.fromkeys(r.provenance for r in runs))

    def select_run(self, run_id, request: gr.Request = None):
        """The run selector: show that run on the Generate tab (stream, counters, step-through); the other
        tabs follow through `refresh_views`. Not while a run streams (its view stays)."""
        s = _session(request, self.store)
        run = s.runlog.get(run_id)
        if run is None or s.streaming:
            if s.streaming:
                gr.Info("A run is streaming: the Generate tab keeps showing it; pick the run again when it ends.")
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        req = run.trace.requests[0]
        with s.lock:
            s.trace, s.selected_run, s.paused, s.revealed = run.trace, run.run_id, False, 0
            s.live_iterations, s.live_output = list(req.iterations), list(req.output_token_ids)
            s.live_texts = dict(run.trace.token_texts)
            s.live_selected, s.live_draws = run.selected_sets, run.draws
        return (gr.update(value="Pause"), *self._render_generate(
            s, f"showing run #{run.run_id} ({run.provenance})", final_result=_ReplayResult(req.decode_tokens_per_s)))

    # -- KV selection and the other views ------------------------------------------------------
    def render_kv(self, request_id, iteration, zoom_start, zoom_width, request: gr.Request = None):
        """The KV tab for one request and iteration (numbered from 1, as the step-through)."""
        s = _session(request, self.store)
        trace = self.current_trace(s)
        if trace is None:
            overview, zoom = viz.selection_heatmaps(_EmptyTrace())
            return overview, zoom, viz.prompt_selection_html(_EmptyTrace()), viz.recall_figure(_EmptyTrace())
        r = _request_index(trace, request_id)
        it = max(1, int(iteration or 1)) - 1
        overview, zoom = viz.selection_heatmaps(trace, r, it, window_start=int(zoom_start or 0),
                                                window=max(1, int(zoom_width or 128)))
        recall = viz.recall_figure(trace, r, it)
        tags = self._tags(s, trace)
        for fig in (overview, zoom, recall):
            if not (fig.layout.meta or {}).get("empty"):
                stamp(fig, *tags)
        return overview, zoom, viz.prompt_selection_html(trace, r, it), recall

    def refresh_views(self, request_id=None, iteration=None, zoom_start=None, zoom_width=None,
                      request: gr.Request = None):
        """Every view after a run, a compare, a replay or a pick in the run selector: the selector, the
        KV controls (reset to the run's last selecting iteration and its latest positions when the run
        changed, else kept and clamped to it), the KV figures, acceptance figures and breakdown."""
        s = _session(request, self.store)
        trace = self.current_trace(s)
        run_u = gr.update(choices=s.runlog.choices(), value=s.selected_run)
        width = max(1, int(zoom_width or 128))
        if trace is not None and trace.requests:
            ids = [r.request_id for r in trace.requests]
            key = "live" if s.streaming else s.selected_run
            fresh = key != s.kv_run
            s.kv_run = key
            rid = ids[0] if fresh or request_id not in ids else request_id
            req = trace.requests[ids.index(rid)]
            n_it = max(1, len(req.iterations))
            if fresh:
                # Paused: the iteration on screen. Finished: the last one that selected, since a run's
                # final iteration drafts nothing when a single token is left to emit.
                cur = s.revealed if s.paused and s.revealed else _last_selecting(req.iterations, n_it - 1) + 1
            else:
                cur = int(iteration or 1)
            cur = min(max(1, cur), n_it)
            length = req.iterations[cur - 1].position if req.iterations else 1
            start = max(0, length - width) if fresh else min(max(0, int(zoom_start or 0)), max(0, length - width))
            req_u = gr.update(choices=ids, value=rid)
            it_u = gr.update(minimum=1, maximum=n_it, value=cur)
            zs_u = gr.update(maximum=max(1, length - width), value=start)
            kv = self.render_kv(rid, cur, start, width, request)
        else:
            req_u, it_u, zs_u = gr.update(), gr.update(), gr.update()
            kv = self.render_kv(None, 1, 0, width, request)
        return (run_u, req_u, it_u, zs_u, *kv, *self._run_figures(s))

    def _run_figures(self, s: Session) -> list:
        """Per-position acceptance, accepted-length histogram, running mean and breakdown, stamped."""
        runs, settings, prov = self._figure_runs(s)
        figs = [viz.per_position_acceptance_figure(runs), viz.accepted_length_histogram(runs),
                viz.running_mean_figure(runs), viz.breakdown_figure(runs)]
        for fig in figs:
            if not (fig.layout.meta or {}).get("empty"):
                stamp(fig, settings, prov)
        return figs

    def overhead(self):
        """The two file-based plots (committed benchmark results, each named on its figure) and a note
        that says which numbers there are measured by this app and which are read from files."""
        latest = viz.pick_kernel_results(viz.load_kernel_results(self.results_dir))
        engine = None if self.worker is None else self.worker.info
        e2e = viz.pick_results(viz.load_e2e_results(self.results_dir), None if engine is None else engine.device.type)
        files = [r.provenance for r in (latest, e2e) if r is not None]
        note = ("**Read from committed benchmark files, not measured by this app:** the collection-overhead and "
                "throughput plots (" + ("; ".join(files) if files else "no files in bench/results yet") + "). "
                "**Measured live:** the throughput sweep and the iteration breakdown below, by this app's engine"
                + (f" on {engine.device}." if engine is not None else "."))
        return viz.overhead_figure(latest), note, viz.throughput_figure(e2e)

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
                                      max_tokens, COMPARE_TOKENS_LIMIT) for m in methods}
            if s.running:
                raise VegasError("a generation is already running in this tab: press Stop first")
        except VegasError as e:
            gr.Warning(str(e))
            yield gr.skip(), f"⚠ {e}"
            return
        s.runs, s.cancel_compare = {}, False
        group = s.runlog.new_group()
        table = lambda: viz.compare_table_html(s.runs, expected=methods)  # noqa: E731
        for i, m in enumerate(methods):
            sampling, spec = params[m]
            yield table(), f"running {m} ({i + 1} of {len(methods)})…"
            try:
                h = self.worker.submit(prompt, sampling, spec, chat=bool(chat))
            except (VegasError, TimeoutError) as e:
                gr.Warning(str(e))
                yield table(), f"⚠ {m}: {e}"
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
                yield table(), f"⚠ {m}: {final.error or 'no trace'}"
                return
            if final.finish_reason == "abort" or s.cancel_compare:
                yield table(), f"stopped during {m}: no verdict (it needs every method)"
                return
            s.runs[m] = final.trace
            run = s.runlog.add("compare", final.trace, group=group, keep=s.selected_run)
            if s.selected_run is None or s.runlog.get(s.selected_run) is None:
                s.selected_run = run.run_id    # nothing was shown yet: show the compare
        verdict = {"pass": "lossless check passed", "fail": "lossless check FAILED",
                   "n/a": "identical output not expected at temperature > 0 (see below)"}
        state = "pass" if viz.lossless_check(s.runs)["passed"] else "fail"
        if any(t.config.temperature > 0 for t in s.runs.values()):
            state = "n/a"
        engine = self.worker.info
        yield table(), (f"done: compare {group}, {len(methods)} methods, {verdict[state]} "
                        f"({compare_mode(engine.mode, engine.dtype, engine.deterministic)})")

    # -- export / replay -----------------------------------------------------------------------
    def _export_runs(self, s: Session) -> list:
        """The selected run and the runs on its prompt (what the figures draw)."""
        run = s.runlog.get(s.selected_run)
        return s.runlog.same_prompt(run) if run is not None else []

    def export(self, request: gr.Request = None):
        s = _session(request, self.store)
        runs = self._export_runs(s)
        if not runs:
            gr.Warning("Nothing to export yet: generate, compare or upload a trace first.")
            return None, "⚠ Nothing to export yet: generate, compare or upload a trace first."
        out = self.export_root / uuid.uuid4().hex
        out.mkdir(parents=True)
        files = write_run_files(runs, out)
        note = (f"{len(files)} files for run #{runs[0].run_id} and the {len(runs) - 1} other run(s) on its prompt: "
                "trace JSON (re-import it below), Perfetto / Chrome trace JSON (open at ui.perfetto.dev or "
                "chrome://tracing), per-iteration tables as CSV and Parquet.")
        return [str(f) for f in files], note

    def _all_figures(self, s: Session, kv_args, request) -> dict:
        overview, zoom, _, recall = self.render_kv(*kv_args, request)
        acc_pos, acc_hist, acc_run, breakdown = self._run_figures(s)
        overhead, _, throughput = self.overhead()
        figs = {"kv-selection-overview": overview, "kv-selection-zoom": zoom, "recall-per-layer": recall,
                "per-position-acceptance": acc_pos, "accepted-length-histogram": acc_hist,
                "running-mean-acceptance": acc_run, "iteration-breakdown": breakdown,
                "collection-overhead": overhead, "end-to-end-throughput": throughput}
        if self.sweep.document()[0] is not None:
            figs["throughput-sweep"] = self.sweep.figure()
        return figs

    def export_figures(self, request_id, iteration, zoom_start, zoom_width, request: gr.Request = None):
        s = _session(request, self.store)
        if self.current_trace(s) is None:
            gr.Warning("Nothing to draw yet: generate, compare or upload a trace first.")
            return None, "⚠ Nothing to export yet: generate, compare or upload a trace first."
        figs = self._all_figures(s, (request_id, iteration, zoom_start, zoom_width), request)
        files, note = write_figures(figs, self.export_root / uuid.uuid4().hex)
        return files, f"Exported {len(figs)} {note}."

    def download_all(self, request_id, iteration, zoom_start, zoom_width, request: gr.Request = None):
        """One zip: the selected run's (and its prompt's other runs') traces, timelines, tables, every
        figure as PNG (3×) and SVG, and the compare table."""
        s = _session(request, self.store)
        runs = self._export_runs(s)
        if not runs or s.streaming:
            msg = "a run is still streaming: download when it ends" if runs else \
                "nothing to download yet: generate, compare or upload a trace first"
            gr.Warning(msg[0].upper() + msg[1:] + ".")
            return None, f"⚠ {msg}."
        figs = self._all_figures(s, (request_id, iteration, zoom_start, zoom_width), request)
        group = {r.method: r.trace for r in runs if r.kind == "compare" and r.group == runs[0].group} \
            if runs[0].kind == "compare" else {}
        compare = viz.compare_table_html(group) if group else None
        path, note = write_bundle(runs, figs, compare, self.export_root / uuid.uuid4().hex)
        return [str(path)], f"One zip: {len(runs)} run(s) with traces and tables, {len(figs)} {note}."

    def replay(self, path, request: gr.Request = None):
        s = _session(request, self.store)
        if not path:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            if os.path.getsize(path) > self.max_upload_bytes:
                raise TraceError(f"the file is {os.path.getsize(path):,} bytes, over the "
                                 f"{self.max_upload_bytes:,}-byte limit for uploads")
            why = wrong_file(path)
            if why:
                raise TraceError(why)
            trace = load_trace(path, max_bytes=self.max_upload_bytes)
            if not trace.requests:
                raise TraceError("the trace holds no requests")
        except (TraceError, OSError) as e:
            msg = f"Could not load this trace: {e}"
            gr.Warning(msg)
            return f"⚠ {msg}", gr.skip(), gr.skip(), gr.skip(), None    # clear the box for the next try
        if s.running:
            s.stop()
        name = os.path.basename(path)
        run = s.runlog.add("replay", trace, source=name, keep=s.selected_run)
        with s.lock:
            req = trace.requests[0]
            s.trace, s.runs, s.source, s.paused, s.revealed = trace, {}, "replay", False, 0
            s.handle, s.streaming, s.selected_run = None, False, run.run_id
            s.live_iterations = list(req.iterations)
            s.live_texts = dict(trace.token_texts)
            s.live_output = list(req.output_token_ids)
            s.live_selected, s.live_draws = {}, {}
        self.store.charge_upload(s, UPLOAD_MEMORY_FACTOR * os.path.getsize(path))
        n_it = sum(len(r.iterations) for r in trace.requests)
        status = (f"Replaying {name} (run #{run.run_id}): {trace.model.name} on {trace.model.device}, method "
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
