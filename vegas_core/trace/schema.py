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

Changing any field means bumping `TRACE_SCHEMA_VERSION`.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import Field, field_validator, model_validator

from . import aggregates
from .fields import NonNegFloat, NonNegInt, Probability, Recall
from .fields import StrictModel as _Strict
from .selection import Granularity, Selection

TRACE_SCHEMA_VERSION = 1

Method = Literal["vanilla", "stream", "quest", "specextend", "vegas", "vegas-all"]


class ModelInfo(_Strict):
    """The model the run used (enough to label plots and check selection shapes)."""
    name: str
    arch: str
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    dtype: str
    device: str

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
    min_budget: NonNegInt = 0
    sink: NonNegInt = 0
    page_size: int = Field(default=16, ge=1)
    temperature: NonNegFloat = 0.0
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: NonNegInt = 0
    min_p: Probability = 0.0
    seed: int | None = None
    max_tokens: int = Field(ge=1)


class DraftToken(_Strict):
    """One drafted token with its draft probability q and target probability p."""
    token_id: NonNegInt
    draft_prob: Probability
    target_prob: Probability
    accepted: bool


class Iteration(_Strict):
    """One decode iteration of one request: draft, verify (accept/reject), select.
    `final_kind` is "correction" after a rejection, "bonus" after all drafts were accepted, "decode" for
    a plain non-speculative step (no drafts)."""
    index: NonNegInt                 # iteration number within the request
    step: NonNegInt                  # global engine step (requests of one batch share it)
    position: NonNegInt              # verified cache length at iteration start
    drafts: list[DraftToken]         # accepted ones first
    num_accepted: NonNegInt
    emitted: list[int]               # tokens output: accepted drafts + final_token, cut where the run ended
    final_token: NonNegInt
    final_kind: Literal["correction", "bonus", "decode"]
    # The set this iteration's drafts attended (quest reselects per draft step: its first step's set).
    selection: Selection | None = None
    # Per layer: share of the draft queries' full-attention mass the set covers, mean over draft steps.
    recall: list[Recall] | None = None
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
    request_id: str
    prompt_token_ids: list[NonNegInt]
    prompt_text: str | None = None
    output_token_ids: list[NonNegInt]
    output_text: str = ""
    finish_reason: Literal["stop", "length", "abort", "error"]
    iterations: list[Iteration] = Field(default_factory=list)
    decode_time_s: NonNegFloat = 0.0
    prefill_time_s: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _ordered(self):
        for i, it in enumerate(self.iterations):
            if it.index != i:
                raise ValueError(f"iterations[{i}] has index {it.index}; iterations must be listed in order from 0")
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
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    model: ModelInfo
    config: RunConfig
    requests: list[RequestTrace] = Field(default_factory=list)
    token_texts: dict[int, str] = Field(default_factory=dict)
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
