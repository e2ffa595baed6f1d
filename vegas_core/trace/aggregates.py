"""Speculative-decoding metrics over trace iterations, named as vLLM names them so numbers compare.

A *speculative* iteration is one with `final_kind != "decode"` (it drafted at least one token).
- mean_acceptance_length = 1 + accepted drafts / speculative iterations (the 1 is the correction or
  bonus token every iteration emits); None without speculative iterations.
- per_position_acceptance[i] = speculative iterations whose draft i was accepted / speculative
  iterations; a list of length gamma (default: the most drafts any iteration made); None without
  speculative iterations.
- tokens_per_s = generated tokens / decode seconds; None when the time is zero.
Accepted is the drafter's count (drafts the verifier accepted, tokens that max_tokens or a stop then
cut included, as vLLM counts them); emitted is what the user got (`Iteration.emitted`, which sums to
the output). Views say which one they show, with these words.
Functions take any sequence of objects shaped like `schema.Iteration`, so they never import it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .schema import Iteration


MEAN_ACCEPTANCE_LENGTH = ("mean acceptance length = 1 + accepted drafts / speculative iterations; accepted "
                          "counts what the verifier accepted (as vLLM counts it), emitted counts what was output")


def emitted_tokens(iterations: Sequence[Iteration]) -> int:
    """Tokens the iterations output (the request's output length, for a trace recorded by the engine)."""
    return sum(len(it.emitted) for it in iterations)


def _speculative(iterations: Sequence[Iteration]) -> list[Iteration]:
    return [it for it in iterations if it.final_kind != "decode"]


def num_speculative(iterations: Sequence[Iteration]) -> int:
    return len(_speculative(iterations))


def mean_acceptance_length(iterations: Sequence[Iteration]) -> float | None:
    spec = _speculative(iterations)
    if not spec:
        return None
    return 1.0 + sum(it.num_accepted for it in spec) / len(spec)


def per_position_acceptance(iterations: Sequence[Iteration], gamma: int | None = None) -> list[float] | None:
    spec = _speculative(iterations)
    if not spec:
        return None
    if gamma is None:
        gamma = max(len(it.drafts) for it in spec)
    counts = [0] * gamma
    for it in spec:
        for i in range(min(it.num_accepted, gamma)):
            counts[i] += 1
    return [c / len(spec) for c in counts]


def tokens_per_s(tokens: int, seconds: float | None) -> float | None:
    if not seconds:
        return None
    return tokens / seconds


def timeline_span_s(iterations: Sequence[Iteration]) -> float | None:
    """Seconds from the first iteration's start to the last one's end (draft + select + verify)."""
    if not iterations:
        return None
    start = min(it.start_s for it in iterations)
    end = max(it.start_s + (it.draft_ms + it.select_ms + it.verify_ms) / 1000.0 for it in iterations)
    return end - start
