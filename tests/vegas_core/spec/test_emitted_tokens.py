"""A trace's emitted tokens are exactly the output, also when max_tokens ends a run inside an
iteration: then the verifier still accepted its drafts (the drafter's count, kept as `num_accepted`),
but only the tokens up to max_tokens were output. Every method, greedy and sampled.

Each run goes twice on its own (batch 1, so both passes compute the same numbers): once until an
iteration emits two or more tokens, then again with max_tokens ending inside that iteration."""
import dataclasses

import pytest
import torch

from vegas_core.random_streams import ACCEPT
from vegas_core.sampling import SamplingParams
from vegas_core.spec import METHODS, SpecParams
from vegas_core.trace_builder import build_trace

PROMPT = "Write a haiku about the sea."
SAMPLINGS = {"greedy": SamplingParams(max_tokens=24, ignore_eos=True),
             "sampled": SamplingParams(temperature=0.8, seed=11, max_tokens=24, ignore_eos=True)}


def _run(engine, ids, sampling, spec, until=None):
    """Events of one request run alone; `until(events)` stops it early (aborted)."""
    req = engine.add(ids, sampling, spec)
    events = []
    try:
        while not req.finished:
            events += [e for e in engine.step() if e.request_id == req.request_id]
            if until is not None and until(events):
                break
        return req, events
    finally:
        if not req.finished:
            engine.abort(req.request_id)


def _cut_inside_an_iteration(engine, ids, sampling, spec) -> int:
    """A max_tokens that ends the run inside an iteration emitting two or more tokens."""
    _, events = _run(engine, ids, sampling, spec, until=lambda evs: bool(evs) and len(evs[-1].new_token_ids) >= 2)
    before = sum(len(e.new_token_ids) for e in events[:-1])
    assert len(events[-1].new_token_ids) >= 2, "no iteration emitted two tokens within 24"
    return before + 1


@pytest.mark.parametrize("mode", list(SAMPLINGS))
@pytest.mark.parametrize("method", METHODS)
def test_emitted_tokens_are_the_output_when_a_run_ends_mid_iteration(engine, method, mode):
    ids = engine.encode_prompt(PROMPT, chat=True)
    spec = SpecParams(method=method, gamma=4, sparsity=0.1, min_budget=8)
    sampling = SAMPLINGS[mode]
    if spec.speculative:
        sampling = dataclasses.replace(sampling, max_tokens=_cut_inside_an_iteration(engine, ids, sampling, spec))
    else:
        sampling = dataclasses.replace(sampling, max_tokens=5)
    req, events = _run(engine, ids, sampling, spec)
    result = engine.result(req)
    engine.abort(req.request_id)
    trace = build_trace(engine, [result], spec, sampling)
    out = trace.requests[0].output_token_ids
    its = trace.requests[0].iterations
    assert len(out) == sampling.max_tokens
    assert [t for it in its for t in it.emitted] == out
    assert sum(len(e.new_token_ids) for e in events) == len(out)
    last = its[-1]
    if spec.speculative:
        # Ended inside the last iteration: fewer tokens output than the verifier kept.
        assert len(last.emitted) < last.num_accepted + 1
        assert trace.requests[0].mean_acceptance_length == 1 + sum(
            it.num_accepted for it in its if it.drafts) / sum(1 for it in its if it.drafts)
    if mode == "sampled" and spec.speculative:
        _check_accept_draws(events, its)


def _check_accept_draws(events, iterations):
    """The draws the step-through shows reproduce every acceptance decision: u * q < p for each
    accepted draft, not for the first rejected one (later drafts were never tested)."""
    checked = 0
    for ev, it in zip(events, iterations):
        if not it.drafts:
            assert ev.accept_draws is None
            continue
        assert len(ev.accept_draws) == len(it.drafts)
        for j, (u, d) in enumerate(zip(ev.accept_draws, it.drafts)):
            if j > it.num_accepted:
                break
            q, p = torch.tensor(d.draft_prob), torch.tensor(d.target_prob)
            assert bool(torch.tensor(u) * q < p) == d.accepted, (j, u, d)
            checked += 1
    assert checked and ACCEPT == 2
