"""One engine, many callers: threads get the tokens they would get alone, batch calls check every
prompt before queuing any, every way out of `stream` / `generate` frees the request, nothing spins,
and stop strings cut speculative output exactly where one-token steps would."""
import gc
import threading

import pytest

from vegas_core.errors import InvalidRequestError
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at",
           "My favourite colour is", "The quick brown fox", "In 1492,", "Dear Sir,"]
GREEDY = SamplingParams(max_tokens=5, ignore_eos=True)


def _idle(engine):
    """Nothing queued, no tracker, every page free."""
    core = engine.core
    return (not core.requests and not core.has_work and not engine._trackers
            and core.allocator.num_free == core.allocator.num_blocks)


@pytest.fixture(scope="module")
def alone(engine):
    return {p: engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS}


def test_threads_sharing_an_engine_get_what_they_would_alone(engine, alone):
    got, errors = {}, []

    def caller(i):
        try:
            for p in (PROMPTS[2 * i], PROMPTS[2 * i + 1]):
                if i % 2:
                    got[p] = [t for ev in engine.stream(p, GREEDY) for t in ev.new_token_ids]
                else:
                    got[p] = engine.generate([p], GREEDY)[0].token_ids
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(PROMPTS) // 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and got == alone
    assert _idle(engine)


def test_generate_checks_every_prompt_before_queuing_any(engine):
    with pytest.raises(InvalidRequestError, match="2 sampling parameters for 3 prompts"):
        engine.generate(["a b", "c d", "e f"], [SamplingParams(max_tokens=2)] * 2)
    with pytest.raises(InvalidRequestError, match="prompt 2: the prompt is empty"):
        engine.generate(["hello there", "world peace", ""], GREEDY)
    with pytest.raises(InvalidRequestError, match="prompt 1: token id 99999999 is outside"):
        engine.generate(["hello there", [1, 99999999]], GREEDY)
    assert _idle(engine)
    [res] = engine.generate(["hello there"], GREEDY)   # nothing left over runs inside it
    assert len(res.token_ids) == GREEDY.max_tokens and _idle(engine)


def test_generate_frees_its_requests_when_the_caller_raises(engine):
    def progress(events):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPTS[:3], GREEDY, progress=progress)
    assert _idle(engine)


def test_every_way_out_of_stream_frees_the_request(engine, alone):
    for _ in range(5):                                     # break: the loop drops the generator
        for _ev in engine.stream(PROMPTS[0], GREEDY):
            break
    kept = engine.stream(PROMPTS[1], GREEDY)               # kept, not iterated: it must not decode
    first = next(kept)
    n = len(first.new_token_ids)
    [res] = engine.generate([PROMPTS[0]], GREEDY)
    assert res.token_ids == alone[PROMPTS[0]]
    assert len(engine.core.requests) == 1 and sum(len(r.output_ids) for r in engine.core.requests.values()) == n
    rest = [t for ev in kept for t in ev.new_token_ids]   # picks up where it stopped
    assert first.new_token_ids + rest == alone[PROMPTS[1]] and _idle(engine)
    dropped = engine.stream(PROMPTS[2], GREEDY)
    next(dropped)
    del dropped
    gc.collect()
    assert _idle(engine)


def test_run_returns_when_only_held_requests_are_left(engine):
    core = engine.core
    req = core.add_request(engine.tokenizer.encode(PROMPTS[0]), GREEDY)
    while not req.output_ids:
        core.step()
    core.pause(req.request_id)
    runner = threading.Thread(target=core.run, daemon=True)
    runner.start()
    runner.join(10)
    spinning = runner.is_alive()
    core.abort(req.request_id)   # ends a spinning run() too
    runner.join(10)
    assert not spinning and _idle(engine)


@pytest.mark.parametrize("iterations", [0, -1, 1.5, True])
def test_resume_refuses_iterations_that_never_progress(engine, iterations):
    with pytest.raises(InvalidRequestError, match="iterations must be None"):
        engine.resume(0, iterations=iterations)


@pytest.mark.parametrize("prompt,message", [
    (None, "the prompt must be text or a list of token ids, got NoneType"),
    (b"hello", "the prompt must be text or a list of token ids, got bytes"),
    ("caf\udce9", "the prompt is not valid UTF-8 text: byte 0xe9 at character 3"),
    ("\ud800 x", "the prompt is not valid UTF-8 text: lone surrogate U+D800 at character 0"),
])
def test_prompts_that_are_not_text_are_named(engine, prompt, message):
    with pytest.raises(InvalidRequestError) as e:
        engine.add(prompt, GREEDY)
    assert str(e.value) == message and _idle(engine)


@pytest.mark.parametrize("method", ["vegas", "stream", "quest"])
def test_stop_string_cuts_speculative_output_where_vanilla_stops(engine, method):
    sampling = SamplingParams(max_tokens=16, stop=("The answer",))
    [vanilla] = engine.generate(["The capital of France is"], sampling, SpecParams(method="vanilla"))
    spec = SpecParams(method=method, gamma=6, min_budget=4)
    [res] = engine.generate(["The capital of France is"], sampling, spec)
    events = list(engine.stream("The capital of France is", sampling, spec))
    assert vanilla.finish_reason == res.finish_reason == events[-1].finish_reason == "stop"
    assert res.token_ids == vanilla.token_ids == [t for ev in events for t in ev.new_token_ids]
    assert res.text == vanilla.text == "".join(ev.text_delta for ev in events)
    assert _idle(engine)
