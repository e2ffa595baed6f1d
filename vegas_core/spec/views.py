"""Per-request sparse views for draft steps (see `attention.SparseView`)."""
from __future__ import annotations

import numpy as np
import torch

from .select import no_selection, quest_select, stream_positions


class _TraceState:
    """What a trace reads of a view: attention recall per layer (when asked for), the first draft
    step's sets on the host, and the record made of them once (it serves both the iteration that
    chose the view and the one that drafted with it)."""
    chosen_before_drafting = True     # Quest picks its sets from the draft queries instead

    def _init_trace(self, wanted: bool):
        self.wants_recall = wanted
        self.recall_sums: dict[int, list[float]] = {}
        # (host [L, B, G, K], event or None, column, count): the sets, copied to the host without
        # waiting for the GPU where they were made; column `column`'s first `count` entries.
        self.host_copy: tuple | None = None
        self.trace_record: dict | None = None

    def record_recall(self, layer: int, value: float) -> None:
        self.recall_sums.setdefault(layer, []).append(value)

    def recall_per_layer(self, num_layers: int) -> list[float] | None:
        if not self.recall_sums:
            return None
        return [sum(v) / len(v) for v in (self.recall_sums.get(i, [0.0]) for i in range(num_layers))]

    def host_sets(self) -> np.ndarray | list[np.ndarray]:
        """`first_step_sets` on the host, [L, G, k] or [G, k] per layer: from the copy started when
        the sets were made (waiting for that copy alone), else copied now."""
        if self.host_copy is None:
            return [s.cpu().numpy() for s in self.first_step_sets()]
        host, done, column, count = self.host_copy
        if done is not None:
            done.synchronize()
        return host[:, column, :, :count].numpy()

    def first_step_sets(self) -> list[torch.Tensor]:
        raise NotImplementedError


class FixedSelection(_TraceState):
    """One selection per layer made before drafting (vegas, vegas-all, specextend, stream).

    `per_layer` is a list of [G, k] position tensors, or one [L, G, K] tensor of which the first
    `budget` entries of every row are the set (the batched GPU selection hands out slices of one
    padded tensor this way, and the kernel path reads `indices` without a per-layer copy); with
    `layers`, only those rows are sets, the other layers' are empty (sliding-window layers)."""

    def __init__(self, base: int, budget: int, per_layer, record_recall: bool = False,
                 layers: tuple[int, ...] | None = None):
        self.base, self.budget = base, budget
        self.layers = layers
        if isinstance(per_layer, torch.Tensor):
            self.indices, self._per_layer = per_layer, None
        else:
            self.indices, self._per_layer = None, per_layer
        self.source = None     # (batch tensor [L, B, G, K], column) when made by the batched selection
        self._init_trace(record_recall)

    @property
    def per_layer(self) -> list[torch.Tensor]:
        if self._per_layer is None:   # sliced on first use only: the kernel path never needs it
            self._per_layer = [self.indices[i, :, :self.budget if self.layers is None or i in self.layers
                                            else 0].long() for i in range(self.indices.shape[0])]
        return self._per_layer

    def positions(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.per_layer[layer]

    def host_sets(self) -> np.ndarray | list[np.ndarray]:
        sets = super().host_sets()
        if self.layers is None or len(self.layers) == len(sets):
            return sets
        # A hybrid model's sliding layers select nothing: their rows of the copy are padding.
        return [s if i in self.layers else s[:, :0] for i, s in enumerate(sets)]

    @property
    def groups(self) -> int:
        """Sets per layer: 1 (one per layer) or the KV heads (one per KV head)."""
        return self.indices.shape[1] if self.indices is not None else self.per_layer[0].shape[0]

    def stacked(self, device) -> torch.Tensor:
        """[L, G, K >= budget] int32 on `device` (built once and kept)."""
        if self.indices is None or self.indices.device != torch.device(device) \
                or self.indices.dtype != torch.int32:
            src = self.indices if self.indices is not None else torch.stack(self.per_layer)
            self.indices = src.to(device=device, dtype=torch.int32)
        return self.indices

    def first_step_sets(self) -> list[torch.Tensor]:
        return self.per_layer


class StreamSelection(FixedSelection):
    """MagicDec-Stream's set: the first `sink` positions and the most recent ones, `budget` in all,
    the same in every layer. Its positions are made on first use (the reference path); the kernel
    path builds a whole batch's on the device from (base, budget, sink) alone
    (`spec.select.stream_indices`), with no per-request tensor."""

    def __init__(self, base: int, budget: int, sink: int, num_layers: int, record_recall: bool = False):
        super().__init__(base, budget, [], record_recall)
        self.sink, self.num_layers = sink, num_layers
        self._per_layer = None

    @property
    def per_layer(self) -> list[torch.Tensor]:
        if self._per_layer is None:
            self._per_layer = [stream_positions(self.base, self.budget, self.sink)] * self.num_layers
        return self._per_layer

    @property
    def groups(self) -> int:
        return 1


class BlockQuestSelection(_TraceState):
    """MagicDec-Quest on the kernel path: the pages are the KV pool's blocks, their key bounds live
    beside the pool (`kernels.select.update_page_bounds`), and the backend scores the
    `num_pages` complete pages below `base` from each draft query, batched over requests."""
    chosen_before_drafting = False

    def __init__(self, base: int, budget: int, page_size: int, granularity: str,
                 record_recall: bool = False, keep_sets: bool = False):
        self.base, self.budget = base, budget
        self.page_size, self.granularity = page_size, granularity
        self.num_pages = base // page_size
        self.keep_sets = keep_sets          # traces want the first draft step's sets
        self._first: dict[int, torch.Tensor] = {}
        self._init_trace(record_recall)

    def note_positions(self, layer: int, pos: torch.Tensor) -> None:
        """The eager kernel path's first draft step's sets (a chain's come as `host_copy`)."""
        self.host_copy = None
        self._first.setdefault(layer, pos)

    def positions(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self._first[layer]

    def first_step_sets(self) -> list[torch.Tensor]:
        return [self._first[i] for i in sorted(self._first)]


class QuestSelection(_TraceState):
    """MagicDec-Quest: re-scores the pages at every draft step and layer from the current query."""
    chosen_before_drafting = False

    def __init__(self, base: int, budget: int, bounds: list[tuple[torch.Tensor, torch.Tensor]],
                 page_size: int, granularity: str, record_recall: bool = False):
        self.base, self.budget, self.bounds = base, budget, bounds
        self.page_size, self.granularity = page_size, granularity
        self._first: dict[int, torch.Tensor] = {}
        self._init_trace(record_recall)

    def positions(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kmin, kmax = self.bounds[layer]
        pos = quest_select(q, kmin, kmax, self.budget, self.base, self.page_size, self.granularity)
        self._first.setdefault(layer, pos)
        return pos

    def first_step_sets(self) -> list[torch.Tensor]:
        # a sliding-window layer is never asked for positions: its set is empty
        kv_heads = self.bounds[0][0].shape[1]
        return [self._first.get(i, no_selection(self.granularity, kv_heads)) for i in range(len(self.bounds))]
