"""A generation request as the engine core sees it: token ids in, token ids out. The core knows
nothing about text; the front end (`engine.Engine`) tokenizes, detokenizes and checks stop strings."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from .sampling import SamplingParams
from .spec import SpecParams

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    spec: SpecParams
    request_id: int = field(default_factory=lambda: next(_ids))
    arrival: int = 0
    status: Status = Status.WAITING
    token_ids: list[int] = field(default_factory=list)   # prompt + generated
    num_cached: int = 0        # leading tokens whose K/V are valid in the pool
    finish_reason: str | None = None
    error: str | None = None
    rng_key: int = 0           # its counter-based random stream (`random_streams`), from the seed
    # Speculation state: the selected sets for the next draft phase (None until the first verification).
    selection: Any = None
    policy_cache: dict = field(default_factory=dict)  # e.g. quest page bounds, reset on preemption
    # Trace records (dicts in the trace schema's Iteration shape) when this request is traced
    # (`trace`, from `EngineOptions.trace` unless its add asked otherwise).
    trace: bool = False
    iterations: list[dict] = field(default_factory=list)
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    num_preemptions: int = 0
    # Pause / step-through: a held request keeps its pages but sits out decode iterations;
    # `iterations_left` (when set) holds it again after that many iterations.
    held: bool = False
    iterations_left: int | None = None
    result: Any = None         # the front end's GenerationResult, once finished (`Engine.result`)

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    @property
    def prefill_target(self) -> int:
        """Tokens to have in the cache before decoding: all but the last (the pending token, which the
        next decode or verification step feeds)."""
        return len(self.token_ids) - 1

    @property
    def needs_prefill(self) -> bool:
        return self.num_cached < self.prefill_target

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
