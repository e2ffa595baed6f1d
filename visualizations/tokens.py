"""The generated text as tokens coloured by fate, and the live counters (the step-through cards are in
stages.py). Iterations are numbered from 1 on screen.

Fates (one per emitted token, from the iteration that emitted it):
  accepted    a draft the target model accepted
  correction  the token resampled after the first rejected draft
  bonus       the token sampled after every draft was accepted
  decode      a plain step without drafts (vanilla, or a speculative request's first iteration)
  rejected    a draft the target model rejected, or one after the first rejection that was never
              checked (its title says which): never part of the output, shown struck through after
              the accepted drafts of its iteration, hidden unless asked for
Only an iteration's `emitted` tokens are shown as output: a run that ended inside an iteration (max
tokens, a stop) output a prefix of its accepted drafts and final token.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from vegas_core.trace.aggregates import MEAN_ACCEPTANCE_LENGTH

from ._common import FATE_COLORS, FATE_LABELS, esc, token_text


class Piece(NamedTuple):     # a tuple: a trace at the upload limit makes ~110K of them per render
    token_id: int
    text: str
    kind: str          # accepted | correction | bonus | decode | rejected
    iteration: int
    title: str


def stream_pieces(iterations: Sequence, token_texts: Mapping[int, str] | None,
                  output_token_ids: Sequence[int] | None = None) -> list[Piece]:
    """Pieces in display order. `output_token_ids`, when given, also caps the emitted tokens (traces
    recorded before `emitted` was cut at the output kept tokens past it); without iterations they are
    shown as plain decode."""
    limit = len(output_token_ids) if output_token_ids is not None else None
    pieces: list[Piece] = []
    emitted = 0
    texts: dict[int, str] = {}          # token id -> text: a vocabulary's worth of lookups, not one a piece

    def token(tid: int) -> str:
        text = texts.get(tid)
        if text is None:
            text = texts[tid] = token_text(token_texts, tid)
        return text

    for it in iterations:
        n = it.index + 1
        out = list(it.emitted)
        for j, d in enumerate(it.drafts):
            if d.accepted:
                if j >= len(out) or (limit is not None and emitted >= limit):
                    return pieces
                emitted += 1
                title = f"iteration {n}, draft {j + 1}: accepted (q={d.draft_prob:.3f}, p={d.target_prob:.3f})"
                pieces.append(Piece(d.token_id, token(d.token_id), "accepted", n, title))
                continue
            why = "rejected" if j == it.num_accepted else "not checked (after the first rejection)"
            title = f"iteration {n}, draft {j + 1}: {why} (q={d.draft_prob:.3f}, p={d.target_prob:.3f})"
            pieces.append(Piece(d.token_id, token(d.token_id), "rejected", n, title))
        if len(out) <= it.num_accepted or (limit is not None and emitted >= limit):
            return pieces
        emitted += 1
        kind = it.final_kind
        pieces.append(Piece(it.final_token, token(it.final_token), kind, n,
                            f"iteration {n}: {FATE_LABELS[kind]}"))
    if output_token_ids is not None and emitted < len(output_token_ids) and not pieces:
        for tid in output_token_ids:
            pieces.append(Piece(tid, token(tid), "decode", 0, "no iteration record"))
    return pieces


_STYLES = {k: f"background:{c};" + ("text-decoration:line-through;color:#c92a2a;" if k == "rejected" else "")
           for k, c in FATE_COLORS.items()}


def _piece_html(p: Piece, text_html: dict[str, str]) -> str:
    """One token's span; `text_html` caches each distinct text's escaped markup across a render."""
    text = text_html.get(p.text)
    if text is None:
        text = text_html[p.text] = esc(p.text).replace("\n", "↵<br>")
    return (f'<span class="vs-tok vs-{p.kind}" data-kind="{p.kind}" data-iter="{p.iteration}" '
            f'data-token="{p.token_id}" title="{esc(p.title)}" style="{_STYLES[p.kind]}">{text}</span>')


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
    text_html: dict[str, str] = {}
    body = ("".join([_piece_html(p, text_html) for p in pieces])
            or f'<span class="vs-placeholder">{esc(placeholder)}</span>')
    style = f"<style>{STREAM_CSS}</style>" if include_style else ""
    kinds = Counter(p.kind for p in pieces)
    counts = {k: kinds[k] for k in FATE_COLORS}
    data = " ".join(f'data-{k}="{n}"' for k, n in counts.items())
    return f'{style}{legend_html()}<div class="{cls}" {data}>{body}</div>'


def counters_html(tokens: int, tokens_per_s: float | None, mean_acceptance_length: float | None,
                  iterations: int, status: str = "") -> str:
    """Live counters; each value carries a data attribute so tests and scripts can read it."""
    tps = f"{tokens_per_s:.1f}" if tokens_per_s else "–"
    mal = f"{mean_acceptance_length:.2f}" if mean_acceptance_length else "–"
    cell = ('<div style="padding:4px 12px;border:1px solid #dee2e6;border-radius:6px" title="{t}">'
            '<div style="font-size:11px;color:#868e96">{l}</div><div style="font-size:20px" '
            'data-counter="{k}">{v}</div></div>')
    cells = "".join(cell.format(l=l, k=k, v=v, t=esc(t)) for l, k, v, t in (
        ("tokens emitted", "tokens", tokens, "tokens output so far (what you got)"),
        ("tokens/s", "tokens_per_s", tps, "tokens emitted / decode time of the iterations shown"),
        ("mean acceptance length (accepted)", "mean_acceptance_length", mal, MEAN_ACCEPTANCE_LENGTH),
        ("iterations", "iterations", iterations, "decode iterations so far, numbered from 1")))
    return (f'<div class="vs-counters" style="display:flex;gap:8px;align-items:center;flex-wrap:wrap">{cells}'
            f'<div class="vs-status" style="margin-left:8px">{esc(status)}</div></div>')
