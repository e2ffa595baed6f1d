"""Speculation parameters of a request (or an engine default), validated at construction."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidRequestError
from .proposers import PROPOSERS, Proposer

METHODS = tuple(PROPOSERS)
GRANULARITIES = ("layer", "kv-head")
MAX_GAMMA = 16


@dataclass(frozen=True)
class SpecParams:
    method: str = "vegas"
    gamma: int = 6
    sparsity: float = 0.07     # fraction of the verified prefix kept for drafting
    min_budget: int = 256      # floor on the kept count (capped at the prefix length)
    granularity: str = "layer"  # one selected set per layer, or one per KV head
    sink: int = 4              # stream: attention-sink tokens at the start
    page_size: int = 16        # quest: tokens per page
    record_recall: bool = False  # trace attention recall (costs a full attention per draft step)

    def __post_init__(self):
        if self.method not in METHODS:
            raise InvalidRequestError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.granularity not in GRANULARITIES:
            raise InvalidRequestError(
                f"unknown granularity {self.granularity!r}; choose one of {', '.join(GRANULARITIES)}")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or not 1 <= self.gamma <= MAX_GAMMA:
            raise InvalidRequestError(f"gamma must be an integer in [1, {MAX_GAMMA}], got {self.gamma!r}")
        s = self.sparsity
        if not isinstance(s, (int, float)) or math.isnan(s) or not 0 < s <= 1:
            raise InvalidRequestError(f"sparsity must be in (0, 1], got {s!r}")
        if not isinstance(self.min_budget, int) or self.min_budget < 0:
            raise InvalidRequestError(f"min_budget must be an integer >= 0, got {self.min_budget!r}")
        if not isinstance(self.sink, int) or self.sink < 0:
            raise InvalidRequestError(f"sink must be an integer >= 0, got {self.sink!r}")
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise InvalidRequestError(f"page_size must be an integer >= 1, got {self.page_size!r}")

    @property
    def proposer(self) -> Proposer:
        """The drafting policy of `method` (`spec.proposers`)."""
        return PROPOSERS[self.method]

    @property
    def speculative(self) -> bool:
        return self.proposer.speculative

    def budget(self, prefix_len: int) -> int:
        """k = clamp(ceil(sparsity * n), min_budget, n): entries of the prefix kept for drafting."""
        k = max(math.ceil(self.sparsity * prefix_len), self.min_budget)
        return min(k, prefix_len)
