"""Continuous batching on the embedded model: a batch of mixed-length prompts decodes exactly as each
prompt alone (fp32, greedy), also when pages run out mid-batch and requests are preempted."""
import pytest

from vegas_core.engine import Engine
from vegas_core.options import EngineOptions
from vegas_core.sampling import SamplingParams

PROMPTS = ["Hi", "What is the capital of France?", "Write a haiku about autumn leaves in the forest.",
           "Explain in two sentences why the sky is blue, as if to a child who asks every day."]
GEN = 20


@pytest.fixture(scope="module")
def alone(engine):
    return [engine.generate([p], SamplingParams(max_tokens=GEN, ignore_eos=True), chat=True)[0].token_ids
            for p in PROMPTS]


def test_batch_equals_alone(engine, alone):
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=GEN, ignore_eos=True), chat=True)
    assert [r.token_ids for r in results] == alone
    assert engine.core.allocator.num_free == engine.core.allocator.num_blocks


def test_batch_equals_alone_when_pages_run_out(default_model, alone):
    # 12 pages of 16 slots hold about 190 tokens; the four requests need about 270 together, so
    # the newest are preempted and recomputed while the others run.
    small = Engine(device="cpu", dtype="float32", loaded=default_model,
                   options=EngineOptions(num_blocks=12, block_size=16, max_prefill_tokens=64))
    results = small.generate(PROMPTS, SamplingParams(max_tokens=GEN, ignore_eos=True), chat=True)
    assert [r.token_ids for r in results] == alone
    assert sum(r.num_preemptions for r in results) > 0
    assert small.core.allocator.num_free == 12


def test_requests_join_and_leave_at_any_step(engine, alone):
    core_reqs = [engine.add(PROMPTS[0], SamplingParams(max_tokens=GEN, ignore_eos=True), chat=True)]
    for _ in range(5):
        engine.step()
    core_reqs.append(engine.add(PROMPTS[2], SamplingParams(max_tokens=GEN, ignore_eos=True), chat=True))
    short = engine.add(PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True), chat=True)
    while not all(r.finished for r in core_reqs + [short]):
        engine.step()
    assert [r.output_ids for r in core_reqs] == [alone[0], alone[2]]
    assert short.output_ids == alone[1][:3] and short.finish_reason == "length"


def test_default_model_greedy_answer_is_pinned(engine):
    [res] = engine.generate(["What is the capital of France? Answer in one sentence."],
                            SamplingParams(max_tokens=16), chat=True)
    assert res.text == "The capital of France is Paris."
    assert res.token_ids[:6] == [504, 3575, 282, 4649, 314, 7042]
    assert res.finish_reason == "stop"


def test_stop_strings_and_streaming_text(engine):
    sampling = SamplingParams(max_tokens=16, stop=("Paris",))
    events = list(engine.stream("What is the capital of France? Answer in one sentence.", sampling, chat=True))
    assert "".join(e.text_delta for e in events) == "The capital of France is "
    assert events[-1].finished and events[-1].finish_reason == "stop"
    assert engine.core.allocator.num_free == engine.core.allocator.num_blocks


def test_pause_holds_a_request_and_step_advances_one_iteration(engine, alone):
    sampling = SamplingParams(max_tokens=GEN, ignore_eos=True)
    held = engine.add(PROMPTS[1], sampling, chat=True)
    other = engine.add(PROMPTS[0], sampling, chat=True)
    while held.needs_prefill or other.needs_prefill:
        engine.step()
    engine.step()
    engine.pause(held.request_id)
    n, pages = len(held.output_ids), list(engine.core.allocator.block_table(held.request_id))
    for _ in range(3):
        engine.step()
    assert len(held.output_ids) == n and len(other.output_ids) > 1    # the other request went on
    assert engine.core.allocator.block_table(held.request_id) == pages  # pages kept while held
    engine.resume(held.request_id, iterations=1)
    engine.step()
    assert len(held.output_ids) == n + 1 and held.held                # one iteration, then held again
    engine.resume(held.request_id)
    while not (held.finished and other.finished):
        engine.step()
    assert held.output_ids == alone[1] and other.output_ids == alone[0]


def test_kv_pool_sizing():
    """Asked-for size wins; a CPU gets 1 GiB; a GPU gets a fraction of what is free after the
    weights, less the activation reserve, and a clear error when nothing is left."""
    import torch

    from vegas_core.kv_cache import ACTIVATION_RESERVE, kv_pool_bytes
    from vegas_core.options import EngineOptions
    from vegas_core.errors import InvalidRequestError

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert kv_pool_bytes(gpu, EngineOptions(kv_cache_bytes=123), 10, free_bytes=1 << 40) == 123
    assert kv_pool_bytes(cpu, EngineOptions(), 10) == 1 << 30
    free, weights = 100 << 30, 10 << 30
    got = kv_pool_bytes(gpu, EngineOptions(gpu_memory_fraction=0.5), weights, free_bytes=free)
    assert got == int(90 * 2**30 * 0.5) - ACTIVATION_RESERVE
    with pytest.raises(InvalidRequestError, match="no GPU memory left"):
        kv_pool_bytes(gpu, EngineOptions(), weights, free_bytes=weights + (1 << 30))

