"""The Overhead tab's live sweep on the app's own engine (a tiny random Llama behind a real
`EngineWorker`): progress while it runs, the cache a restart shows, requests refused while it
runs and a sweep refused while requests are on the engine, Stop, export, and the page's wiring."""
from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.vegas_core.conftest import build_tiny_hf_model
from tests.vegas_studio_app.conftest import pool_is_free
from vegas_core.bench import sweep as bench_sweep
from vegas_core.bench.sweep import Grid
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams
from vegas_studio_app.studio import Studio
from vegas_studio_app.sweep_view import cache_path, load_sweep
from vegas_studio_app.worker import EngineBusy, EngineWorker

# Gradio's gr.Warning outside a request is a UserWarning.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SETTINGS = (3, 0.3, 4, "layer")        # the Generate tab's gamma, sparsity, min budget, granularity


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")     # 512 positions
    w = EngineWorker(path, "cpu", max_num_seqs=8).start()
    assert w.wait_ready(120), w.error
    yield w
    w.release()


@pytest.fixture
def studio(worker, tmp_path, monkeypatch):
    # A small grid with one cell past the tiny model's 512 positions (the app's CPU grid takes longer).
    monkeypatch.setitem(bench_sweep.GRIDS, "cpu", Grid((1, 2), (96, 600), 4))
    return Studio(worker, export_root=str(tmp_path / "exports"), sweep_cache_dir=str(tmp_path / "sweeps"))


def test_a_sweep_runs_on_the_apps_engine_with_progress_and_a_restart_shows_it_cached(studio, worker, tmp_path):
    fig, status = studio.sweep.show()
    assert status.startswith("Not measured with this model on cpu yet") and fig.layout.meta["empty"]
    out = list(studio.sweep.run(*SETTINGS))
    statuses = [s for _, s in out]
    assert statuses[0].startswith("**Sweeping** — ")
    final_fig, final = out[-1]
    assert final.startswith("Done in ") and "2 cell(s) measured, 2 refused" in final
    [path] = (tmp_path / "sweeps").glob("sweep-cpu-*.json")
    assert f"cached in `{path}`" in final
    doc = load_sweep(path)
    assert [(r["batch"], r["context"], bool(r["refused"])) for r in doc["records"]] == \
        [(1, 96, False), (2, 96, False), (1, 600, True), (2, 600, True)]
    assert doc["settings"] == dict(gamma=3, sparsity=0.3, min_budget=4, granularity="layer")
    assert [t.name for t in final_fig.data][:4] == ["bandwidth bound", "vanilla", "stream", "vegas"]
    assert pool_is_free(worker)
    # The next start (a new Studio on the same cache) shows it, labelled as cached with its time.
    again = Studio(worker, sweep_cache_dir=str(tmp_path / "sweeps"))
    fig, status = again.sweep.show()
    assert status.startswith("Measured at ") and "(cached: " in status
    assert fig.layout.meta["provenance"].endswith("cached, Run sweep measures again")
    assert fig.layout.meta["date"] == doc["date"]


def test_no_request_shares_the_engine_with_a_sweep(studio, worker):
    # A request on the engine: the sweep is refused.
    h = worker.submit("hello there", SamplingParams(max_tokens=400, ignore_eos=True), SpecParams(), chat=False)
    *_, (fig, status) = list(studio.sweep.run(*SETTINGS))
    assert status.startswith("⚠ 1 request(s) are on the engine") and fig is not None
    h.abort()
    while not h.done or h.events.qsize():
        h.get(timeout=1)
    # A sweep on the engine: requests are refused, the pool still answers, Stop ends it.
    from vegas_core.bench.sweep import SweepProgress
    progress, stop = SweepProgress(), threading.Event()
    future = worker.sweep(Grid((2,), (480,), 64), SpecParams(method="vegas", gamma=3), progress, stop)
    while progress.method is None and not future.done():
        time.sleep(0.05)
    with pytest.raises(EngineBusy, match="measuring a throughput sweep"):
        worker.submit("hello", SamplingParams(max_tokens=4), SpecParams(), chat=False)
    assert worker.pool()["state"] == "ready"
    stop.set()
    doc = future.result(60)
    assert doc["stopped"] and pool_is_free(worker)
    assert gc.get_freeze_count() > 0        # the sweep's measurement left the app's heap frozen


def test_stop_ends_the_running_sweep_and_it_is_not_cached(studio, worker, tmp_path, monkeypatch):
    monkeypatch.setitem(bench_sweep.GRIDS, "cpu", Grid((2,), (480,), 64))
    assert studio.sweep.stop() == "No sweep is running."
    run = studio.sweep.run(*SETTINGS)
    next(run)
    while studio.sweep._job.progress.method is None:
        time.sleep(0.05)
    assert studio.sweep.stop().startswith("Stopping")
    *_, (_, final) = list(run)
    assert final.startswith("Stopped after ") and "not cached" in final
    assert not (tmp_path / "sweeps").exists() and pool_is_free(worker)


def test_export_writes_the_json_and_the_figure(studio, tmp_path):
    files, note = studio.sweep.export()
    assert files is None and note.startswith("⚠ Nothing to export yet")
    list(studio.sweep.run(*SETTINGS))
    files, note = studio.sweep.export()
    data = json.loads(Path(files[0]).read_text())
    assert files[0].endswith("sweep-cpu.json") and data["records"] and data["grid"]["contexts"] == [96, 600]
    # PNG and SVG through kaleido where the test machine has Chromium (scripts/test.sh installs it)
    expected = [".png", ".svg"] if os.path.exists("/usr/bin/chromium") else [".html"]
    assert sorted(Path(f).suffix for f in files[1:]) == expected, note
    assert "throughput-sweep" in studio._all_figures(studio.store.get(None), (None, 1, 0, 128), None)


def test_the_cache_is_one_file_per_device_and_model(tmp_path):
    assert cache_path(tmp_path, "h200", "SmolLM2-135M-Instruct").name == "sweep-h200-smollm2-135m-instruct.json"
    assert load_sweep(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert load_sweep(tmp_path / "bad.json") is None


def test_the_overhead_tab_wires_run_stop_and_export_beside_the_committed_figure(tmp_path):
    from vegas_studio_app.ui import build_ui
    studio = Studio(None, sweep_cache_dir=str(tmp_path))
    demo = build_ui(studio)
    ids = {c["id"]: c.get("props", {}).get("elem_id") for c in demo.get_config_file()["components"]}
    labels = {c.get("props", {}).get("elem_id"): c.get("props", {}).get("label")
              for c in demo.get_config_file()["components"]}
    assert "from a committed file" in labels["throughput-plot"] and "measured live" in labels["sweep-plot"]
    wired = {}
    for fn in demo.fns.values():
        if fn.fn is not None and fn.fn.__qualname__.startswith("SweepView."):
            wired.setdefault(fn.fn.__name__, []).append(
                ([ids.get(t[0]) for t in fn.targets], [o.elem_id for o in fn.outputs], [i.elem_id for i in fn.inputs]))
    assert (["sweep-btn"], ["sweep-plot", "sweep-status"], ["gamma", "sparsity", "min-budget", None]) in wired["run"]
    assert wired["stop"] == [(["sweep-stop"], ["sweep-status"], [])]
    assert wired["export"] == [(["sweep-export"], ["sweep-files", "sweep-status"], [])]
    assert len(wired["show"]) == 2                    # on load and when the Overhead tab opens
    # No model: the view says why instead of failing.
    fig, status = studio.sweep.show()
    assert "started with --no-model" in status and fig.layout.meta["empty"]
