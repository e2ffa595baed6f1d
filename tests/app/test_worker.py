"""The engine worker and the app's handlers, against a tiny random 2-layer Llama (fast on the CPU):
one thread owns the engine, concurrent requests share its batches, every token reaches its own
stream exactly once, Stop and engine failures free the KV pool, and Pause / Step hold the view."""
from __future__ import annotations

import threading

import pytest

from tests.vegas_core.conftest import build_tiny_hf_model
from vegas_core.errors import InvalidRequestError
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams
from vegas_studio_app.studio import Studio
from vegas_studio_app.worker import EngineWorker


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")
    w = EngineWorker(path, "cpu", max_num_seqs=8).start()
    assert w.wait_ready(120), w.error
    yield w
    w.shutdown()


def _drain(handle, timeout=120):
    events = []
    while True:
        ev = handle.get(timeout=timeout)
        assert ev is not None, "no event in time"
        events.append(ev)
        if ev.finished:
            return events


def _pool_is_free(worker):
    p = worker.pool()
    return p["num_free"] == p["num_blocks"] and p["active_requests"] == 0


def test_concurrent_requests_each_get_their_tokens_once(worker):
    methods = ["vanilla", "vegas", "stream", "quest", "specextend", "vegas-all"]
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    handles = [worker.submit(f"prompt {i} the the", sampling, SpecParams(method=m, gamma=3, min_budget=2), chat=False)
               for i, m in enumerate(methods)]
    results = {}

    def consume(h):
        results[h.request_id] = _drain(h)

    threads = [threading.Thread(target=consume, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert worker.peak_active >= len(methods)
    for h in handles:
        *events, final = results[h.request_id]
        assert final.error is None and final.finish_reason == "length"
        ids = [t for e in events for t in e.new_token_ids]
        assert ids == final.result.token_ids and len(ids) == 12
        assert "".join(e.text_delta for e in events) == final.result.text
        assert final.trace.requests[0].output_token_ids == ids
        assert all(t in final.trace.token_texts for t in ids)
    assert _pool_is_free(worker)


def test_bad_requests_are_refused_in_the_callers_thread(worker):
    with pytest.raises(InvalidRequestError, match="empty"):
        worker.submit("   ", SamplingParams(max_tokens=4), SpecParams(method="vanilla"), chat=False)
    with pytest.raises(InvalidRequestError, match="context length"):
        worker.submit("hello", SamplingParams(max_tokens=100_000), SpecParams(method="vanilla"), chat=False)
    assert _pool_is_free(worker)


def test_abort_frees_the_pages(worker):
    h = worker.submit("count forever", SamplingParams(max_tokens=400, ignore_eos=True),
                      SpecParams(method="vegas", gamma=2, min_budget=2), chat=False)
    first = h.get(timeout=60)
    assert first is not None and not first.finished
    h.abort()
    events = [first] + _drain(h)
    final = events[-1]
    assert final.finish_reason == "abort" and final.trace is not None
    assert final.trace.requests[0].finish_reason == "abort"
    assert len(final.result.token_ids) < 400
    assert _pool_is_free(worker)


def test_an_engine_failure_fails_the_request_not_the_worker(worker, monkeypatch):
    calls = {"n": 0}
    real_step = worker.engine.step

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(worker.engine, "step", flaky_step)
    h = worker.submit("hello there", SamplingParams(max_tokens=8, ignore_eos=True), SpecParams(method="vanilla"),
                      chat=False)
    final = _drain(h)[-1]
    assert final.error and "boom" in final.error and final.finish_reason == "error"
    monkeypatch.setattr(worker.engine, "step", real_step)
    assert _pool_is_free(worker)
    h2 = worker.submit("hello again", SamplingParams(max_tokens=4, ignore_eos=True), SpecParams(method="vanilla"),
                       chat=False)
    assert _drain(h2)[-1].finish_reason == "length"


def test_pause_holds_the_view_and_step_advances(worker):
    studio = Studio(worker)
    gen = studio.generate("the the the", False, "vegas", 3, 0.5, 2, "layer", False, 0.0, 1.0, 0, None, 16)
    stream0, counters0, _ = next(gen)                       # the empty view, while prefilling
    assert "generating" in counters0
    studio.pause()                                          # pause before any iteration is shown
    renders = list(gen)                                     # the engine finishes the request anyway
    stream, counters, stages = renders[-1]
    s = studio.store.get(None)
    assert s.paused and s.revealed == 0 and len(s.live_iterations) >= 2
    assert 'data-counter="tokens">0<' in counters and "paused at iteration 0" in counters
    _, stream, counters, stages, _ = studio.step()
    assert 'data-iteration="0"' in stages and 'data-counter="iterations">1<' in counters
    _, stream, counters, stages, _ = studio.step()
    assert 'data-iteration="1"' in stages and 'data-counter="iterations">2<' in counters
    label, stream, counters, stages, _ = studio.pause()     # resume: the whole run
    assert label["value"] == "Pause" and 'data-counter="tokens">16<' in counters
    assert _pool_is_free(worker)


@pytest.mark.filterwarnings("ignore::UserWarning")   # gr.Warning outside a Gradio request
def test_generate_refuses_bad_input_with_a_message(worker):
    studio = Studio(worker)
    for args, needle in [(("",), "prompt is empty"), (("x" * 30_000,), "limit"),
                         (("hi", False, "warp"), "unknown method")]:
        full = list(args) + [False, "vegas", 3, 0.5, 2, "layer", False, 0.0, 1.0, 0, None, 8][len(args) - 1:]
        out = list(studio.generate(*full))
        assert len(out) == 1 and needle in out[0][1], (needle, out[0][1])
    bad_gamma = list(studio.generate("hi", False, "vegas", 99, 0.5, 2, "layer", False, 0.0, 1.0, 0, None, 8))
    assert "gamma" in bad_gamma[0][1]
    bad_temp = list(studio.generate("hi", False, "vegas", 3, 0.5, 2, "layer", False, -1, 1.0, 0, None, 8))
    assert "temperature" in bad_temp[0][1]
