"""The engine in a process of its own (`ProcessWorker`, the app's default), against a tiny random
2-layer Llama on the CPU: the same contract as the in-process worker (test_worker.py) across the
pipe — every token in exactly one event, pause / advance / abort, errors of the engine's own types,
a sweep with progress and Stop — plus what only a process can do: fail to load, and die."""
from __future__ import annotations

import os
import threading
import time

import pytest

from tests.vegas_core.conftest import build_tiny_hf_model
from tests.vegas_studio_app.conftest import advance_numbers_its_iteration, drain, pool_is_free
from vegas_core.bench.sweep import Grid, SweepProgress
from vegas_core.errors import InvalidRequestError
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams
from vegas_studio_app.engine_process import ProcessWorker
from vegas_studio_app.worker import EngineBusy, EngineInfo, EngineNotReady


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")     # 512 positions
    return path


@pytest.fixture(scope="module")
def worker(model):
    w = ProcessWorker(model, "cpu", max_num_seqs=8).start()
    assert w.wait_ready(120), w.error
    yield w
    w.release()


def test_the_engine_runs_in_another_process_and_says_what_it_is(worker):
    assert worker.process.pid != os.getpid() and worker.process.is_alive()
    assert isinstance(worker.info, EngineInfo) and worker.info.mode == "reference"
    assert worker.info.device.type == "cpu" and worker.info.config.num_layers == 2
    assert worker.status_line().startswith("Ready: ") and "PyTorch reference attention" in worker.status_line()


def test_concurrent_requests_each_get_their_tokens_once_with_traces(worker):
    methods = ["vanilla", "vegas", "quest"]
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    handles = [worker.submit(f"prompt {i} the the", sampling, SpecParams(method=m, gamma=3, min_budget=2), chat=False)
               for i, m in enumerate(methods)]
    results = {}
    threads = [threading.Thread(target=lambda h=h: results.__setitem__(h.request_id, drain(h))) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for h in handles:
        events = results[h.request_id]
        final = events[-1]
        assert final.error is None and final.finish_reason == "length"
        assert [t for e in events[:-1] for t in e.new_token_ids] == final.result.token_ids
        assert len(final.result.token_ids) == 12
        assert final.trace is not None and len(final.trace.requests[0].iterations) == h.iterations_sent
        assert all(t in h.prompt_texts for t in h.prompt_ids) and h.t_accepted > 0
    assert worker.peak_active >= 1 and pool_is_free(worker)


def test_pause_advance_and_abort_cross_the_pipe(worker):
    h = worker.submit("hold me the the", SamplingParams(max_tokens=200, ignore_eos=True),
                      SpecParams(method="vegas", gamma=3), chat=False)
    sent = h.pause()
    time.sleep(0.3)
    before = h.ready()
    # `sent`: iterations before the hold took effect (0 if it came before the first); none after it
    assert sum(1 for e in before if e.iteration) == h.iterations_sent == sent
    time.sleep(0.3)
    assert h.ready() == []
    n = h.advance()
    deadline = time.monotonic() + 30
    while h.iterations_sent == n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert h.iterations_sent == n + 1                    # exactly one more iteration
    h.abort()
    final = drain(h)[-1]
    assert final.finish_reason == "abort" and h.done
    assert pool_is_free(worker)


def test_the_engines_errors_keep_their_type(worker):
    with pytest.raises(InvalidRequestError, match="beyond the model's context of 512 tokens"):
        worker.submit("the " * 600, SamplingParams(max_tokens=4), SpecParams(), chat=False)
    with pytest.raises(InvalidRequestError):
        worker.submit("", SamplingParams(max_tokens=4), SpecParams(), chat=False)
    assert pool_is_free(worker)


def test_a_sweep_reports_progress_refuses_requests_and_stops(worker):
    progress, stop = SweepProgress(), threading.Event()
    future = worker.sweep(Grid((2,), (480,), 64), SpecParams(method="vegas", gamma=3), progress, stop)
    deadline = time.monotonic() + 60
    while progress.method is None and not future.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert progress.method is not None and progress.cells == 1          # mirrored from the child
    with pytest.raises(EngineBusy, match="measuring a throughput sweep"):
        worker.submit("hello", SamplingParams(max_tokens=4), SpecParams(), chat=False)
    stop.set()
    doc = future.result(60)
    assert doc["stopped"] and progress.done and progress.doc is not None
    assert pool_is_free(worker)


def test_a_request_nobody_reads_is_aborted(model):
    w = ProcessWorker(model, "cpu", max_num_seqs=4, stale_after_s=1.0).start()
    try:
        assert w.wait_ready(120), w.error
        h = w.submit("nobody reads this", SamplingParams(max_tokens=400, ignore_eos=True), SpecParams(), chat=False)
        h.pause()           # held (a closed tab mid step-through), so it cannot finish first on a fast CPU
        deadline = time.monotonic() + 30
        while not h.done and time.monotonic() < deadline:
            time.sleep(0.2)
        assert h.done and pool_is_free(w)
        assert [e for e in h.ready() if e.finished][0].finish_reason == "abort"
    finally:
        w.release()


def test_a_new_model_starts_once_the_old_engine_process_has_exited(model):
    old = ProcessWorker(model, "cpu", max_num_seqs=4).start()
    assert old.wait_ready(120), old.error
    new = old.with_model(model).start()
    try:
        assert isinstance(new, ProcessWorker) and new.wait_ready(120), new.error
        assert old.process.exitcode == 0 and not old.alive
        assert new.process.pid != old.process.pid and new.max_num_seqs == 4
    finally:
        new.release()


def test_a_model_that_does_not_load_says_why():
    w = ProcessWorker("/nonexistent/model.gguf", "cpu").start()
    try:
        assert not w.wait_ready(120)
        assert w.state == "failed" and "does not exist" in w.error
        assert w.status_line().startswith("The model failed to load: ")
        with pytest.raises(EngineNotReady):
            w.submit("hello", SamplingParams(max_tokens=4), SpecParams(), chat=False)
    finally:
        w.release()


def test_a_dead_engine_process_ends_every_open_request_with_an_error(model):
    w = ProcessWorker(model, "cpu", max_num_seqs=4).start()
    try:
        assert w.wait_ready(120), w.error
        h = w.submit("a long one", SamplingParams(max_tokens=500, ignore_eos=True), SpecParams(), chat=False)
        assert h.get(timeout=60) is not None
        w.process.kill()
        final = drain(h, timeout=30)[-1]
        assert final.finish_reason == "error" and "the engine process stopped" in final.error
        deadline = time.monotonic() + 30
        while w.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.state == "failed" and not w.alive
        with pytest.raises(EngineNotReady, match="the engine process stopped"):
            w.submit("hello", SamplingParams(max_tokens=4), SpecParams(), chat=False)
        assert w.pool()["state"] == "failed"
    finally:
        w.release()


def test_an_engine_process_that_cannot_start_says_why(model, monkeypatch):
    import multiprocessing.context

    def refuse(self):
        raise OSError("no processes left")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)
    w = ProcessWorker(model, "cpu").start()
    try:
        assert not w.wait_ready(30)
        assert w.state == "failed"
        assert w.status_line() == ("The model failed to load: could not start the engine process "
                                   "(OSError: no processes left)")
    finally:
        w.release()


def test_advance_returns_the_number_of_the_iteration_it_runs(worker):
    advance_numbers_its_iteration(worker)
    assert pool_is_free(worker)
