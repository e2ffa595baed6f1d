"""The engine in a process of its own, behind `EngineWorker`'s interface.

The server (Gradio's event loop, a thread per streaming request) and the engine's host loop are both
Python: in one process they take turns on one interpreter lock, and with eight clients streaming
the engine's steps waited on the server's (bench/NOTES.md version 67). In a process of its own the
engine thread has an interpreter to itself, as vLLM's engine core has.

The child runs an ordinary `EngineWorker` (the same engine thread and contract) whose handles pass
their events to a sender thread, which ships them over a pipe in order, several to a message. In
the app's process `ProcessWorker` is an `EngineWorker` whose command queue is the other pipe:
`submit`, `pool`, `sweep` and a handle's `abort` / `pause` / `advance` / `resume` become messages,
and a reader thread turns what comes back into replies, `Handle` events and sweep progress. A
request's events follow the reply that made its handle on the same pipe, so the handle is there
before its first event. If the child dies, every waiting call and open handle gets an error.
"""
from __future__ import annotations

import itertools
import multiprocessing
import pickle
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import fields

from vegas_core.bench.sweep import SweepProgress
from vegas_core.errors import VegasError

from .worker import EngineNotReady, EngineWorker, Handle, LiveEvent

SETTINGS = ("model", "device", "dtype", "max_num_seqs", "attention", "cuda_graphs", "deterministic",
            "warm_up_batch")
MAX_BATCH = 256          # items per pipe message
PROGRESS_S = 0.25        # how often a running sweep's progress is sent


class ProcessWorker(EngineWorker):
    """`EngineWorker` whose engine runs in a child process (spawned: CUDA starts only there)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self._factory is not None:
            raise ValueError("an engine factory cannot cross into the engine process: use EngineWorker")
        self._commands = _Commands(self)
        self._thread = threading.Thread(target=self._run_parent, name="vegas-engine-process", daemon=True)
        self.process: multiprocessing.process.BaseProcess | None = None
        self._aborted: set[int] = set()          # stale requests already told to stop

    # -- the reader thread ---------------------------------------------------------------------
    def _run_parent(self) -> None:
        if self._previous is not None:     # the model this worker replaces: its memory first
            self._previous.release()
            self._previous = None
        ctx = multiprocessing.get_context("spawn")
        commands_in, commands_out = ctx.Pipe(duplex=False)
        events_in, events_out = ctx.Pipe(duplex=False)
        settings = {k: getattr(self, k) for k in SETTINGS}
        self.process = ctx.Process(target=_child, args=(settings, commands_in, events_out), daemon=True,
                                   name="vegas-engine")
        try:
            self.process.start()
        except Exception as e:       # the page shows it, as a failed load
            self.state, self.error = "failed", f"could not start the engine process ({type(e).__name__}: {e})"
            self._commands.close()
            self._ready.set()
            return
        commands_in.close()
        events_out.close()
        self._commands.connect(commands_out)
        try:
            while self._read(events_in):
                self._abort_stale()
        finally:
            events_in.close()
            self._commands.close()
            self.process.join(30)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(10)

    def _read(self, conn) -> bool:
        """Dispatch what arrived within a second; False once the child has exited."""
        try:
            if not conn.poll(1.0):
                return True
            items = conn.recv()
        except (EOFError, OSError):
            self._child_died()
            return False
        for item in items:
            kind = item[0]
            if kind == "event":
                self._event(item[1], item[2])
            elif kind == "reply":
                self._commands.reply(*item[1:])
            elif kind == "progress":
                self._commands.progress(item[1], item[2])
            elif kind == "status":
                self._status(item[1])
            elif kind == "exit":
                return False
        return True

    def _status(self, status: dict) -> None:
        for k, v in status.items():
            setattr(self, k, v)
        if self.state != "loading":       # the child printed the status line
            self._ready.set()

    def _event(self, request_id: int, ev: LiveEvent) -> None:
        h = self._handles.get(request_id)
        if h is None:
            return
        if ev.iteration:
            h.iterations_sent += 1
        if ev.finished:
            del self._handles[request_id]
            self._aborted.discard(request_id)
            h.done = True
        h.events.put(ev)

    def _handle(self, info: tuple, submitted: tuple) -> Handle:
        request_id, prompt_ids, prompt_texts, t_accepted = info
        prompt, sampling, spec, _, _ = submitted
        h = Handle(request_id, prompt, prompt_ids, sampling, spec, self, prompt_texts=prompt_texts,
                   t_accepted=t_accepted)
        self._handles[request_id] = h
        self.peak_active = max(self.peak_active, len(self._handles))
        return h

    def _abort_stale(self) -> None:
        """The stale-request check runs here, where the handles are read (the child's never are)."""
        now = time.monotonic()
        for rid, h in list(self._handles.items()):
            if now - h.last_poll > self.stale_after_s and rid not in self._aborted:
                self._aborted.add(rid)
                self._commands.put(("abort", rid, None))

    def _child_died(self) -> None:
        code = self.process.exitcode if self.process is not None else None
        if self.process is not None and code is None:
            self.process.join(5)
            code = self.process.exitcode
        message = f"the engine process stopped (exit code {code})"
        if self.state == "loading":
            self.state, self.error = "failed", message
            self._ready.set()
        elif self.state == "ready":
            self.state, self.error = "failed", message
        self._commands.fail_all(EngineNotReady(message))
        for rid, h in list(self._handles.items()):
            self._event(rid, LiveEvent([], "", [], None, {}, finished=True, finish_reason="error",
                                       error=message))


class _Commands:
    """`EngineWorker._commands` for the parent: each (kind, arg, future) goes down the pipe, and the
    future is settled when the child's reply comes back."""

    def __init__(self, worker: ProcessWorker):
        self.worker = worker
        self._conn = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()     # a Connection's send is not thread-safe: one at a time
        self._ids = itertools.count()
        self._calls: dict[int, tuple] = {}     # call id -> (kind, arg, future)
        self._closed = False
        self._pending: list[tuple] = []         # sent before the child's pipe existed

    def connect(self, conn) -> None:
        with self._lock:
            self._conn = conn
            pending, self._pending = self._pending, []
        for message in pending:
            self._send(message)

    def put(self, command: tuple) -> None:
        kind, arg, fut = command
        call = None
        with self._lock:
            if fut is not None:
                call = next(self._ids)
                self._calls[call] = (kind, arg, fut)
        if kind == "sweep":
            grid, spec, progress, stop = arg
            arg = (grid, spec)
            threading.Thread(target=self._forward_stop, args=(stop, fut, call), daemon=True).start()
        self._send((kind, arg, call))

    def _send(self, message: tuple) -> None:
        with self._lock:
            if self._conn is None and not self._closed:
                self._pending.append(message)
                return
            conn = self._conn
        try:
            if conn is None:
                raise OSError("closed")
            with self._send_lock:
                conn.send(message)
        except (OSError, ValueError):
            if message[2] is not None:
                self.fail(message[2], EngineNotReady(self.worker.status_line()))

    def _forward_stop(self, stop: threading.Event, fut: Future, call: int) -> None:
        """The app's Stop button sets `stop`: the child's own event is set in turn."""
        while not fut.done():
            if stop.wait(0.2):
                self._send(("sweep_stop", call, None))
                return

    def reply(self, call: int, value, error: BaseException | None) -> None:
        with self._lock:
            kind, arg, fut = self._calls.pop(call, (None, None, None))
        if fut is None:
            return
        if error is not None:
            fut.set_exception(error)
        elif kind == "submit":
            fut.set_result(self.worker._handle(value, arg))
        else:
            fut.set_result(value)

    def progress(self, call: int, values: dict) -> None:
        with self._lock:
            kind, arg, _ = self._calls.get(call, (None, None, None))
        if kind == "sweep":
            progress = arg[2]
            for k, v in values.items():
                setattr(progress, k, v)

    def fail(self, call: int, error: BaseException) -> None:
        with self._lock:
            _, _, fut = self._calls.pop(call, (None, None, None))
        if fut is not None and not fut.done():
            fut.set_exception(error)

    def fail_all(self, error: BaseException) -> None:
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            self.fail(call, error)

    def close(self) -> None:
        with self._lock:
            self._closed, conn, self._conn = True, self._conn, None
        if conn is not None:
            conn.close()
        self.fail_all(EngineNotReady(self.worker.status_line()))


# -- the child process -------------------------------------------------------------------------
def _child(settings: dict, commands, events) -> None:
    outbox: queue.Queue = queue.Queue()
    sender = threading.Thread(target=_send_loop, args=(outbox, events), name="vegas-sender", daemon=True)
    sender.start()
    worker = EngineWorker(**settings, stale_after_s=float("inf"),   # the parent checks its handles
                          forward=lambda rid, ev: outbox.put(("event", rid, ev)))
    worker.start()
    threading.Thread(target=_report_loading, args=(worker, outbox), daemon=True).start()
    sweeps: dict[int, threading.Event] = {}
    while True:
        try:
            kind, arg, call = commands.recv()
        except (EOFError, OSError):     # the app's process is gone
            kind, arg, call = "stop", None, None
        if kind == "stop":
            worker.release()
            outbox.put(("exit",))
            sender.join(30)
            return
        if kind == "sweep_stop":
            if arg in sweeps:
                sweeps[arg].set()
            continue
        fut = None
        if call is not None:
            fut = Future()
        if kind == "sweep":
            progress, stop = SweepProgress(), threading.Event()
            sweeps[call] = stop
            arg = (*arg, progress, stop)
            threading.Thread(target=_report_progress, args=(progress, fut, call, outbox), daemon=True).start()
        if fut is not None:
            fut.add_done_callback(lambda f, c=call, k=kind, a=arg: _reply(outbox, c, k, a, f))
        worker._commands.put((kind, arg, fut))


def _reply(outbox: queue.Queue, call: int, kind: str, arg, fut: Future) -> None:
    """On the engine thread, as the command is done: after every event it sent before."""
    error = fut.exception()
    value = None if error is not None else fut.result()
    if error is not None:
        try:
            pickle.dumps(error)
        except Exception:
            error = VegasError(f"{type(error).__name__}: {error}")
    elif kind == "submit":
        value = (value.request_id, value.prompt_ids, value.prompt_texts, value.t_accepted)
    elif kind == "sweep":
        outbox.put(("progress", call, _fields(arg[2])))
    outbox.put(("reply", call, value, error))


def _fields(progress: SweepProgress) -> dict:
    return {f.name: getattr(progress, f.name) for f in fields(progress)}


def _report_progress(progress: SweepProgress, fut: Future, call: int, outbox: queue.Queue) -> None:
    last = None
    while not fut.done():
        now = _fields(progress)
        if now != last:
            outbox.put(("progress", call, now))
            last = now
        time.sleep(PROGRESS_S)


def _report_loading(worker: EngineWorker, outbox: queue.Queue) -> None:
    """The loading status while it lasts, then ready or failed with what the app shows."""
    last = None
    while not worker._ready.wait(0.25):
        if worker.warming != last:
            last = worker.warming
            outbox.put(("status", {"warming": last}))
    outbox.put(("status", {k: getattr(worker, k) for k in
                           ("info", "load_time_s", "warm_up_s", "warming", "error", "state")}))


def _send_loop(outbox: queue.Queue, conn) -> None:
    while True:
        items = [outbox.get()]
        while len(items) < MAX_BATCH:
            try:
                items.append(outbox.get_nowait())
            except queue.Empty:
                break
        try:
            conn.send(items)
        except (OSError, ValueError):   # the app's process is gone
            return
        if items[-1][0] == "exit":
            conn.close()
            return
