"""The versioned trace of a generation run: what the engine did, per request and per decode iteration.

Contract: a `Trace` is plain data (pydantic v2 models, JSON-serialisable, no tensors) that validates
its own consistency at construction, so anything that loads is safe to replay and plot without the
model. Every model forbids unknown fields and non-finite floats. Timings of one iteration are those of
the *batched* engine step it belonged to (requests of one step share them), so add them per step, not
per request. Two counts are kept apart: `num_accepted` is the drafter's (drafts the verifier accepted,
as vLLM counts them) and `emitted` is what the user got, a prefix of the accepted drafts + final token
that is shorter when a stop token or `max_tokens` ended the run inside the iteration, so the engine's
traces' `emitted` concatenate to exactly `output_token_ids`. (Not enforced at load: traces recorded
before that fix kept the cut tokens; views cap them at the output.)

A trace is checked against the model it declares before anything is built from it: every count,
position, list and string is bounded (`fields.MAX_*`), token ids lie in the model's vocabulary,
positions within their request's tokens, and a selection's sets times positions stay below
MAX_SELECTION_CELLS, so replaying any valid file costs time and memory in proportion to its size.

Changing any field means bumping `TRACE_SCHEMA_VERSION`.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from . import aggregates
from .fields import (MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_REQUESTS, MAX_SELECTION_CELLS,
                     MAX_TEXT_CHARS, MAX_VOCAB, NonNegFloat, NonNegInt, Position, Probability, Recall, TokenId)
from .fields import StrictModel as _Strict
from .selection import Granularity, Selection

TRACE_SCHEMA_VERSION = 1

Method = Literal["vanilla", "stream", "quest", "specextend", "vegas", "vegas-all"]


class ModelInfo(_Strict):
    """The model the run used (enough to label plots and check selection shapes)."""
    name: str = Field(max_length=1024)
    arch: str = Field(max_length=64)
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    num_heads: int = Field(ge=1, le=MAX_HEADS)
    num_kv_heads: int = Field(ge=1, le=MAX_HEADS)
    head_dim: int = Field(ge=1, le=MAX_HEAD_DIM)
    vocab_size: int = Field(ge=1, le=MAX_VOCAB)
    dtype: str = Field(max_length=64)
    device: str = Field(max_length=64)

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        return self


class RunConfig(_Strict):
    """Drafting method and sampling parameters of the run (top_k 0 = off, min_p 0 = off)."""
    method: Method
    granularity: Granularity = "layer"
    gamma: int = Field(ge=1, le=16)
    sparsity: float = Field(gt=0.0, le=1.0)
    min_budget: Position = 0
    sink: Position = 0
    page_size: int = Field(default=16, ge=1, le=MAX_CONTEXT)
    temperature: NonNegFloat = 0.0
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=MAX_VOCAB)
    min_p: Probability = 0.0
    seed: int | None = Field(default=None, ge=0, lt=1 << 64)
    max_tokens: int = Field(ge=1, le=MAX_CONTEXT)


class DraftToken(_Strict):
    """One drafted token with its draft probability q and target probability p."""
    token_id: TokenId
    draft_prob: Probability
    target_prob: Probability
    accepted: bool


class Iteration(_Strict):
    """One decode iteration of one request: draft, verify (accept/reject), select.
    `final_kind` is "correction" after a rejection, "bonus" after all drafts were accepted, "decode" for
    a plain non-speculative step (no drafts)."""
    index: NonNegInt                 # iteration number within the request
    step: NonNegInt                  # global engine step (requests of one batch share it)
    position: Position               # verified cache length at iteration start
    drafts: list[DraftToken] = Field(max_length=16)    # accepted ones first (gamma <= 16)
    num_accepted: NonNegInt
    emitted: list[TokenId] = Field(max_length=17)      # tokens output: accepted drafts + final_token, cut where the run ended
    final_token: TokenId
    final_kind: Literal["correction", "bonus", "decode"]
    # The set this iteration's drafts attended (quest reselects per draft step: its first step's set).
    selection: Selection | None = None
    # Per layer: share of the draft queries' full-attention mass the set covers, mean over draft steps.
    recall: list[Recall] | None = Field(default=None, max_length=MAX_LAYERS)
    # Wall or CUDA-event times of the batched step this iteration belonged to.
    draft_ms: NonNegFloat = 0.0
    select_ms: NonNegFloat = 0.0
    verify_ms: NonNegFloat = 0.0
    start_s: NonNegFloat = 0.0       # seconds since run start, for timelines

    @model_validator(mode="after")
    def _consistent(self):
        n, k = len(self.drafts), self.num_accepted
        if k > n:
            raise ValueError(f"num_accepted {k} exceeds the {n} drafts")
        flags = [d.accepted for d in self.drafts]
        if flags != [True] * k + [False] * (n - k):
            raise ValueError(f"accepted flags {flags} are not the first num_accepted={k} drafts")
        expected = [d.token_id for d in self.drafts[:k]] + [self.final_token]
        if not self.emitted or self.emitted != expected[:len(self.emitted)]:
            raise ValueError(f"emitted {self.emitted} is not a non-empty prefix of accepted drafts + final "
                             f"token {expected}")
        kind = "decode" if n == 0 else ("bonus" if k == n else "correction")
        if self.final_kind != kind:
            raise ValueError(f'final_kind "{self.final_kind}" with {k} of {n} drafts accepted should be "{kind}"')
        if self.selection is not None and self.selection.base > self.position:
            raise ValueError(f"selection base {self.selection.base} is past the verified length {self.position}")
        return self


class RequestTrace(_Strict):
    """Everything recorded about one request; `iterations[i].index == i`."""
    request_id: str = Field(max_length=256)
    prompt_token_ids: list[TokenId] = Field(max_length=MAX_CONTEXT)
    prompt_text: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    output_token_ids: list[TokenId] = Field(max_length=MAX_CONTEXT)
    output_text: str = Field(default="", max_length=MAX_TEXT_CHARS)
    finish_reason: Literal["stop", "length", "abort", "error"]
    iterations: list[Iteration] = Field(default_factory=list, max_length=MAX_CONTEXT)
    decode_time_s: NonNegFloat = 0.0
    prefill_time_s: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _ordered(self):
        length = len(self.prompt_token_ids) + len(self.output_token_ids)
        if length > MAX_CONTEXT:
            raise ValueError(f"prompt and output hold {length} tokens, over the {MAX_CONTEXT} limit")
        for i, it in enumerate(self.iterations):
            if it.index != i:
                raise ValueError(f"iterations[{i}] has index {it.index}; iterations must be listed in order from 0")
            if it.position > length:
                raise ValueError(f"iterations[{i}] is at position {it.position}, past the request's {length} tokens")
        return self

    # Metrics (see aggregates.py for definitions).
    @property
    def num_iterations(self) -> int:
        return len(self.iterations)

    @property
    def num_speculative_iterations(self) -> int:
        return aggregates.num_speculative(self.iterations)

    @property
    def mean_acceptance_length(self) -> float | None:
        return aggregates.mean_acceptance_length(self.iterations)

    @property
    def per_position_acceptance(self) -> list[float] | None:
        """Length = the most drafts any of this request's iterations made."""
        return aggregates.per_position_acceptance(self.iterations)

    @property
    def decode_tokens_per_s(self) -> float | None:
        return aggregates.tokens_per_s(len(self.output_token_ids), self.decode_time_s)


class Trace(_Strict):
    """A whole run. `decode_time_s` is the run's decode wall time (requests overlap in a batch, so
    per-request times do not add up); when absent, throughput uses the iteration timeline's span.
    `token_texts` maps token ids appearing in the trace to their text, for replay without the model."""
    schema_version: Literal[1] = TRACE_SCHEMA_VERSION
    created: str = Field(max_length=64, default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    model: ModelInfo
    config: RunConfig
    requests: list[RequestTrace] = Field(default_factory=list, max_length=MAX_REQUESTS)
    token_texts: dict[TokenId, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict,
                                                                             max_length=MAX_VOCAB)
    decode_time_s: NonNegFloat | None = None

    @field_validator("created")
    @classmethod
    def _iso(cls, v: str) -> str:
        try:
            datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(f"created {v!r} is not an ISO 8601 datetime") from None
        return v

    @model_validator(mode="after")
    def _shapes_match_model(self):
        m, gamma = self.model, self.config.gamma
        _check_vocab(self, m.vocab_size)
        for r, req in enumerate(self.requests):
            for it in req.iterations:
                where = f"requests[{r}].iterations[{it.index}]"
                if len(it.drafts) > gamma:
                    raise ValueError(f"{where}: {len(it.drafts)} drafts exceed gamma {gamma}")
                if it.recall is not None and len(it.recall) != m.num_layers:
                    raise ValueError(f"{where}: recall has {len(it.recall)} layers, the model {m.num_layers}")
                sel = it.selection
                if sel is None:
                    continue
                if sel.num_layers != m.num_layers:
                    raise ValueError(f"{where}: selection has {sel.num_layers} layers, the model {m.num_layers}")
                if sel.heads is not None and len(sel.heads[0]) != m.num_kv_heads:
                    raise ValueError(
                        f"{where}: selection has {len(sel.heads[0])} KV heads per layer, the model {m.num_kv_heads}")
                cells = m.num_layers * (m.num_kv_heads if sel.heads is not None else 1) * it.position
                if cells > MAX_SELECTION_CELLS:
                    raise ValueError(f"{where}: a selection over {it.position} positions in {m.num_layers} layers "
                                     f"is {cells:,} cells, over the {MAX_SELECTION_CELLS:,} limit")
        return self

    @property
    def all_iterations(self) -> list[Iteration]:
        return [it for req in self.requests for it in req.iterations]

    # Metrics pooled over all requests' iterations (see aggregates.py for definitions).
    @property
    def num_iterations(self) -> int:
        return sum(len(r.iterations) for r in self.requests)

    @property
    def num_speculative_iterations(self) -> int:
        return aggregates.num_speculative(self.all_iterations)

    @property
    def mean_acceptance_length(self) -> float | None:
        return aggregates.mean_acceptance_length(self.all_iterations)

    @property
    def per_position_acceptance(self) -> list[float] | None:
        """Length = config.gamma."""
        return aggregates.per_position_acceptance(self.all_iterations, self.config.gamma)

    @property
    def decode_tokens_per_s(self) -> float | None:
        tokens = sum(len(r.output_token_ids) for r in self.requests)
        seconds = self.decode_time_s
        if seconds is None:
            seconds = aggregates.timeline_span_s(self.all_iterations)
        return aggregates.tokens_per_s(tokens, seconds)


def _check_vocab(trace: Trace, vocab_size: int) -> None:
    """Every token id in the trace lies in the vocabulary of the model it declares."""
    def largest(ids) -> int:
        return max(ids, default=-1)

    for r, req in enumerate(trace.requests):
        top = max(largest(req.prompt_token_ids), largest(req.output_token_ids),
                  largest(t for it in req.iterations for t in it.emitted),
                  largest(d.token_id for it in req.iterations for d in it.drafts))
        if top >= vocab_size:
            raise ValueError(f"requests[{r}] holds token id {top}, outside the model's vocabulary of {vocab_size}")
    if largest(trace.token_texts) >= vocab_size:
        raise ValueError(f"token_texts names token id {largest(trace.token_texts)}, outside the model's "
                         f"vocabulary of {vocab_size}")
