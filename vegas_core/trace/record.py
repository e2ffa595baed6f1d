"""One decode iteration as a trace record (a dict in `schema.Iteration`'s shape), made by the engine
core while tracing, once the iteration's GPU work is done: everything it reads is on the host by
then (drafts and acceptance read with the acceptance, selected sets copied asynchronously as they
were made), so recording adds host work only, none on the GPU's critical path."""
from __future__ import annotations

import numpy as np

from .positions import encode_position_rows


def iteration_record(index: int, step: int, base: int, drafts: list[int], res, kept: list[int], selection,
                     granularity: str, num_layers: int) -> dict:
    """`res`: the iteration's `RejectionResult`; `kept`: the tokens the request output, a prefix of
    `res.tokens` when the run ended inside the iteration (`num_accepted` and `final_token` stay
    what the verifier decided); `selection`: the view the drafts attended."""
    d = [dict(token_id=t, draft_prob=_prob(res.draft_probs[j]), target_prob=_prob(res.target_probs[j]),
              accepted=j < res.num_accepted) for j, t in enumerate(drafts)]
    kind = "decode" if not drafts else ("bonus" if res.bonus else "correction")
    rec = dict(index=index, step=step, position=base, drafts=d, num_accepted=res.num_accepted,
               emitted=list(kept), final_token=res.tokens[-1], final_kind=kind, selection=None,
               recall=None)
    if selection is not None and drafts:
        rec["selection"] = selection_record(granularity, selection)
        rec["recall"] = selection.recall_per_layer(num_layers)
    return rec


def decode_step_records(index: int, step: int, base: int, kept: list[int]) -> list[dict]:
    """The records of plain decode steps chained in one engine step (a vanilla batch on CUDA
    graphs), one per token kept: what one step at a time records, in the same engine step."""
    return [dict(index=index + j, step=step, position=base + j, drafts=[], num_accepted=0, emitted=[tok],
                 final_token=tok, final_kind="decode", selection=None, recall=None)
            for j, tok in enumerate(kept)]


def selection_record(granularity: str, selection) -> dict:
    """The trace `Selection` of a view's first draft step; made once per view (the iteration that
    chose it shows it, the next one drafted with it)."""
    return selection_records([(granularity, selection)])[0]


def selection_records(items: list[tuple[str, object]]) -> list[dict]:
    """`selection_record` of each (granularity, view): the views without one yet have their sets
    encoded in one call for all of them (a batch's selections, every layer and head)."""
    todo = list({id(v): (g, v) for g, v in items if v.trace_record is None}.values())
    if todo:
        parts = [_blocks(v.host_sets()) for _, v in todo]
        texts = iter(encode_position_rows([b for blocks, _ in parts for b in blocks]))
        for (granularity, view), (_, rows) in zip(todo, parts):
            view.trace_record = _selection(granularity, view, [[next(texts) for _ in range(n)] for n in rows])
    return [v.trace_record for _, v in items]


def _blocks(sets) -> tuple[list[np.ndarray], list[int]]:
    """A view's sets ([L, G, k], or [G, k] per layer) as 2-D blocks to encode, and each layer's
    number of sets: one [L * G, k] block when the layers' shapes agree, else one per layer."""
    if not isinstance(sets, np.ndarray):
        sets = [np.asarray(s) for s in sets]
        if not sets or any(s.shape != sets[0].shape for s in sets):
            return sets, [s.shape[0] for s in sets]
        sets = np.stack(sets)
    return [sets.reshape(-1, sets.shape[2])], [sets.shape[1]] * sets.shape[0]


def _selection(granularity: str, view, per_layer: list[list[str]]) -> dict:
    # Stream keeps one set per layer whatever the granularity asked for: record what was attended.
    if all(len(heads) == 1 for heads in per_layer):
        granularity = "layer"
    rec = dict(granularity=granularity, base=view.base, budget=view.budget)
    if granularity == "layer":
        rec["layers"] = [heads[0] for heads in per_layer]
    else:
        rec["heads"] = per_layer
    return rec


def _prob(x: float) -> float:
    return min(1.0, max(0.0, float(x)))
