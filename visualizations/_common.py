"""Helpers shared by the builders: token text lookup, iteration lists, and a figure that says why it is
empty (an empty plot with no words looks like a bug)."""
from __future__ import annotations

import html
import json
import os
import re
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go

# Fate colours: one place, so the stream, the legend and the stage cards agree.
FATE_COLORS = {
    "accepted": "#b2f2bb",    # a draft the target model accepted
    "correction": "#ffd8a8",  # resampled after a rejection
    "bonus": "#a5d8ff",       # sampled after every draft was accepted
    "decode": "#e9ecef",      # plain decoding step (vanilla, or before the first selection)
    "rejected": "#ffc9c9",    # a draft the target model rejected (struck through)
}
FATE_LABELS = {
    "accepted": "accepted draft", "correction": "correction (resampled)", "bonus": "bonus",
    "decode": "plain decode", "rejected": "rejected draft",
}
PHASE_COLORS = {"draft": "#4dabf7", "select": "#fab005", "verify": "#845ef7"}


def token_text(token_texts: Mapping[int, str] | None, token_id: int) -> str:
    """The token's text from the trace's table, or a visible placeholder when the trace lacks it."""
    if token_texts is not None:
        text = token_texts.get(token_id)
        if text is None:
            text = token_texts.get(str(token_id))  # tables that went through JSON without the schema
        if text is not None:
            return text
    return f"⟨{token_id}⟩"


def visible(text: str) -> str:
    """Text for hover labels and titles: whitespace shown as symbols so a newline token is not blank."""
    text = text.replace("\n", "↵").replace("\t", "⇥")
    return text if text.strip() else text.replace(" ", "␣")


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def iterations_of(run) -> list:
    """Iterations of a Trace (all requests), a RequestTrace, or a plain sequence of iterations."""
    if hasattr(run, "all_iterations"):
        return list(run.all_iterations)
    if hasattr(run, "iterations"):
        return list(run.iterations)
    if isinstance(run, Sequence):
        return list(run)
    raise TypeError(f"expected a Trace, a RequestTrace or a list of iterations, got {type(run).__name__}")


def context_ids(request) -> list[int]:
    """Token ids by KV-cache position: the prompt, then the generated tokens."""
    return list(request.prompt_token_ids) + list(request.output_token_ids)


def message_figure(message: str, title: str | None = None, height: int = 260) -> go.Figure:
    """An empty figure carrying a sentence that says why there is nothing to plot."""
    fig = go.Figure()
    # Plotly does not wrap: short lines, so a 1280 px window does not clip the sentence.
    text = "<br>".join(textwrap.wrap(message, 70)) or message
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(title=title, height=height, margin=dict(l=20, r=20, t=50 if title else 20, b=20),
                      meta={"empty": True, "message": message})
    return fig


def natural_key(path: str | os.PathLike) -> list:
    """A file name's sort key with its digit runs as numbers, so that run10 follows run9."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(str(path)))]


def read_result_files(results_dir: str | os.PathLike, pattern: str, max_bytes: int) -> Iterator[tuple[Path, object]]:
    """(path, parsed JSON) of every committed benchmark file matching `pattern`, by name. Files
    that are too large, unreadable or not JSON are skipped: a view then says it has no results
    rather than failing (the loaders of overhead.py and throughput.py share this)."""
    for path in sorted(Path(results_dir).glob(pattern)):
        try:
            if path.stat().st_size > max_bytes:
                continue
            yield path, json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
