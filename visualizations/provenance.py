"""Every figure says what it shows and where its numbers come from: a subtitle with the run's settings
(model, method, gamma, sparsity, prompt length, device) and a provenance tag, "measured live on <device>"
or "from <file>, <date>, <device>". The tag is also kept in `layout.meta["provenance"]` for tests.

Figures share one look fit for slides: a 16 px title, 13 px subtitle, legend at the right of the plot
area (never over the subtitle), no fixed width (the page sizes them; exports pick theirs).
"""
from __future__ import annotations

import textwrap

import plotly.graph_objects as go

TITLE_PX, SUBTITLE_PX, TICK_PX = 16, 13, 12


def prompt_length(trace) -> int | None:
    reqs = getattr(trace, "requests", None) or []
    return len(reqs[0].prompt_token_ids) if reqs else None


def settings_line(trace, method: bool = True) -> str:
    """'SmolLM2-135M-Instruct · vegas · γ 4 · sparsity 0.07 · prompt 31 tokens · cpu' (temperature when > 0)."""
    m, c = trace.model, trace.config
    parts = [m.name]
    if method:
        parts.append(c.method)
    if c.method != "vanilla" or not method:
        parts += [f"γ {c.gamma}", f"sparsity {c.sparsity:g}"]
    n = prompt_length(trace)
    if n is not None:
        parts.append(f"prompt {n} tokens")
    if c.temperature > 0:
        parts.append(f"temperature {c.temperature:g}")
    parts.append(m.device)
    return " · ".join(parts)


def live_provenance(trace) -> str:
    return f"measured live on {trace.model.device}, {trace.created[:10]}"


def file_provenance(path: str, date: str, device: str) -> str:
    return f"from {path}, {date[:10]}, {device}"


def wrap(text: str, width: int = 80) -> str:
    """Plotly does not wrap text: break long sentences with <br> so a narrow panel does not clip them."""
    return "<br>".join(textwrap.wrap(text, width)) or text


def stamp(fig: go.Figure, settings: str | None, provenance: str | None) -> go.Figure:
    """Add the settings and provenance under the title, the shared fonts, and a legend at the right; the top
    margin grows with the subtitle's lines so they never reach the plot area."""
    title = fig.layout.title.text or ""
    sub = "<br>".join(wrap(x, 110) for x in (settings, provenance) if x)
    lines = sub.count("<br>") + 1 if sub else 0
    meta = dict(fig.layout.meta or {})
    meta.update(provenance=provenance, settings=settings)
    fig.update_layout(
        title=dict(text=title, font=dict(size=TITLE_PX), x=0.01, xanchor="left",
                   subtitle=dict(text=sub, font=dict(size=SUBTITLE_PX, color="#495057"))),
        font=dict(size=TICK_PX), meta=meta,
        # At the right, top-aligned: never over the two-line subtitle, however many runs it lists.
        legend=dict(orientation="v", yanchor="top", y=1.0, xanchor="left", x=1.01, font=dict(size=TICK_PX)),
        margin=dict(t=max(120, 64 + 19 * lines, fig.layout.margin.t or 0), l=max(60, fig.layout.margin.l or 0),
                    r=max(30, fig.layout.margin.r or 0), b=max(55, fig.layout.margin.b or 0)))
    return fig
