"""The selection step for a whole batch on the kernel path (each proposer's `select` does the same
one request at a time on the reference path).

Verification-guided methods (vegas, vegas-all, specextend) score every layer of every request in
one `kernels.select.selection_scores` launch per granularity, then one top-k over all layers
(`select_layers`);
Quest's page bounds are brought up to date for the pages that became complete and verified;
stream's fixed positions need no model data."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vegas_core.kernels.select import select_layers

from ..attention.metadata import LogitCollector
from ..transfer import to_device, to_host_async
from .proposers import Quest, SelectContext, Stream, VerificationGuided
from .views import BlockQuestSelection, FixedSelection


@dataclass
class SelectItem:
    seq_index: int        # the request's index in the verification batch (collector key)
    request: object
    base: int             # where the verification started: the selection covers [0, base)
    num_accepted: int
    collected_rows: list[int] | None = None   # the verification rows whose logits were collected


def select_batch(items: list[SelectItem], collector: LogitCollector, num_layers: int,
                 kv_heads: int, device, page_bounds, block_table, trace: bool) -> dict[int, object]:
    """New selections by request id. `block_table(request_id)` gives a request's physical blocks.
    `trace`: the sets are copied to the host as soon as they are made, without waiting for the
    GPU (`host_copy`), and Quest views keep their first draft step's sets."""
    out: dict[int, object] = {}
    guided: dict[str, list[SelectItem]] = {}
    quest_blocks: list[int] = []
    for it in items:
        spec = it.request.spec
        proposer = spec.proposer
        if isinstance(proposer, VerificationGuided):
            guided.setdefault(spec.granularity, []).append(it)
        elif isinstance(proposer, Quest):
            out[it.request.request_id] = _quest_view(it, page_bounds, block_table, quest_blocks,
                                                      trace)
        elif isinstance(proposer, Stream):   # positions only
            out[it.request.request_id] = proposer.select(SelectContext(
                spec, it.base, num_layers, kv_heads, None, None, it.num_accepted, None, None))
        else:
            raise TypeError(f"{type(proposer).__name__} has no batched selection")
    page_bounds.update(quest_blocks)
    for granularity, group in guided.items():
        out.update(_guided(group, granularity, collector, num_layers, kv_heads, device, trace))
    return out


def _guided(group: list[SelectItem], granularity: str, collector: LogitCollector, num_layers: int,
            kv_heads: int, device, trace: bool) -> dict[int, FixedSelection]:
    starts, counts, bases, budgets = [], [], [], []
    for it in group:
        rows = collector.rows_of[it.seq_index]
        rows = [rows[j] for j in it.request.spec.proposer.scored_rows(it.collected_rows, it.num_accepted)]
        starts.append(rows[0])
        counts.append(len(rows))
        bases.append(it.base)
        budgets.append(it.request.spec.budget(it.base))
    # One upload that does not wait for the GPU (the verification may still be running).
    row_start, row_count, base_t, budget_t = to_device([starts, counts, bases, budgets], torch.int32, device)
    stacked = select_layers(collector.stacked(), row_start, row_count, base_t, budget_t, max(budgets),
                            kv_heads, granularity, n_keys=max(bases))                # [Lc, B, G, K]
    layers = collector.layers
    if layers is not None and len(layers) < num_layers:
        # A hybrid model collected its global layers only: their sets go to their own rows of
        # an every-layer tensor; a sliding layer's row is never read (its drafts see the window).
        every = stacked.new_zeros(num_layers, *stacked.shape[1:])
        every[list(layers)] = stacked
        stacked = every
    host = to_host_async(stacked) if trace else None
    sel = {}
    for j, it in enumerate(group):
        view = FixedSelection(it.base, budgets[j], stacked[:, j], it.request.spec.record_recall,
                              layers=layers)
        view.source = (stacked, j)     # lets the next draft batch use `stacked` without copying
        if host is not None:
            view.host_copy = (*host, j, budgets[j])
        sel[it.request.request_id] = view
    return sel


def _quest_view(it: SelectItem, page_bounds, block_table, blocks_out: list[int], keep_sets: bool):
    spec, cache = it.request.spec, it.request.policy_cache
    full = it.base // spec.page_size
    done = cache.get("pages", 0)
    if full > done:
        blocks_out.extend(block_table(it.request.request_id)[done:full])
        cache["pages"] = full
    return BlockQuestSelection(it.base, spec.budget(it.base), spec.page_size, spec.granularity,
                               spec.record_recall, keep_sets)
