"""What each drafting policy collects during verification and how it builds the next selection.

`collect_rows(method, num_rows)` says which verification rows' logits the attention must keep;
`build_selection(...)` turns what was collected (or the cache itself, for stream and quest) into the
SparseView the next draft phase attends through. The verification that produced the rows started at
position `base`; the selection covers the prefix [0, base) and every later position is attended.
Sliding-window layers (Gemma 3's local layers) select nothing: the backend attends their window
whole and collects no logits there, so their sets are empty."""
from __future__ import annotations

import torch

from .params import SpecParams
from .select import no_selection, quest_page_bounds, select_from_logits
from .views import FixedSelection, QuestSelection, StreamSelection


def collect_rows(method: str, num_rows: int) -> list[int] | None:
    if method == "vegas":
        return sorted({0, num_rows - 1})          # Collect-2-Query: first and last row
    if method in ("vegas-all", "specextend"):
        return list(range(num_rows))              # specextend needs the last accepted row, known later
    return None


def build_selection(spec: SpecParams, base: int, num_layers: int, kv_heads: int,
                    collected: tuple[dict, dict] | None, collected_rows: list[int] | None,
                    num_accepted: int, layer_keys, quest_cache: dict | None):
    """Return the SparseView for the next draft phase.

    collected: (logits per layer [R, H, base], lse per layer [R, H]) for rows `collected_rows`.
    layer_keys(layer, start, end) -> cached keys [n, KVH, d] (quest page bounds).
    quest_cache: per-request dict carrying page bounds between iterations (pages below base never
    change: truncation only drops entries past the verified prefix)."""
    k = spec.budget(base)
    if spec.method == "stream":
        return StreamSelection(base, k, spec.sink, num_layers, spec.record_recall)
    if spec.method == "quest":
        return QuestSelection(base, k, _quest_bounds(spec, base, num_layers, layer_keys, quest_cache),
                              spec.page_size, spec.granularity, spec.record_recall)
    logits, lse = collected
    if spec.method == "specextend":
        # The last accepted token's row: row 0 is the pending token, row i the i-th draft.
        keep = [collected_rows.index(num_accepted)]
    else:
        keep = list(range(len(collected_rows)))
    per_layer = []
    for layer in range(num_layers):
        if layer not in logits:   # a sliding-window layer: attends its window, nothing collected
            per_layer.append(no_selection(spec.granularity, kv_heads))
            continue
        lg, ls = logits[layer][keep], lse[layer][keep]
        per_layer.append(select_from_logits(lg, ls, k, kv_heads, spec.granularity))
    return FixedSelection(base, k, per_layer, spec.record_recall)


def _quest_bounds(spec: SpecParams, base: int, num_layers: int, layer_keys, cache: dict):
    full = base // spec.page_size
    done = cache.get("pages", 0)
    bounds = cache.setdefault("bounds", [None] * num_layers)
    if full > done:
        for layer in range(num_layers):
            keys = layer_keys(layer, done * spec.page_size, full * spec.page_size)
            kmin, kmax = quest_page_bounds(keys, spec.page_size)
            if bounds[layer] is not None:
                kmin = torch.cat([bounds[layer][0], kmin])
                kmax = torch.cat([bounds[layer][1], kmax])
            bounds[layer] = (kmin, kmax)
        cache["pages"] = full
    if full == 0:
        empty = layer_keys(0, 0, 0)[:0].float()
        return [(empty, empty)] * num_layers
    return list(bounds)
