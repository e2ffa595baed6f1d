"""The engine worker and the app's handlers, against a tiny random 2-layer Llama (fast on the CPU):
one thread owns the engine, concurrent requests share its batches, every token reaches its own
stream exactly once, Stop and engine failures free the KV pool, Pause holds a request in the engine
while others go on, Step (advance) runs it exactly one iteration, and Resume lets it finish."""
from __future__ import annotations

import queue
import threading
import time

import pytest

from tests.vegas_core.conftest import build_tiny_hf_model
from tests.vegas_studio_app.conftest import advance_numbers_its_iteration, drain, pool_is_free
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
    w.release()


def test_concurrent_requests_each_get_their_tokens_once(worker):
    methods = ["vanilla", "vegas", "stream", "quest", "specextend", "vegas-all"]
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    handles = [worker.submit(f"prompt {i} the the", sampling, SpecParams(method=m, gamma=3, min_budget=2), chat=False)
               for i, m in enumerate(methods)]
    results = {}

    def consume(h):
        results[h.request_id] = drain(h)

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
    assert pool_is_free(worker)
    steps = worker.pool(steps=512)["steps"]
    decoded = sum(s["tokens"] for s in steps if s["kind"] == "decode" and s["start"] >= min(
        h.t_accepted for h in handles))
    assert decoded == 12 * len(methods)            # every token these requests got, step by step
    assert all(s["start"] <= s["end"] and s["rows"] >= 1 for s in steps)
    assert "steps" not in worker.pool()


def test_bad_requests_are_refused_in_the_callers_thread(worker):
    with pytest.raises(InvalidRequestError, match="empty"):
        worker.submit("   ", SamplingParams(max_tokens=4), SpecParams(method="vanilla"), chat=False)
    with pytest.raises(InvalidRequestError, match="beyond the model's context of 512 tokens"):
        worker.submit("hello", SamplingParams(max_tokens=100_000), SpecParams(method="vanilla"), chat=False)
    assert pool_is_free(worker)


def test_abort_frees_the_pages(worker):
    h = worker.submit("count forever", SamplingParams(max_tokens=400, ignore_eos=True),
                      SpecParams(method="vegas", gamma=2, min_budget=2), chat=False)
    first = h.get(timeout=60)
    assert first is not None and not first.finished
    h.abort()
    events = [first] + drain(h)
    final = events[-1]
    assert final.finish_reason == "abort" and final.trace is not None
    assert final.trace.requests[0].finish_reason == "abort"
    assert len(final.result.token_ids) < 400
    assert pool_is_free(worker)


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
    final = drain(h)[-1]
    assert final.error and "boom" in final.error and final.finish_reason == "error"
    monkeypatch.setattr(worker.engine, "step", real_step)
    assert pool_is_free(worker)
    h2 = worker.submit("hello again", SamplingParams(max_tokens=4, ignore_eos=True), SpecParams(method="vanilla"),
                       chat=False)
    assert drain(h2)[-1].finish_reason == "length"


def test_an_untraced_request_streams_its_tokens_without_records_or_trace(worker):
    """What the API's stream_tokens submits (`trace=False`): the same tokens as a traced run of the
    same prompt, events without iteration records, no trace at the end."""
    sampling, spec = SamplingParams(max_tokens=10, ignore_eos=True), SpecParams(method="vegas", gamma=3, min_budget=2)
    *traced_events, traced = drain(worker.submit("the cat sat on", sampling, spec, chat=False))
    *events, final = drain(worker.submit("the cat sat on", sampling, spec, chat=False, trace=False))
    assert final.error is None and final.trace is None and traced.trace is not None
    assert [t for e in events for t in e.new_token_ids] == final.result.token_ids == traced.result.token_ids
    assert all(e.iteration is None for e in events) and any(e.iteration for e in traced_events)
    assert pool_is_free(worker)


def test_the_heap_is_frozen_while_serving_and_a_stopped_engine_can_be_collected(tmp_path):
    """After its load the worker takes the heap out of the collector's generations (a full collection
    of the app's heap stopped engine steps at random); when its thread ends the heap is unfrozen, so
    the engine, cycles and all, is freed."""
    import gc
    import weakref
    path, _ = build_tiny_hf_model(tmp_path, "llama")
    w = EngineWorker(path, "cpu", max_num_seqs=2).start()
    assert w.wait_ready(120), w.error
    assert gc.get_freeze_count() > 0
    engine = weakref.ref(w.engine)
    w.release()
    assert gc.get_freeze_count() == 0 and engine() is None


def _queued(handle) -> list:
    out = []
    while True:
        try:
            out.append(handle.events.get_nowait())
        except queue.Empty:
            return out


def _wait_events(handle, n: int, timeout: float = 60) -> list:
    """At least `n` more events from `handle` (none of them final)."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n:
        ev = handle.get(timeout=max(0.01, deadline - time.monotonic()))
        assert ev is not None, f"only {len(got)} of {n} events in time"
        assert not ev.finished, ev.finish_reason
        got.append(ev)
    return got


def test_pause_holds_advance_runs_one_iteration_resume_finishes(worker):
    spec = SpecParams(method="vegas", gamma=3, min_budget=2)
    held = worker.submit("the the the", SamplingParams(max_tokens=12, ignore_eos=True), spec, chat=False)
    other = worker.submit("count on and on", SamplingParams(max_tokens=300, ignore_eos=True),
                          SpecParams(method="vanilla"), chat=False)
    events = _wait_events(held, 1)
    n = held.pause()                                        # returns once held: the events so far
    events += _queued(held)
    assert n == len(events) == sum(e.iteration is not None for e in events) and n < 12
    req = worker.engine.core.requests[held.request_id]
    _wait_events(other, 3)                                  # the other request goes on ...
    assert req.held and held.events.empty()                 # ... the paused one does not
    assert held.advance() == n                              # exactly one more iteration
    ev = held.get(timeout=60)
    assert ev is not None and not ev.finished and ev.iteration["index"] == n
    events.append(ev)
    _wait_events(other, 3)
    assert req.held and held.events.empty()
    assert held.iterations_sent == n + 1
    other.abort()
    assert drain(other)[-1].finish_reason == "abort"
    steps = worker.engine.core.step_index
    time.sleep(0.3)                                         # held alone: the worker waits, no busy loop
    assert worker.engine.core.step_index - steps <= 2 and held.events.empty()
    held.resume()
    *rest, final = drain(held)
    events += rest
    assert final.finish_reason == "length" and len(final.result.token_ids) == 12
    assert [t for e in events for t in e.new_token_ids] == final.result.token_ids
    assert [e.iteration["index"] for e in events] == list(range(len(events)))
    assert pool_is_free(worker)


def test_pause_and_step_drive_the_live_run_then_walk_the_recorded_one(worker):
    studio = Studio(worker)
    gen = studio.generate("the the the", False, "vegas", 3, 0.5, 2, "layer", False, 0.0, 1.0, 0, None, 16)
    _, counters0, _ = next(gen)                             # the empty view, while prefilling
    assert "generating" in counters0
    renders = []
    streamer = threading.Thread(target=lambda: renders.extend(gen))   # Gradio drives the stream
    streamer.start()
    s = studio.store.get(None)
    label, _, counters, _, _ = studio.pause()
    n = len(s.live_iterations)
    assert label["value"] == "Resume" and f'data-counter="iterations">{n}<' in counters and "paused" in counters
    time.sleep(0.3)
    assert len(s.live_iterations) == n and s.running       # held: nothing more arrives
    for k in (n + 1, n + 2):                                # each Step runs exactly one iteration
        label, _, counters, stages, kv = studio.step()
        assert f'data-counter="iterations">{k}<' in counters and f'data-iteration="{k}"' in stages   # one numbering
        assert [c for c in ("draft", "verify", "accept", "select") if f'data-stage="{c}"' in stages] == \
            ["draft", "verify", "accept", "select"]
        assert kv["value"] == k and len(s.live_iterations) == k
        if k > 1:   # live, as it happens: the set this iteration's Select kept, a strip row per layer
            assert "kept for the next drafts" in stages and stages.count('data-layer="') >= 2 * worker.engine.config.num_layers
    label, *_ = studio.pause()                              # resume: the run goes on to the end
    assert label["value"] == "Pause"
    streamer.join(60)
    assert not streamer.is_alive() and not s.paused
    assert "done (length)" in renders[-1][1] and 'data-counter="tokens">16<' in renders[-1][1]
    n_it = len(s.live_iterations)
    assert n_it > n + 2
    # After the run, Step walks through the recorded iterations from the first one.
    _, stream, counters, stages, _ = studio.step()
    assert 'data-iteration="1"' in stages and 'data-counter="iterations">1<' in counters
    _, stream, counters, stages, _ = studio.step()
    assert 'data-iteration="2"' in stages and 'data-counter="iterations">2<' in counters
    label, stream, counters, stages, _ = studio.pause()     # resume: the whole run
    assert label["value"] == "Pause" and 'data-counter="tokens">16<' in counters
    assert pool_is_free(worker)


@pytest.mark.filterwarnings("ignore::UserWarning")   # gr.Warning outside a Gradio request
def test_generate_refuses_bad_input_with_a_message(worker):
    studio = Studio(worker)
    for args, needle in [(("",), "prompt is empty"),
                         (("x" * 30_000,), "context of 512 tokens: shorten the prompt"),
                         (("hi", False, "warp"), "unknown method")]:
        full = list(args) + [False, "vegas", 3, 0.5, 2, "layer", False, 0.0, 1.0, 0, None, 8][len(args) - 1:]
        out = list(studio.generate(*full))
        assert len(out) == 1 and needle in out[0][1], (needle, out[0][1])
    bad_gamma = list(studio.generate("hi", False, "vegas", 99, 0.5, 2, "layer", False, 0.0, 1.0, 0, None, 8))
    assert "gamma" in bad_gamma[0][1]
    bad_temp = list(studio.generate("hi", False, "vegas", 3, 0.5, 2, "layer", False, -1, 1.0, 0, None, 8))
    assert "temperature" in bad_temp[0][1]


def test_status_line_names_the_model_device_and_attention_path(worker):
    line = worker.status_line()
    assert line.startswith("Ready: ") and "on cpu (float32, PyTorch reference attention)" in line


def test_the_apps_engine_asks_for_batch_invariant_kernels(worker):
    """Compare's verdict says which arithmetic ran: on a GPU the batch-invariant kernels (the app's
    default), here the float32 reference path (which has no such mode)."""
    from vegas_studio_app.studio import compare_mode
    assert worker.deterministic and worker.engine.core.options.deterministic
    assert worker.engine.mode == "reference"
    assert compare_mode(worker.engine.mode, worker.engine.dtype) == "float32 reference path"
    assert "bit for bit" in compare_mode("deterministic", "torch.bfloat16")
    assert "--deterministic" in compare_mode("default", "torch.bfloat16")
    assert "not batch-invariant" in compare_mode("default", "torch.bfloat16", asked=True)   # Gemma 3
    assert worker.with_model(None).deterministic


def test_advance_returns_the_number_of_the_iteration_it_runs(worker):
    advance_numbers_its_iteration(worker)
    assert pool_is_free(worker)
