"""One background thread owns the engine; every user talks to it through queues.

The engine is not thread-safe, and one engine serves every browser tab and API client: continuous
batching puts their requests into the same steps. So exactly one thread (`EngineWorker`) loads the
model, adds, steps and aborts; request handlers only `submit` and then read their own `Handle`'s queue.
The app runs this thread in a process of its own (`engine_process.ProcessWorker`, same contract).

Contract:
- `submit(...)` returns a `Handle` once the engine accepted the request, or raises the engine's
  `InvalidRequestError` (bad prompt or parameters) / `EngineNotReady` in the caller's thread.
- A handle's queue yields `LiveEvent`s in engine order, then exactly one final event (`finished=True`)
  carrying the `GenerationResult` and the run's `Trace` (or an `error`). Every token the engine emitted
  for the request is in exactly one event's `new_token_ids`.
- `Handle.abort()` (Stop, a closed tab, a consumer that stopped reading for `stale_after_s`) frees the
  request's KV pages; its final event has finish_reason "abort".
- `Handle.pause()` holds the request between engine iterations (it keeps its KV pages; the other
  requests in the batch go on), `Handle.advance()` runs exactly one more decode iteration and holds it
  again (step-through), `Handle.resume()` lets it run on. Each returns once the engine thread applied
  it, with the number of iteration events sent to the handle so far: after `pause()` no further event
  comes until `advance()` / `resume()` (a held request that is still prefilling finishes its prefill).
  A paused consumer must keep calling `get` (the stale-request abort still applies to it).
- An exception inside `engine.step()` fails the requests of that step with a message; the worker, and
  the app, stay up.
- `sweep(...)` measures the throughput sweep (`vegas_core.bench.sweep`) on this engine, on the engine
  thread, only while no request is on it (else `EngineBusy`); between the sweep's steps the thread
  answers `pool` and refuses `submit` with `EngineBusy`, so a request never shares the sweep's steps.
"""
from __future__ import annotations

import gc
import queue
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field

from vegas_core.errors import VegasError
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams
from vegas_studio_app.warmup import warm_up


class EngineNotReady(VegasError):
    """The model is still loading, or failed to load."""


class EngineBusy(VegasError):
    """A throughput sweep holds the engine, or requests hold it that a sweep must not share it with."""


SWEEPING = ("the engine is measuring a throughput sweep (Overhead tab) and serves no requests meanwhile: "
            "try again when it ends, or stop it there")


@dataclass(frozen=True)
class EngineInfo:
    """What the app shows about the loaded engine (it may live in another process: `engine_process`)."""
    config: object                         # vegas_core.config.ModelConfig
    source: str
    device: object                         # torch.device
    dtype: object                          # torch.dtype
    mode: str                              # Engine.mode: "deterministic", "default" or "reference"
    deterministic: bool                    # EngineOptions.deterministic

    @classmethod
    def of(cls, engine) -> "EngineInfo":
        return cls(engine.config, engine.source, engine.device, engine.dtype, engine.mode,
                   engine.core.options.deterministic)


@dataclass
class LiveEvent:
    new_token_ids: list[int]
    text_delta: str
    rejected_ids: list[int]
    iteration: dict | None
    token_texts: dict[int, str]            # text of every id in this event (emitted, drafts)
    finished: bool = False
    finish_reason: str | None = None
    result: object | None = None           # GenerationResult, on the final event
    trace: object | None = None            # Trace, on the final event
    error: str | None = None
    t: float = 0.0                         # wall clock when the engine thread emitted it
    selected: dict | None = None           # the set this iteration chose for the next drafts (Select)
    accept_draws: list[float] | None = None   # the acceptance test's uniforms (sampled runs)


@dataclass(eq=False)
class Handle:
    request_id: int
    prompt_text: str
    prompt_ids: list[int]
    sampling: SamplingParams
    spec: SpecParams
    worker: "EngineWorker"
    events: "queue.Queue[LiveEvent]" = field(default_factory=queue.Queue)
    prompt_texts: dict[int, str] = field(default_factory=dict)   # text of each prompt token id
    last_poll: float = field(default_factory=time.monotonic)
    done: bool = False
    iterations_sent: int = 0               # events carrying an iteration record put on `events`
    t_accepted: float = 0.0                # wall clock when the engine thread added the request

    def get(self, timeout: float = 0.5) -> LiveEvent | None:
        """Next event, or None after `timeout` (the call also tells the worker someone still reads)."""
        self.last_poll = time.monotonic()
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def ready(self) -> list[LiveEvent]:
        """Every event already waiting, without blocking."""
        self.last_poll = time.monotonic()
        out = []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def abort(self) -> None:
        if not self.done:
            self.worker._commands.put(("abort", self.request_id, None))

    def pause(self, timeout: float = 30.0) -> int:
        """Hold the request between iterations (KV pages kept); returns `iterations_sent` once held."""
        return self._hold("pause", timeout)

    def resume(self, timeout: float = 30.0) -> int:
        """Let a paused request run on."""
        return self._hold("resume", timeout)

    def advance(self, timeout: float = 30.0) -> int:
        """Run exactly one more decode iteration, then hold again; returns `iterations_sent` before it,
        so that iteration's event is the one numbered by the return value (0-based)."""
        return self._hold("advance", timeout)

    def _hold(self, kind: str, timeout: float) -> int:
        if not self.done:
            fut: Future = Future()
            self.worker._commands.put((kind, self.request_id, fut))
            sent = fut.result(timeout)
            if sent is not None:
                return sent
        return self.iterations_sent


@dataclass
class _Forwarded:
    """A handle's event queue that hands each event on (`EngineWorker(forward=...)`)."""
    forward: object
    request_id: int

    def put(self, event: LiveEvent) -> None:
        self.forward(self.request_id, event)


class EngineWorker:
    def __init__(self, model: str | None = None, device: str | None = None, dtype: str | None = None,
                 max_num_seqs: int = 16, stale_after_s: float = 120.0, engine_factory=None,
                 attention: str = "auto", cuda_graphs: str = "auto", deterministic: bool = True,
                 warm_up_batch: int = 8, forward=None):
        self.model, self.device, self.dtype = model, device, dtype
        self.warm_up_batch = warm_up_batch      # on a GPU, graphs are captured up to this batch at start
        self.attention, self.cuda_graphs = attention, cuda_graphs
        self.deterministic = deterministic      # EngineOptions.deterministic (Compare's exact check)
        self.max_num_seqs = max_num_seqs
        self.stale_after_s = stale_after_s
        self._factory = engine_factory
        # forward(request_id, event): where the handles' events go instead of their queues (the
        # engine process ships them to the app's process).
        self._forward = forward
        self._previous: EngineWorker | None = None
        self.engine = None
        self.info: EngineInfo | None = None    # once ready
        self.state = "loading"             # loading | ready | failed
        self.error: str | None = None
        self.load_started = time.monotonic()
        self.load_time_s: float | None = None
        self.warming: str | None = None     # what the start-up warm-up runs now
        self.warm_up_s: float | None = None
        self.peak_active = 0
        self._commands: "queue.Queue[tuple]" = queue.Queue()
        self._handles: dict[int, Handle] = {}
        self._requests: dict[int, object] = {}
        self._texts: dict[int, str] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vegas-engine", daemon=True)

    # -- caller side ---------------------------------------------------------------------------
    def with_model(self, model: str | None) -> "EngineWorker":
        """A new (not yet started) worker with this one's settings for another model. It stops this
        one and frees its engine before loading: two models at once may not fit in memory."""
        new = type(self)(model, self.device, self.dtype, self.max_num_seqs, self.stale_after_s,
                         self._factory, self.attention, self.cuda_graphs, self.deterministic,
                         self.warm_up_batch)
        new._previous = self
        return new

    def release(self, timeout: float = 120.0) -> None:
        """Stop the engine thread and drop the engine (its weights and KV pool)."""
        self.shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.engine = None
        gc.collect()

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the engine thread still runs (a replaced or shut-down worker's has ended)."""
        return self._thread.is_alive()

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.state == "ready"

    def status_line(self) -> str:
        if self.state == "loading":
            if self.warming:
                return (f"Warming up on the GPU (capturing CUDA graphs, compiling kernels): {self.warming}… "
                        f"{time.monotonic() - self.load_started:.0f} s")
            return f"Loading the model… {time.monotonic() - self.load_started:.0f} s"
        if self.state == "failed":
            return f"The model failed to load: {self.error}"
        e = self.info
        attention = {"deterministic": "Triton kernels, batch-invariant", "default": "Triton kernels",
                     "reference": "PyTorch reference attention"}[e.mode]
        warmed = f", warmed up in {self.warm_up_s:.1f} s" if self.warm_up_s is not None else ""
        return (f"Ready: {e.config.name or e.source} on {e.device} ({str(e.dtype).replace('torch.', '')}, "
                f"{attention}), loaded in {self.load_time_s:.1f} s{warmed}")

    def submit(self, prompt: str, sampling: SamplingParams, spec: SpecParams, chat: bool = True,
               timeout: float = 60.0, trace: bool = True) -> Handle:
        """Queue a request; `trace`: record its iterations for the views (an API stream needs none,
        and at a large batch recording every layer's selections costs host time each iteration)."""
        if self.state != "ready":
            raise EngineNotReady(self.status_line())
        fut: Future = Future()
        self._commands.put(("submit", (prompt, sampling, spec, chat, trace), fut))
        return fut.result(timeout)

    def sweep(self, grid, spec, progress, stop: threading.Event) -> Future:
        """Run the throughput sweep on the engine thread; the future holds its document, or
        `EngineBusy` when requests are on the engine. `progress` (a `SweepProgress`) shows it
        running; setting `stop` ends it after the current step, with the cells it measured."""
        if self.state != "ready":
            raise EngineNotReady(self.status_line())
        fut: Future = Future()
        self._commands.put(("sweep", (grid, spec, progress, stop), fut))
        return fut

    def pool(self, steps: int = 0, timeout: float = 30.0) -> dict:
        """KV pool occupancy and active requests, read by the engine thread between steps; with
        `steps`, the engine's last steps too (`EngineCore.recent_steps`)."""
        if self.state != "ready":
            return {"state": self.state, "num_free": None, "num_blocks": None, "active_requests": 0}
        fut: Future = Future()
        self._commands.put(("pool", steps, fut))
        return fut.result(timeout)

    def shutdown(self) -> None:
        self._commands.put(("stop", None, None))

    # -- engine thread -------------------------------------------------------------------------
    def _load(self) -> None:
        if self._previous is not None:     # the model this worker replaces
            self._previous.release()
            self._previous = None
        try:
            if self._factory is not None:
                self.engine = self._factory()
            else:
                from vegas_core.engine import Engine
                from vegas_core.options import EngineOptions
                self.engine = Engine(self.model, self.device, self.dtype,
                                     options=EngineOptions(trace=True, max_num_seqs=self.max_num_seqs,
                                                           attention=self.attention,
                                                           cuda_graphs=self.cuda_graphs,
                                                           deterministic=self.deterministic))
            self.load_time_s = time.monotonic() - self.load_started
            self._warm_up()
            # Out of the collector's sight from now on: the model, the libraries and the server (some
            # 350,000 objects) took a full collection 140 ms on 2 cores, which fell inside engine steps
            # at random. Objects made later (runs, traces) are collected as usual; `_run` undoes it at the end.
            gc.collect()
            gc.freeze()
            self.info = EngineInfo.of(self.engine)
            self.state = "ready"
        except Exception as e:  # a bad --model path must show in the UI, not kill the server
            self.error = f"{type(e).__name__}: {e}"
            self.state = "failed"
        finally:
            print(f"Vegas Studio: {self.status_line()}", flush=True)
            self._ready.set()

    def _warm_up(self) -> None:
        """On a GPU, each method's graphs and kernels at every batch bucket up to `warm_up_batch`
        (`warmup.py`), with the status line saying which."""
        def progress(i: int, n: int, method: str, batch: int) -> None:
            self.warming = f"{method} at batch {batch} ({i + 1} of {n})"

        t = time.monotonic()
        try:
            if warm_up(self.engine, self.warm_up_batch, progress):
                self.warm_up_s = time.monotonic() - t
        finally:
            self.warming = None

    def _run(self) -> None:
        self._load()
        if self.state != "ready":
            self._fail_commands_forever()
            return
        try:
            self._serve()
        finally:
            gc.unfreeze()     # a stopped engine must be collectable (a test process starts many)

    def _serve(self) -> None:
        idle = False
        while True:
            # Block for a command when there is nothing to step, or when the last step changed nothing
            # (every request held by pause, or waiting for pages those hold): only a command or the
            # stale-request check can change that, so no busy loop.
            busy = self.engine.core.has_work
            try:
                if not busy:
                    cmd = self._commands.get()
                elif idle:
                    cmd = self._commands.get(timeout=1.0)
                else:
                    cmd = self._commands.get_nowait()
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd[0] == "stop":
                    return
                self._command(*cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            self._abort_stale()
            idle = False
            if self.engine.core.has_work:
                before = self.engine.core.progress_mark()
                idle = not self._step() and self.engine.core.progress_mark() == before

    def _fail_commands_forever(self) -> None:
        while True:
            kind, _, fut = self._commands.get()
            if kind == "stop":
                return
            if fut is not None:
                fut.set_exception(EngineNotReady(self.status_line()))

    def _command(self, kind: str, arg, fut: Future | None) -> None:
        try:
            if kind == "submit":
                fut.set_result(self._add(*arg))
            elif kind == "abort":
                self._abort(arg)
            elif kind == "pool":
                fut.set_result(self._pool(arg))
            elif kind == "sweep":
                fut.set_result(self._sweep(*arg))
            elif kind in ("pause", "resume", "advance"):
                h = self._handles.get(arg)
                if h is not None:
                    if kind == "pause":
                        self.engine.pause(arg)
                    else:
                        self.engine.resume(arg, iterations=1 if kind == "advance" else None)
                # The count as the command took effect: read later, in the caller's thread, it
                # could already include the iteration an advance lets run.
                fut.set_result(None if h is None else h.iterations_sent)
        except Exception as e:
            if fut is not None and not fut.done():
                fut.set_exception(e)

    def _pool(self, steps: int = 0) -> dict:
        alloc = self.engine.core.allocator
        out = {"state": self.state, "num_free": alloc.num_free, "num_blocks": alloc.num_blocks,
               "active_requests": len(self._handles), "peak_active": self.peak_active}
        if steps:
            out["steps"] = self.engine.core.recent_steps(steps)
        return out

    def _sweep(self, grid, spec, progress, stop) -> dict:
        from vegas_core.bench.sweep import run_sweep
        if self._handles:
            raise EngineBusy(f"{len(self._handles)} request(s) are on the engine (streaming or paused); the sweep "
                             "measures the engine alone: run it when they have finished")
        return run_sweep(self.engine, grid, spec, progress, stop, between_steps=self._answer_while_sweeping)

    def _answer_while_sweeping(self) -> None:
        """Between a sweep's steps: answer what needs no engine step, refuse what does. No request is
        on the engine then, so abort / pause / resume have nothing to act on."""
        from vegas_core.bench.sweep import SweepStopped
        while True:
            try:
                kind, arg, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "stop":                 # ends the sweep, then the thread
                self._commands.put((kind, arg, fut))
                raise SweepStopped("the engine is shutting down")
            if fut is None:
                continue
            if kind == "pool":
                fut.set_result(self._pool(arg))
            elif kind in ("submit", "sweep"):
                fut.set_exception(EngineBusy(SWEEPING))
            else:
                fut.set_result(None)

    def _add(self, prompt: str, sampling: SamplingParams, spec: SpecParams, chat: bool, trace: bool) -> Handle:
        req = self.engine.add(prompt, sampling, spec, chat=chat, trace=trace)
        h = Handle(req.request_id, prompt, list(req.prompt_ids), sampling, spec, self,
                   prompt_texts={t: self._text(t) for t in set(req.prompt_ids)}, t_accepted=time.time())
        if self._forward is not None:
            h.events = _Forwarded(self._forward, req.request_id)
        self._handles[req.request_id] = h
        self._requests[req.request_id] = req
        self.peak_active = max(self.peak_active, len(self._handles))
        return h

    def _text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self.engine.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._texts) < 200_000:
                self._texts[token_id] = text
        return text

    def _step(self) -> bool:
        """One engine step; True if it emitted events."""
        try:
            events = self.engine.step()
        except Exception as e:
            msg = f"the engine failed during a step ({type(e).__name__}: {e}); the request was stopped"
            traceback.print_exc()
            for rid in list(self._handles):
                self._finish(rid, "error", error=msg, abort=True)
            return True
        for ev in events:
            h = self._handles.get(ev.request_id)
            if h is None:
                continue
            ids = set(ev.new_token_ids) | set(ev.rejected_ids)
            if ev.iteration:
                ids.update(d["token_id"] for d in ev.iteration["drafts"])
                ids.update(ev.iteration["emitted"])   # a stop can cut emitted tokens from the output
                h.iterations_sent += 1
            h.events.put(LiveEvent(list(ev.new_token_ids), ev.text_delta, list(ev.rejected_ids), ev.iteration,
                                   {t: self._text(t) for t in ids}, selected=ev.selected,
                                   accept_draws=ev.accept_draws, t=time.time()))
            if ev.finished:
                self._finish(ev.request_id, ev.finish_reason)
        return bool(events)

    def _abort(self, request_id: int) -> None:
        if request_id in self._handles:
            self._finish(request_id, "abort", abort=True)

    def _abort_stale(self) -> None:
        now = time.monotonic()
        for rid, h in list(self._handles.items()):
            if now - h.last_poll > self.stale_after_s:
                self._finish(rid, "abort", abort=True)

    def _finish(self, request_id: int, reason: str | None, error: str | None = None, abort: bool = False) -> None:
        """Final event with result and trace; frees the request's pages and the engine's bookkeeping."""
        from vegas_core.trace_builder import build_trace

        h = self._handles.pop(request_id)
        req = self._requests.pop(request_id)
        result = trace = None
        try:
            result = self.engine.result(req)
            if abort or result.finish_reason is None:
                result.finish_reason = reason if reason in ("stop", "length", "abort", "error") else "abort"
            if req.trace:
                trace = build_trace(self.engine, [result], h.spec, h.sampling, prompt_texts=[h.prompt_text],
                                    decode_time_s=result.decode_time_s)
        except Exception as e:
            error = error or f"could not build the run's trace ({type(e).__name__}: {e})"
        finally:
            self.engine.abort(request_id)     # frees KV pages if still held; drops the text tracker
        h.done = True
        h.events.put(LiveEvent([], "", [], None, {}, finished=True,
                               finish_reason=result.finish_reason if result else reason,
                               result=result, trace=trace, error=error))
