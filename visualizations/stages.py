"""The step-through cards of one decode iteration, in engine order: Draft, Verify, Accept, Select.

Iterations are numbered from 1 on screen (the trace's `index` + 1), as the live counter counts them.
Inputs beyond the iteration, each optional:
  config, model  the run's RunConfig and ModelInfo (method, temperature, budget; layer count)
  selected       the Selection this iteration's verification chose for the next draft phase (live:
                 the engine's `StepOutput.selected`; a trace: the next iteration's `selection`)
  accept_draws   the uniforms u_i the acceptance test used (sampled runs, live only: traces keep
                 no draws)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._common import FATE_COLORS, FATE_LABELS, esc, token_text, visible
from .strip import selection_strip_html

SELECT_HOW = {
    "vegas": "Collect-2-Query: while verifying, the attention kernel also kept the pre-softmax logits of "
             "its first and last query rows. Per layer each prefix entry's softmax weight, averaged over the "
             "query heads and the two rows, ranks it; the top k = clamp(⌈sparsity·n⌉, min budget, n) are kept.",
    "vegas-all": "As Vegas, but from all γ + 1 query rows of the verification (costlier to collect).",
    "specextend": "From the attention of the last accepted token only (known once acceptance is done), "
                  "layer by layer: the verification collects every row, this keeps the top k of one.",
    "stream": "No scoring: the attention sink (the first tokens) and the most recent tokens, k entries in "
              "all, the same set in every layer.",
    "quest": "Nothing is chosen here. Quest keeps each page's element-wise min and max keys; at every draft "
             "step and layer it scores the pages by Σ_d max(q_d·kmax_d, q_d·kmin_d) from the draft's own query "
             "and keeps the top pages within the budget. So the set is picked while drafting (Draft shows "
             "its first step's set).",
    "vanilla": "No selection: vanilla decodes every token with full attention.",
}


def _outcome(j: int, it) -> tuple[str, str]:
    """(symbol, words) for draft j: accepted, the first rejection, or never checked after it."""
    if j < it.num_accepted:
        return "✔", "accepted"
    if j == it.num_accepted:
        return "✘", "rejected"
    return "–", "not checked (after the first rejection)"


def _verify_rows(it, tt, greedy: bool, draws: Sequence[float] | None) -> str:
    rows = []
    for j, d in enumerate(it.drafts):
        sym, words = _outcome(j, it)
        if greedy:
            choice = tt(d.token_id) if j < it.num_accepted else tt(it.final_token) if j == it.num_accepted else "–"
            test = f"<td><code>{choice}</code></td>"
        else:
            ratio = d.target_prob / d.draft_prob if d.draft_prob > 0 else float("inf")
            u = f"{draws[j]:.3f}" if draws is not None and j <= it.num_accepted else "–"
            test = f"<td>{min(1.0, ratio):.3f}</td><td data-draw='{j}'>{u}</td>"
        rows.append(f"<tr data-outcome='{words.split()[0]}'><td>{j + 1}</td><td><code>{tt(d.token_id)}</code></td>"
                    f"<td>{d.draft_prob:.3f}</td><td>{d.target_prob:.3f}</td>{test}<td title='{words}'>{sym} "
                    f"<span style='font-size:11px'>{words}</span></td></tr>")
    head = "<th>target's argmax</th>" if greedy else "<th>min(1, p/q)</th><th>u</th>"
    return (f"<table><tr><th>#</th><th>draft</th><th>q</th><th>p</th>{head}<th></th></tr>{''.join(rows)}</table>"
            if rows else "<em>one full-attention decode step: no drafts to check</em>")


def _rule(greedy: bool, temperature: float, draws) -> str:
    if greedy:
        return ("<b>Rule (temperature 0):</b> draft i is accepted when it equals the target's argmax at its "
                "position; at the first mismatch the target's argmax replaces it (correction); when all match, "
                "the target's next argmax is a bonus token. Drafts after the first mismatch are not checked.")
    draws_note = "" if draws is not None else " (the draws are shown live; traces do not keep them)"
    return (f"<b>Rule (temperature {temperature:g}):</b> draft i is accepted when u<sub>i</sub> &lt; "
            "min(1, p<sub>i</sub>/q<sub>i</sub>), u<sub>i</sub> a uniform draw" + draws_note + "; at the first "
            "rejection the replacement is sampled from norm(max(0, p − q)); when all are accepted a bonus is "
            "sampled from p. The output is then distributed exactly as plain sampling from p.")


def _accept_text(it, tt) -> str:
    final = f'<code style="background:{FATE_COLORS[it.final_kind]}">{tt(it.final_token)}</code>'
    n, k, m = len(it.drafts), it.num_accepted, len(it.emitted)
    head = (f"{k} of {n} drafts accepted (the drafter's count), then {FATE_LABELS[it.final_kind]} {final}"
            if n else f"plain decode: {final}")
    cut = m < k + 1
    tail = (f"; <b>{m} token(s) emitted</b>: the run ended inside this iteration (max tokens or a stop), so "
            f"only the first {m} were output" if cut else f"; {m} token(s) emitted")
    return head + tail + (". Rejected and unchecked drafts' KV entries are dropped." if n else ".")


def _select_text(it, config, selected, num_layers: int | None) -> str:
    method = getattr(config, "method", None)
    how = SELECT_HOW.get(method, "")
    if method == "vanilla":
        return esc(how)
    if selected is not None:
        per = "layer" if selected.granularity == "layer" else "KV head"
        return (f"{esc(how)} <b>Kept {selected.budget} of {selected.base} entries per {per}</b>"
                + (f" in each of {num_layers} layers" if num_layers else "")
                + f"; positions ≥ {selected.base} are always attended. Which layers kept what:")
    if method == "quest":
        return esc(how)
    return esc(how) + " <em>The set chosen here is not available: the run ended after this iteration.</em>"


def _card(key: str, n: int, title: str, body: str) -> str:
    # Two cards a row from ~900 px: a verify table of 16 drafts needs the width.
    return (f'<div class="vs-stage" data-stage="{key}" style="flex:1 1 420px;min-width:0;overflow-x:auto;'
            f'border:1px solid #dee2e6;border-radius:6px;padding:6px 8px;"><b>{n}. {title}</b>'
            f'<div style="font-size:13px">{body}</div></div>')


def iteration_stages_html(iteration, token_texts: Mapping[int, str] | None, config=None, model=None,
                          selected=None, accept_draws: Sequence[float] | None = None, label: str = "") -> str:
    if iteration is None:
        return '<div class="vs-stages"><em>No iteration yet: press Generate, then Pause and Step.</em></div>'
    it = iteration
    tt = lambda t: esc(visible(token_text(token_texts, t)))  # noqa: E731
    layers = getattr(model, "num_layers", None)
    kv_heads = getattr(model, "num_kv_heads", 1)
    temperature = float(getattr(config, "temperature", 0.0) or 0.0)
    greedy = temperature == 0.0
    sel = it.selection
    if sel is not None:
        per = "layer" if sel.granularity == "layer" else "KV head"
        attended = (f"Attends {sel.budget} selected entries per {per} of the first {sel.base}, plus every entry "
                    f"from position {sel.base} on (written since the last verification).")
        strip = selection_strip_html(sel, layers, kv_heads, "attended") if layers else ""
    else:
        attended = ("a selection not recorded in this trace" if it.drafts else
                    "No drafting: a plain full-attention step (vanilla, or the first iteration, which has no "
                    "selection yet).")
        strip = ""
    draft_list = " ".join(f"<code>{tt(d.token_id)}</code>" for d in it.drafts)
    draft = f"{esc(attended)}{' Drafts: ' + draft_list if draft_list else ''}{strip}"
    verify = ("One full-attention pass over the pending token and the drafts gives the target's p at every "
              "position." + _verify_rows(it, tt, greedy, accept_draws))
    accept = _rule(greedy, temperature, accept_draws) + "<p>" + _accept_text(it, tt) + "</p>"
    select = _select_text(it, config, selected, layers)
    if selected is not None and layers:
        select += selection_strip_html(selected, layers, kv_heads, "kept for the next drafts")
    timing = f"draft {it.draft_ms:.1f} ms · verify {it.verify_ms:.1f} ms · select {it.select_ms:.1f} ms"
    cards = [_card("draft", 1, "Draft", draft), _card("verify", 2, "Verify", verify),
             _card("accept", 3, "Accept", accept), _card("select", 4, "Select", select)]
    head = (f'<div style="margin-bottom:4px"><b>Iteration {it.index + 1}</b> {esc(label)} — verified prefix '
            f'{it.position} tokens, {esc(timing)}</div>')
    return (f'<div class="vs-stages" data-iteration="{it.index + 1}">{head}<div style="display:flex;gap:8px;'
            f'flex-wrap:wrap">{"".join(cards)}</div></div>')
