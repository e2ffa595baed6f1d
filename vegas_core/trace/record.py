"""One decode iteration as a trace record (a dict in `schema.Iteration`'s shape), made by the engine
core while tracing."""
from __future__ import annotations

from .positions import encode_positions


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


def selection_record(granularity: str, selection) -> dict:
    sets = selection.first_step_sets()
    # Stream keeps one set per layer whatever the granularity asked for: record what was attended.
    if all(s.shape[0] == 1 for s in sets):
        granularity = "layer"
    rec = dict(granularity=granularity, base=selection.base, budget=selection.budget)
    if granularity == "layer":
        rec["layers"] = [encode_positions(s[0].cpu().numpy()) for s in sets]
    else:
        rec["heads"] = [[encode_positions(h.cpu().numpy()) for h in s] for s in sets]
    return rec


def _prob(x: float) -> float:
    return min(1.0, max(0.0, float(x)))
