"""The Overhead tab's live sweep, "Where does Vegas pay off?": `vegas_core.bench.sweep` run on the
app's own engine through its worker (never a second model load), with progress while it runs, the
finished document cached per device and model in `$VEGAS_CACHE_DIR/sweeps/` (so the next start shows
it, labelled with when it was measured), and export as JSON, SVG and PNG.

One sweep at a time for the whole app, since there is one engine: a tab that presses Run while one
runs watches that one, and Stop stops it for every tab. While it runs the engine refuses requests
(`worker.EngineBusy`); it starts only when no request is on the engine.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from vegas_core.bench.common import device_tag
from vegas_core.bench.sweep import SweepProgress, grid_for
from vegas_core.errors import VegasError
from vegas_core.loader.registry import cache_dir as vegas_cache_dir
from visualizations.export import write_figures
from visualizations.sweep import context_label, live_label, measured_at, sweep_figure

from .worker import EngineNotReady

POLL_S = 0.5


def cache_path(cache_dir: str | os.PathLike, device: str, model: str) -> Path:
    """One file per device kind ('h200', 'cpu') and model."""
    slug = re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-")[-60:] or "model"
    return Path(cache_dir) / f"sweep-{device}-{slug}.json"


def save_sweep(doc: dict, path: Path) -> None:
    """Written whole, then renamed into place: a crash never leaves half a file to show."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)


def load_sweep(path: Path) -> dict | None:
    """The cached document, or None when there is none or it is not one (it is then measured again)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("grid"), dict) and \
        isinstance(doc.get("records"), list) else None


def grid_line(grid) -> str:
    return (f"batch {', '.join(map(str, grid.batches))} × context "
            f"{', '.join(context_label(c) for c in grid.contexts)}, {grid.gen_tokens} tokens a request")


@dataclass(eq=False)
class _Job:
    worker: object
    future: object
    progress: SweepProgress
    stop: threading.Event
    path: Path
    started: float = field(default_factory=time.monotonic)
    finished_note: str | None = None       # set once, by the first watcher that sees it end


class SweepView:
    def __init__(self, studio, cache_dir: str | os.PathLike | None = None):
        self.studio = studio
        self.cache_dir = Path(cache_dir or os.path.join(vegas_cache_dir(), "sweeps"))
        self._lock = threading.Lock()
        self._job: _Job | None = None

    # -- what is shown -------------------------------------------------------------------------
    def _ready_engine(self):
        worker = self.studio.worker
        if worker is None:
            raise VegasError("this app was started with --no-model: the sweep needs the model")
        if worker.state != "ready":
            raise EngineNotReady(worker.status_line())
        return worker, worker.info

    def _path(self, engine) -> Path:
        return cache_path(self.cache_dir, device_tag(engine.device), engine.config.name or engine.source)

    def document(self) -> tuple[dict | None, bool]:
        """(the document to draw, whether it is the cached one): the running or last sweep of this
        engine, else the cache for its device and model."""
        job = self._job
        worker = self.studio.worker
        if job is not None and job.worker is worker and job.progress.doc is not None:
            return job.progress.doc, False
        if worker is None or worker.state != "ready":
            return None, False
        return load_sweep(self._path(worker.info)), True

    def figure(self):
        doc, cached = self.document()
        return sweep_figure(doc, live_label(doc, cached) if doc else None)

    def show(self):
        """On page load and when the Overhead tab opens: (figure, status)."""
        job = self._job
        if job is not None and job.worker is self.studio.worker and not job.future.done():
            return self.figure(), self._running_line(job)
        try:
            worker, engine = self._ready_engine()
        except VegasError as e:
            return self.figure(), f"The live sweep needs the engine: {e}"
        doc, cached = self.document()
        grid = grid_line(grid_for(engine.device))
        if doc is None:
            return self.figure(), (f"Not measured with this model on {engine.device} yet. **Run sweep** measures "
                                   f"{grid} on this app's engine (vanilla, stream and vegas with the Generate tab's "
                                   "gamma, sparsity, min budget and granularity); meanwhile the engine serves no "
                                   "requests.")
        when = "cached" if cached else "this session"
        return self.figure(), (f"Measured at {measured_at(doc)} ({when}: `{self._path(engine)}`). "
                               f"**Run sweep** measures {grid} again.")

    # -- running -------------------------------------------------------------------------------
    def run(self, gamma, sparsity, min_budget, granularity):
        """Start a sweep (or watch the one running); yields (figure, status) until it ends."""
        from .studio import build_params      # studio imports this module
        try:
            worker, engine = self._ready_engine()
            _, spec = build_params("vegas", gamma, sparsity, min_budget, granularity, False, 0.0, 1.0, 0, None, 1)
            job = self._start(worker, engine, spec)
        except (VegasError, TimeoutError) as e:
            gr.Warning(str(e))
            yield gr.skip(), f"⚠ {e}"
            return
        yield from self._watch(job)

    def _start(self, worker, engine, spec) -> _Job:
        with self._lock:
            job = self._job
            if job is not None and job.worker is worker and not job.future.done():
                return job                     # already running: watch it
            progress, stop = SweepProgress(), threading.Event()
            future = worker.sweep(grid_for(engine.device), spec, progress, stop)
            self._job = _Job(worker, future, progress, stop, self._path(engine))
            return self._job

    def _watch(self, job: _Job):
        shown = None
        while not job.future.done():
            if not job.worker.alive:
                yield gr.skip(), "⚠ the engine stopped (the model was switched): the sweep ended with it"
                return
            seen = _signature(job.progress.doc)
            yield (self.figure() if seen != shown else gr.skip()), self._running_line(job)
            shown = seen
            time.sleep(POLL_S)
        note = self._finish(job)
        yield (gr.skip() if note.startswith("⚠") else self.figure()), note

    def _running_line(self, job: _Job) -> str:
        p = job.progress
        share = f" ({p.tokens / p.total_tokens:.0%})" if p.total_tokens else ""
        return (f"**Sweeping** — {p.line}{share}, {time.monotonic() - job.started:.0f} s so far. The engine "
                "refuses requests until it ends; **Stop** ends it after the current step.")

    def _finish(self, job: _Job) -> str:
        """The closing status, once per job: the sweep's outcome, and where it was cached."""
        with self._lock:
            if job.finished_note is None:
                job.finished_note = self._outcome(job)
            return job.finished_note

    def _outcome(self, job: _Job) -> str:
        try:
            doc = job.future.result()
        except VegasError as e:
            gr.Warning(str(e))
            return f"⚠ {e}"
        except Exception as e:   # the engine failed mid-sweep: say so in the page, keep the app up
            return f"⚠ the sweep failed: {type(e).__name__}: {e}"
        records = doc["records"]
        measured = sum(1 for r in records if r["methods"])
        refused = sum(1 for r in records if r["refused"])
        took = f"{time.monotonic() - job.started:.0f} s"
        if doc["stopped"]:
            return (f"Stopped after {took}: {measured} cell(s) measured, shown above; not cached (a stopped "
                    "sweep does not replace a finished one).")
        try:
            save_sweep(doc, job.path)
            where = f"cached in `{job.path}`"
        except OSError as e:
            where = f"⚠ not cached ({e})"
        return f"Done in {took}: {measured} cell(s) measured, {refused} refused (named under the plot); {where}."

    def stop(self) -> str:
        job = self._job
        if job is None or job.future.done():
            return "No sweep is running."
        job.stop.set()
        return "Stopping after the current engine step…"

    # -- export --------------------------------------------------------------------------------
    def export(self):
        """The document shown (JSON) and its figure (PNG 3× and SVG, or HTML without kaleido)."""
        doc, _ = self.document()
        if doc is None:
            gr.Warning("Nothing to export yet: run the sweep first.")
            return None, "⚠ Nothing to export yet: run the sweep first."
        out = self.studio.export_root / uuid.uuid4().hex
        out.mkdir(parents=True)
        data = out / f"sweep-{doc.get('device_tag', 'device')}.json"
        data.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        files, note = write_figures({"throughput-sweep": self.figure()}, out)
        return [str(data), *files], f"The sweep as JSON and {note}."


def _signature(doc: dict | None) -> tuple:
    """What the figure draws: it is redrawn only when a cell or a method was added."""
    if doc is None:
        return ()
    return tuple((r["batch"], r["context"], tuple(r["methods"])) for r in doc["records"])
