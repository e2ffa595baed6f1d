"""Drafting policies, one class per method (the paper's Vegas and its baselines), behind one
interface that the engine core asks instead of comparing method names:

- `speculative`: whether the method drafts at all (vanilla does not);
- `collect_rows(num_rows)`: which rows of a verification pass of `num_rows` rows (the pending token,
  then the drafts) must keep their attention logits for the next selection (None: none);
- `selects_after_accept`: whether the selection needs to know how many drafts were accepted (then
  it runs after acceptance; otherwise while the host waits for it);
- `select(ctx)`: the next draft phase's `SparseView` for one request, on the reference path (the
  kernel path batches the same choices in `spec.batched`, grouping by proposer class);
- `check(spec, kernel_path, block_size)`: a request's parameters that this method cannot take.

A verification that produced the collected rows started at position `base`: every selection covers
the prefix [0, base), and every later position (accepted tokens, this phase's drafts) is attended.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidRequestError
from .select import no_selection, quest_page_bounds, select_from_logits
from .views import FixedSelection, QuestSelection, StreamSelection


@dataclass
class SelectContext:
    """What one request's selection may read (reference path)."""
    spec: object                     # the request's SpecParams
    base: int                        # the verified prefix the selection covers: [0, base)
    num_layers: int
    kv_heads: int
    collected: tuple | None          # (logits per layer [R, H, base], lse per layer [R, H]) or None
    collected_rows: list[int] | None  # the verification rows those R rows are
    num_accepted: int                # drafts accepted in the verification
    layer_keys: object               # layer_keys(layer, start, end) -> cached keys [n, KVH, d]
    cache: dict                      # the request's own state across iterations (Quest's page bounds)


class Proposer:
    name = ""
    speculative = True
    selects_after_accept = False

    def collect_rows(self, num_rows: int) -> list[int] | None:
        return None

    def select(self, ctx: SelectContext):
        raise NotImplementedError

    def check(self, spec, kernel_path: bool, block_size: int) -> None:
        """Raise InvalidRequestError for parameters this method cannot run with."""


class Vanilla(Proposer):
    """No speculation: one full-attention decode step per token."""
    name = "vanilla"
    speculative = False


class Stream(Proposer):
    """MagicDec-Stream: the first `sink` tokens and a sliding window of the latest, in every layer."""
    name = "stream"

    def select(self, ctx: SelectContext):
        s = ctx.spec
        return StreamSelection(ctx.base, s.budget(ctx.base), s.sink, ctx.num_layers, s.record_recall)


class Quest(Proposer):
    """MagicDec-Quest: pages with element-wise min/max keys, re-scored at every draft step and layer
    from the draft's own query (the per-step scoring is its overhead)."""
    name = "quest"

    def select(self, ctx: SelectContext):
        s = ctx.spec
        return QuestSelection(ctx.base, s.budget(ctx.base), _quest_bounds(ctx), s.page_size,
                              s.granularity, s.record_recall)

    def check(self, spec, kernel_path: bool, block_size: int) -> None:
        if kernel_path and spec.page_size != block_size:
            raise InvalidRequestError(
                f"on the kernel path a Quest page is a KV-pool block: page_size must be "
                f"{block_size}, got {spec.page_size}")


class VerificationGuided(Proposer):
    """Selects from the verification pass's own attention: each prefix entry's softmax weight,
    averaged over the query heads and the scored rows, top k per layer (or per KV head)."""

    def scored_rows(self, collected_rows: list[int], num_accepted: int) -> list[int]:
        """Indices into `collected_rows` of the rows whose attention scores the selection."""
        return list(range(len(collected_rows)))

    def select(self, ctx: SelectContext):
        s = ctx.spec
        k = s.budget(ctx.base)
        logits, lse = ctx.collected
        keep = self.scored_rows(ctx.collected_rows, ctx.num_accepted)
        # A sliding-window layer (Gemma 3's local layers) attends its window whole and collects
        # nothing: its set is empty.
        per_layer = [select_from_logits(logits[layer][keep], lse[layer][keep], k, ctx.kv_heads, s.granularity)
                     if layer in logits else no_selection(s.granularity, ctx.kv_heads)
                     for layer in range(ctx.num_layers)]
        return FixedSelection(ctx.base, k, per_layer, s.record_recall)


class Vegas(VerificationGuided):
    """Collect-2-Query: the first row (it predicts the first draft) and the last (the bonus token)."""
    name = "vegas"

    def collect_rows(self, num_rows: int) -> list[int]:
        return sorted({0, num_rows - 1})


class VegasAll(VerificationGuided):
    """Every verification row (the paper's all-query variant, costlier to collect)."""
    name = "vegas-all"

    def collect_rows(self, num_rows: int) -> list[int]:
        return list(range(num_rows))


class SpecExtend(VerificationGuided):
    """The last accepted token's row only. Known only after acceptance, so every row is collected."""
    name = "specextend"
    selects_after_accept = True

    def collect_rows(self, num_rows: int) -> list[int]:
        return list(range(num_rows))

    def scored_rows(self, collected_rows: list[int], num_accepted: int) -> list[int]:
        # Row 0 is the pending token, row i the i-th draft: the last accepted is row num_accepted.
        return [collected_rows.index(num_accepted)]


PROPOSERS: dict[str, Proposer] = {p.name: p for p in (Vanilla(), Stream(), Quest(), SpecExtend(), Vegas(),
                                                       VegasAll())}


def _quest_bounds(ctx: SelectContext):
    """Per layer (kmin, kmax) of the complete pages below base, kept in the request's cache and
    extended by the pages completed since (pages below base never change: truncation only drops
    entries past the verified prefix)."""
    page = ctx.spec.page_size
    full = ctx.base // page
    done = ctx.cache.get("pages", 0)
    bounds = ctx.cache.setdefault("bounds", [None] * ctx.num_layers)
    if full > done:
        for layer in range(ctx.num_layers):
            kmin, kmax = quest_page_bounds(ctx.layer_keys(layer, done * page, full * page), page)
            if bounds[layer] is not None:
                kmin = torch.cat([bounds[layer][0], kmin])
                kmax = torch.cat([bounds[layer][1], kmax])
            bounds[layer] = (kmin, kmax)
        ctx.cache["pages"] = full
    if full == 0:
        empty = ctx.layer_keys(0, 0, 0)[:0].float()
        return [(empty, empty)] * ctx.num_layers
    return list(bounds)
