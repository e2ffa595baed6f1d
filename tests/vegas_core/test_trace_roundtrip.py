"""A trace recorded by the engine saves and loads to an identical object, and carries what the
app and the exports read."""
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams
from vegas_core.trace import load_trace, save_trace
from vegas_core.trace_builder import build_trace


def test_engine_trace_roundtrip(engine, tmp_path):
    spec = SpecParams(method="vegas", gamma=4, sparsity=0.05, min_budget=8, record_recall=True)
    sampling = SamplingParams(max_tokens=16, ignore_eos=True)
    prompts = ["Name a fruit.", "Count from one to five."]
    results = engine.generate(prompts, sampling, spec=spec, chat=True)
    trace = build_trace(engine, results, spec, sampling, prompt_texts=prompts)
    path = tmp_path / "t.json"
    save_trace(trace, path)
    again = load_trace(path)
    assert again == trace
    req = again.requests[0]
    assert req.output_token_ids == results[0].token_ids
    spec_its = [it for it in req.iterations if it.drafts]
    assert spec_its and req.mean_acceptance_length == results[0].mean_acceptance_length
    it = spec_its[0]
    assert it.selection is not None and it.selection.budget == 8
    assert len(it.selection.positions(0)) == 8 and max(it.selection.positions(0)) < it.selection.base
    assert it.recall is not None and all(0.0 <= r <= 1.0 for r in it.recall)
    assert all(t in again.token_texts for t in req.output_token_ids)
