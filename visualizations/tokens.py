"""The generated text as tokens coloured by fate, the step-through stage cards, and the live counters.

Fates (one per emitted token, from the iteration that emitted it):
  accepted    a draft the target model accepted
  correction  the token resampled after the first rejected draft
  bonus       the token sampled after every draft was accepted
  decode      a plain step without drafts (vanilla, or a speculative request's first iteration)
  rejected    a draft the target model rejected: never part of the output, shown struck through
              after the accepted drafts of its iteration, hidden unless asked for
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._common import FATE_COLORS, FATE_LABELS, esc, token_text, visible


@dataclass(frozen=True)
class Piece:
    token_id: int
    text: str
    kind: str          # accepted | correction | bonus | decode | rejected
    iteration: int
    title: str


def stream_pieces(iterations: Sequence, token_texts: Mapping[int, str] | None,
                  output_token_ids: Sequence[int] | None = None) -> list[Piece]:
    """Pieces in display order. `output_token_ids`, when given, caps the emitted tokens (a stop token
    or max_tokens can cut the last iteration short); without iterations they are shown as plain decode."""
    limit = len(output_token_ids) if output_token_ids is not None else None
    pieces: list[Piece] = []
    emitted = 0
    for it in iterations:
        drafts = list(it.drafts)
        for j, d in enumerate(drafts):
            kind = "accepted" if d.accepted else "rejected"
            if kind == "accepted":
                if limit is not None and emitted >= limit:
                    return pieces
                emitted += 1
            title = (f"iteration {it.index}, draft {j + 1}: {FATE_LABELS[kind]} "
                     f"(q={d.draft_prob:.3f}, p={d.target_prob:.3f})")
            pieces.append(Piece(d.token_id, token_text(token_texts, d.token_id), kind, it.index, title))
        if limit is not None and emitted >= limit:
            return pieces
        emitted += 1
        kind = it.final_kind
        title = f"iteration {it.index}: {FATE_LABELS[kind]}"
        pieces.append(Piece(it.final_token, token_text(token_texts, it.final_token), kind, it.index, title))
    if output_token_ids is not None and emitted < len(output_token_ids) and not pieces:
        for tid in output_token_ids:
            pieces.append(Piece(tid, token_text(token_texts, tid), "decode", -1, "no iteration record"))
    return pieces


def _piece_html(p: Piece) -> str:
    style = f"background:{FATE_COLORS[p.kind]};"
    if p.kind == "rejected":
        style += "text-decoration:line-through;color:#c92a2a;"
    text = esc(p.text).replace("\n", "↵<br>")
    return (f'<span class="vs-tok vs-{p.kind}" data-kind="{p.kind}" data-iter="{p.iteration}" '
            f'data-token="{p.token_id}" title="{esc(p.title)}" style="{style}">{text}</span>')


STREAM_CSS = """
.vs-stream { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px; line-height: 1.9;
             white-space: pre-wrap; word-break: break-word; padding: 8px; min-height: 3em; }
.vs-stream .vs-tok { border-radius: 3px; padding: 1px 0; margin: 0 1px 0 0; }
.vs-stream .vs-rejected { display: none; }
.vs-stream.show-rejected .vs-rejected, .show-rejected .vs-stream .vs-rejected { display: inline; }
.vs-legend span { border-radius: 3px; padding: 1px 6px; margin-right: 6px; font-size: 12px; }
"""


def legend_html() -> str:
    items = "".join(
        f'<span style="background:{FATE_COLORS[k]};{"text-decoration:line-through;" if k == "rejected" else ""}">'
        f"{esc(FATE_LABELS[k])}</span>" for k in FATE_COLORS)
    return f'<div class="vs-legend">{items}</div>'


def token_stream_html(pieces: Sequence[Piece], show_rejected: bool = False, placeholder: str = "",
                      include_style: bool = True) -> str:
    """The coloured stream; rejected drafts are in the markup but hidden unless `show_rejected` (or an
    ancestor element has class `show-rejected`, which the app toggles without re-rendering)."""
    cls = "vs-stream show-rejected" if show_rejected else "vs-stream"
    body = "".join(_piece_html(p) for p in pieces) or f'<span class="vs-placeholder">{esc(placeholder)}</span>'
    style = f"<style>{STREAM_CSS}</style>" if include_style else ""
    counts = {k: sum(p.kind == k for p in pieces) for k in FATE_COLORS}
    data = " ".join(f'data-{k}="{n}"' for k, n in counts.items())
    return f'{style}{legend_html()}<div class="{cls}" {data}>{body}</div>'


def iteration_stages_html(iteration, token_texts: Mapping[int, str] | None, num_layers: int | None = None,
                          next_iteration=None, label: str = "") -> str:
    """Four cards for one iteration in engine order: draft (against the selected set), verify, accept,
    select (the set the next draft phase will use, chosen from this verification)."""
    if iteration is None:
        return '<div class="vs-stages"><em>No iteration yet: press Generate, then Pause and Step.</em></div>'
    it = iteration
    tt = lambda t: esc(visible(token_text(token_texts, t)))  # noqa: E731
    sel = it.selection
    if sel is not None:
        attended = f"{sel.budget} selected entries per {'layer' if sel.granularity == 'layer' else 'KV head'}" \
                   f" of the first {sel.base}, plus every entry from position {sel.base} on"
    elif it.drafts:
        attended = "a selection not recorded in this trace"
    else:
        attended = "no drafting: a plain full-attention step"
    drafts = "".join(
        f'<tr><td>{j + 1}</td><td><code>{tt(d.token_id)}</code></td><td>{d.draft_prob:.3f}</td></tr>'
        for j, d in enumerate(it.drafts)) or '<tr><td colspan="3">no drafts</td></tr>'
    verify = "".join(
        f'<tr><td>{j + 1}</td><td><code>{tt(d.token_id)}</code></td><td>{d.target_prob:.3f}</td>'
        f'<td>{"✔" if d.accepted else "✘"}</td></tr>' for j, d in enumerate(it.drafts)) \
        or '<tr><td colspan="4">one full-attention decode step</td></tr>'
    final = f'<code style="background:{FATE_COLORS[it.final_kind]}">{tt(it.final_token)}</code>'
    accept = (f"{it.num_accepted} of {len(it.drafts)} drafts accepted, then {FATE_LABELS[it.final_kind]} "
              f"{final}; {len(it.emitted)} token(s) emitted. Rejected drafts' KV entries are dropped.")
    nxt = getattr(next_iteration, "selection", None) if next_iteration is not None else None
    if nxt is not None:
        select = (f"From this verification's attention logits the next draft phase keeps {nxt.budget} of "
                  f"{nxt.base} entries per {'layer' if nxt.granularity == 'layer' else 'KV head'}"
                  + (f" in all {num_layers} layers" if num_layers else "") + " (see the KV selection tab).")
    elif it.drafts or sel is not None:
        select = "The next draft phase's set is chosen from this verification (not recorded yet: last iteration)."
    else:
        select = "No selection: vanilla decoding, or the set is chosen from this step for the next iteration."
    timing = f"draft {it.draft_ms:.1f} ms · verify {it.verify_ms:.1f} ms · select {it.select_ms:.1f} ms"
    card = '<div class="vs-stage" data-stage="{k}" style="flex:1;min-width:200px;border:1px solid #dee2e6;' \
           'border-radius:6px;padding:6px 8px;"><b>{n}. {t}</b><div style="font-size:13px">{b}</div></div>'
    cards = [
        card.format(k="draft", n=1, t="Draft", b=f"Attends {esc(attended)}.<table><tr><th>#</th><th>token</th>"
                                                 f"<th>q</th></tr>{drafts}</table>"),
        card.format(k="verify", n=2, t="Verify", b="One full-attention pass over the pending token and the drafts."
                                                   f"<table><tr><th>#</th><th>token</th><th>p</th><th></th></tr>"
                                                   f"{verify}</table>"),
        card.format(k="accept", n=3, t="Accept", b=accept),
        card.format(k="select", n=4, t="Select", b=esc(select)),
    ]
    head = (f'<div style="margin-bottom:4px"><b>Iteration {it.index}</b> {esc(label)} — position {it.position}, '
            f'{esc(timing)}</div>')
    return f'<div class="vs-stages" data-iteration="{it.index}">{head}<div style="display:flex;gap:8px;' \
           f'flex-wrap:wrap">{"".join(cards)}</div></div>'


def counters_html(tokens: int, tokens_per_s: float | None, mean_acceptance_length: float | None,
                  iterations: int, status: str = "") -> str:
    """Live counters; each value carries a data attribute so tests and scripts can read it."""
    tps = f"{tokens_per_s:.1f}" if tokens_per_s else "–"
    mal = f"{mean_acceptance_length:.2f}" if mean_acceptance_length else "–"
    cell = ('<div style="padding:4px 12px;border:1px solid #dee2e6;border-radius:6px">'
            '<div style="font-size:11px;color:#868e96">{l}</div><div style="font-size:20px" '
            'data-counter="{k}">{v}</div></div>')
    cells = "".join(cell.format(l=l, k=k, v=v) for l, k, v in (
        ("tokens", "tokens", tokens), ("tokens/s", "tokens_per_s", tps),
        ("mean acceptance length", "mean_acceptance_length", mal), ("iterations", "iterations", iterations)))
    return (f'<div class="vs-counters" style="display:flex;gap:8px;align-items:center;flex-wrap:wrap">{cells}'
            f'<div class="vs-status" style="margin-left:8px">{esc(status)}</div></div>')
