"""Tracing keeps the CUDA-graph path's chains and run-ahead on (`overlap.py`), and records exactly
what the engine records one step at a time: the trace comes from what the iteration reads anyway
(drafts, acceptance, the selected sets copied to the host as they are made), never from a host
read in the middle of a chain.

As tests/vegas_core/test_graphs.py does, on the CPU the graphs run uncaptured (`cuda_graphs=
"static"`) through their static buffers under Triton's interpreter: chains, run-ahead and early
launch take the same decisions as on a GPU. Each case runs three engines on a tiny 2-layer Llama:
traced with chains and run-ahead (the default), traced with neither (multi_step=1,
run_ahead=False), and untraced. The tokens are the same in all three; the records and the
per-step extras (`selected`, `accept_draws`) are the same in the two traced ones, but for the
engine step a record names and its timings (a chained vanilla decode is one engine step)."""
import os

import pytest
import torch

from vegas_core.engine import Engine
from vegas_core.engine_core import EngineCore
from vegas_core.loader import load_model
from vegas_core.options import EngineOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

GPU = os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
GRAPHS = "auto" if GPU else "static"
STEP_FIELDS = ("step", "draft_ms", "verify_ms", "select_ms", "start_s")   # which engine step, and its times


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", seed=5)
    return load_model(path)


def _options(**kw) -> EngineOptions:
    return EngineOptions(block_size=16, num_blocks=64, max_num_seqs=8, attention="triton", cuda_graphs=GRAPHS, **kw)


def _core(loaded, **kw) -> EngineCore:
    return EngineCore(loaded.config, loaded.weights, DEVICE, torch.float32, _options(**kw))


def test_tracing_keeps_multi_step_chains_and_run_ahead(tiny):
    traced = _core(tiny, trace=True)
    assert traced.decode_steps == traced.options.multi_step > 1 and traced.overlap.enabled
    off = _core(tiny, trace=True, multi_step=1, run_ahead=False)
    assert off.decode_steps == 1 and not off.overlap.enabled
    eager = EngineCore(tiny.config, tiny.weights, "cpu", torch.float32,
                       EngineOptions(num_blocks=64, trace=True, attention="reference"))
    assert eager.runner.graphs is None and eager.decode_steps == 1 and not eager.overlap.enabled


def _prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 262, (n,), generator=g).tolist() for n in (21, 38)]


def _run(core, batch):
    reqs = [core.add_request(p, sa, sp) for p, (sp, sa) in zip(_prompts(), batch)]
    extras = {r.request_id: [] for r in reqs}
    while core.has_work:
        for out in core.step():
            if out.selected is not None or out.accept_draws is not None:
                extras[out.request.request_id].append((out.iterations[0]["index"], out.selected, out.accept_draws))
    records = [[{k: v for k, v in it.items() if k not in STEP_FIELDS} for it in r.iterations] for r in reqs]
    return [r.output_ids for r in reqs], records, [extras[r.request_id] for r in reqs]


GREEDY = SamplingParams(max_tokens=7, ignore_eos=True)
CASES = {
    # 18 plain steps: a chain of 16, then one of 2 queued behind it; one record per step.
    "vanilla": [(SpecParams(method="vanilla"), SamplingParams(max_tokens=18, ignore_eos=True))] * 2,
    "vegas": [(SpecParams(method="vegas", gamma=2, sparsity=0.3, min_budget=4), GREEDY)] * 2,
    # Quest's first draft step's sets, written out by that step's graph.
    "quest": [(SpecParams(method="quest", gamma=2, sparsity=0.3, min_budget=4, granularity="kv-head"), GREEDY)],
    # Sampled drafts in the graph, the rejection sampler's draws; one greedy request among them.
    "sampled": [(SpecParams(method="stream", gamma=2, sparsity=0.3, min_budget=4),
                 SamplingParams(max_tokens=7, ignore_eos=True, temperature=0.8, top_p=0.9, seed=3)),
                (SpecParams(method="specextend", gamma=2, sparsity=0.3, min_budget=4, granularity="kv-head"), GREEDY)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_traced_chains_record_what_one_step_at_a_time_records(tiny, case):
    batch = CASES[case]
    chained = _core(tiny, trace=True)
    tokens, records, extras = _run(chained, batch)
    stepwise = _core(tiny, trace=True, multi_step=1, run_ahead=False)
    assert _run(stepwise, batch) == (tokens, records, extras)
    assert _run(_core(tiny), batch)[0] == tokens
    assert chained.chains["ahead_used"] > 0, chained.chains           # run-ahead stayed on
    for (spec, sampling), out, recs in zip(batch, tokens, records):
        assert len(out) == sampling.max_tokens
        assert [t for it in recs for t in it["emitted"]] == out
        assert [it["index"] for it in recs] == list(range(len(recs)))
        if not spec.speculative:
            assert len(recs) == len(out)
            continue
        assert any(it["drafts"] for it in recs)
        assert all(it["selection"] is not None for it in recs if it["drafts"])
    assert [len(e) for e in extras] == [0 if not spec.speculative else
                                        len(recs) if spec.method != "quest" else 0
                                        for (spec, _), recs in zip(batch, records)]
    graphs = chained.runner.graphs.graphs
    if case == "vanilla":   # plain steps chained: fewer engine steps than records
        assert chained.step_index < stepwise.step_index
        assert any(k.kind == "dense" and k.chain for k in graphs)
    else:                   # drafts chained, the next chain launched behind the verification
        assert any(k.kind != "dense" and k.chain for k in graphs)
        if case != "sampled":          # (specextend selects after acceptance: no early launch)
            assert chained.chains["early_used"] > 0, chained.chains
    if case == "quest":
        assert any(k.keep_sets for k in graphs) and records[0][-1]["selection"]["granularity"] == "kv-head"
    if case == "sampled":
        draws = [d for _, _, d in extras[0] if d is not None]
        assert draws and all(0.0 <= u < 1.0 for d in draws for u in d)


@pytest.mark.parametrize("case", ["vegas", "sampled"])
def test_an_untraced_request_in_a_traced_batch_records_nothing_and_changes_nothing(tiny, case):
    """Tracing is per request (`add_request(trace=...)`, default `EngineOptions.trace`): in a
    traced engine a request added untraced gets no records or extras, its traced neighbour the
    same records as in an all-traced batch, and every token is the same."""
    batch = CASES[case]
    tokens, records, extras = _run(_core(tiny, trace=True), batch)
    core = _core(tiny, trace=True)
    reqs = [core.add_request(p, sa, sp, trace=i == 0) for i, (p, (sp, sa)) in enumerate(zip(_prompts(), batch))]
    seen = {r.request_id: [] for r in reqs}
    while core.has_work:
        for out in core.step():
            seen[out.request.request_id].append((out.iterations, out.selected, out.accept_draws))
    assert [r.trace for r in reqs] == [True, False]
    assert [r.output_ids for r in reqs] == tokens
    assert [{k: v for k, v in it.items() if k not in STEP_FIELDS} for it in reqs[0].iterations] == records[0]
    assert reqs[1].iterations == [] and all(e == ([], None, None) for e in seen[reqs[1].request_id])
    assert _core(tiny).add_request(_prompts()[0], GREEDY, trace=True).trace


def test_a_chained_decode_streams_one_event_per_step_and_stops_inside_the_chain(tiny):
    """The front end gives one event (and record) per plain step of a traced chain, as one step at
    a time does; a stop string inside the chain ends the output, the trace and the events there,
    as it does one step at a time."""
    engines = [Engine(device=DEVICE, dtype="float32", options=_options(trace=True, **kw), loaded=tiny)
               for kw in ({}, dict(multi_step=1, run_ahead=False))]
    prompt, sampling = [5, 17, 99, 42, 8, 230, 61], SamplingParams(max_tokens=18, ignore_eos=True)
    events = list(engines[0].stream(prompt, sampling))
    out = engines[0].last_result
    assert [len(e.new_token_ids) for e in events] == [1] * 18 and [e.finished for e in events][-2:] == [False, True]
    assert [e.iteration["index"] for e in events] == list(range(18))
    assert [e.iteration["emitted"] for e in events] == [[t] for t in out.token_ids]
    assert "".join(e.text_delta for e in events) == out.text
    assert len({e.iteration["step"] for e in events}) < 18             # several steps per engine step
    # A stop string that first shows at a token inside the first chain.
    text, at = "", None
    for j, e in enumerate(events):
        if 2 <= j < 12 and e.text_delta and e.text_delta[-1] not in text + e.text_delta[:-1]:
            stop, at = e.text_delta[-1], j
            break
        text += e.text_delta
    assert at is not None
    runs = []
    for engine in engines:
        evs = list(engine.stream(prompt, SamplingParams(max_tokens=18, ignore_eos=True, stop=[stop])))
        res = engine.last_result
        assert res.finish_reason == "stop" and res.token_ids == out.token_ids[:at + 1] and stop not in res.text
        assert len(evs) == len(res.iterations) == at + 1 and evs[-1].finished
        assert [t for it in res.iterations for t in it["emitted"]] == res.token_ids
        runs.append(([(e.text_delta, e.new_token_ids) for e in evs],
                     [{k: v for k, v in it.items() if k not in STEP_FIELDS} for it in res.iterations]))
    assert runs[0] == runs[1]
