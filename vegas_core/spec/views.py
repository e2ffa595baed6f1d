"""Per-request sparse views for draft steps (see `attention.SparseView`)."""
from __future__ import annotations

import torch

from .select import quest_select


class _RecallMixin:
    def _init_recall(self, wanted: bool):
        self.wants_recall = wanted
        self.recall_sums: dict[int, list[float]] = {}

    def record_recall(self, layer: int, value: float) -> None:
        self.recall_sums.setdefault(layer, []).append(value)

    def recall_per_layer(self, num_layers: int) -> list[float] | None:
        if not self.recall_sums:
            return None
        return [sum(v) / len(v) for v in (self.recall_sums.get(i, [0.0]) for i in range(num_layers))]


class FixedSelection(_RecallMixin):
    """One selection per layer made before drafting (vegas, vegas-all, specextend, stream)."""

    def __init__(self, base: int, budget: int, per_layer: list[torch.Tensor], record_recall: bool = False):
        self.base, self.budget, self.per_layer = base, budget, per_layer
        self._init_recall(record_recall)

    def positions(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.per_layer[layer]

    def first_step_sets(self) -> list[torch.Tensor]:
        return self.per_layer


class QuestSelection(_RecallMixin):
    """MagicDec-Quest: re-scores the pages at every draft step and layer from the current query."""

    def __init__(self, base: int, budget: int, bounds: list[tuple[torch.Tensor, torch.Tensor]],
                 page_size: int, granularity: str, record_recall: bool = False):
        self.base, self.budget, self.bounds = base, budget, bounds
        self.page_size, self.granularity = page_size, granularity
        self._first: dict[int, torch.Tensor] = {}
        self._init_recall(record_recall)

    def positions(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kmin, kmax = self.bounds[layer]
        pos = quest_select(q, kmin, kmax, self.budget, self.base, self.page_size, self.granularity)
        self._first.setdefault(layer, pos)
        return pos

    def first_step_sets(self) -> list[torch.Tensor]:
        return [self._first[i] for i in sorted(self._first)]
