"""Metrics of the conftest trace, computed by hand from its iterations:
req-0: 3 speculative iterations accepting 2, 4, 1 of 4 drafts; 11 output tokens in 0.5 s.
req-1: a plain decode step, then 0 of 4 and 3 of 3 accepted; 7 output tokens in 0.25 s.
Steps start at 0, 10 and 20 ms and last 4 + 1 + 5 ms, so the timeline spans 30 ms."""
import pytest

from vegas_core.trace import aggregates


def test_per_request_metrics(trace):
    r0, r1 = trace.requests
    assert r0.num_iterations == 3 and r0.num_speculative_iterations == 3
    assert r0.mean_acceptance_length == pytest.approx(1 + 7 / 3)
    assert r0.per_position_acceptance == pytest.approx([1, 2 / 3, 1 / 3, 1 / 3])
    assert r0.decode_tokens_per_s == pytest.approx(22.0)
    assert r1.num_iterations == 3 and r1.num_speculative_iterations == 2
    assert r1.mean_acceptance_length == pytest.approx(2.5)
    assert r1.per_position_acceptance == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert r1.decode_tokens_per_s == pytest.approx(28.0)


def test_whole_trace_metrics_pool_iterations(trace, make_trace):
    assert trace.num_iterations == 6 and trace.num_speculative_iterations == 5
    assert trace.mean_acceptance_length == pytest.approx(1 + 10 / 5)
    assert trace.per_position_acceptance == pytest.approx([4 / 5, 3 / 5, 2 / 5, 1 / 5])
    assert trace.decode_tokens_per_s == pytest.approx(18 / 0.03)               # timeline span
    assert make_trace(decode_time_s=0.05).decode_tokens_per_s == pytest.approx(18 / 0.05)


def test_no_speculative_iterations_give_none(trace):
    decode_only = [trace.requests[1].iterations[0]]
    assert aggregates.mean_acceptance_length(decode_only) is None
    assert aggregates.per_position_acceptance(decode_only, gamma=4) is None
    assert aggregates.mean_acceptance_length([]) is None
    assert aggregates.tokens_per_s(10, 0.0) is None
    assert aggregates.timeline_span_s([]) is None
