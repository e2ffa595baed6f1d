"""Iteration breakdown per method: mean draft / select / verify milliseconds per engine step.

Timings in a trace belong to the batched engine step (requests of one step share them), so each step
is counted once: the first iteration seen with a given `step` stands for it.
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from ._common import PHASE_COLORS, iterations_of, message_figure

PHASES = ("draft", "select", "verify")


def step_breakdown(run) -> dict[str, float] | None:
    """{'draft': ms, 'select': ms, 'verify': ms, 'steps': n} averaged over distinct engine steps."""
    seen = {}
    for it in iterations_of(run):
        seen.setdefault(it.step, it)
    if not seen:
        return None
    n = len(seen)
    out = {p: sum(getattr(it, f"{p}_ms") for it in seen.values()) / n for p in PHASES}
    out["steps"] = n
    return out


def breakdown_figure(runs: Mapping[str, object]) -> go.Figure:
    """Horizontal stacked bars, one per run label."""
    rows = {label: step_breakdown(run) for label, run in runs.items()}
    rows = {k: v for k, v in rows.items() if v}
    if not rows:
        return message_figure("No iterations to break down yet.", "Iteration breakdown")
    labels = list(rows)
    fig = go.Figure()
    for p in PHASES:
        fig.add_trace(go.Bar(y=labels, x=[rows[k][p] for k in labels], name=p, orientation="h",
                             marker_color=PHASE_COLORS[p],
                             customdata=[rows[k]["steps"] for k in labels],
                             hovertemplate=f"%{{y}}: {p} %{{x:.2f}} ms per step (%{{customdata}} steps)<extra></extra>"))
    fig.update_layout(barmode="stack", title="Iteration breakdown: mean time per engine step",
                      xaxis_title="milliseconds per step", height=max(300, 140 + 45 * len(labels)),
                      yaxis=dict(autorange="reversed", automargin=True), margin=dict(l=110, r=20, t=50, b=50))
    return fig
