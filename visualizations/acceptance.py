"""Acceptance plots for one or several runs (label -> Trace, RequestTrace or list of iterations).

Metrics follow `vegas_core.trace.aggregates` (vLLM's names): only speculative iterations (those that
drafted) count; mean acceptance length = 1 + accepted drafts / speculative iterations.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go

from vegas_core.trace import aggregates

from ._common import iterations_of, message_figure

PALETTE = ["#1c7ed6", "#e8590c", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#c2255c", "#5c940d"]
NO_SPEC = "No speculative iterations yet (vanilla decoding drafts nothing)."


def _spec(run) -> list:
    return [it for it in iterations_of(run) if it.final_kind != "decode"]


def _gamma(run, spec) -> int:
    cfg = getattr(run, "config", None)
    return cfg.gamma if cfg is not None else max(len(it.drafts) for it in spec)


def per_position_acceptance_figure(runs: Mapping[str, object]) -> go.Figure:
    """Share of speculative iterations whose draft i was accepted, for i = 1..gamma."""
    fig = go.Figure()
    for k, (label, run) in enumerate(runs.items()):
        spec = _spec(run)
        if not spec:
            continue
        rates = aggregates.per_position_acceptance(spec, _gamma(run, spec))
        fig.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers", name=label,
                                 line=dict(color=PALETTE[k % len(PALETTE)]),
                                 hovertemplate=f"{label}<br>draft %{{x}}: %{{y:.2f}}<extra></extra>"))
    if not fig.data:
        return message_figure(NO_SPEC, "Per-position acceptance")
    fig.update_layout(title="Per-position acceptance rate (accepted: the drafter's count)",
                      xaxis=dict(title="draft position", dtick=1),
                      yaxis=dict(title="accepted share", range=[0, 1.05]), height=380)
    return fig


def accepted_length_histogram(runs: Mapping[str, object]) -> go.Figure:
    """How many drafts each speculative iteration accepted (0..gamma), as a share of iterations."""
    fig = go.Figure()
    for k, (label, run) in enumerate(runs.items()):
        spec = _spec(run)
        if not spec:
            continue
        gamma = _gamma(run, spec)
        counts = np.bincount([it.num_accepted for it in spec], minlength=gamma + 1)[:gamma + 1]
        fig.add_trace(go.Bar(x=list(range(gamma + 1)), y=(counts / counts.sum()).tolist(), name=label,
                             customdata=counts.tolist(), marker_color=PALETTE[k % len(PALETTE)],
                             hovertemplate=f"{label}<br>%{{x}} accepted: %{{customdata}} iterations "
                                           "(%{y:.0%})<extra></extra>"))
    if not fig.data:
        return message_figure(NO_SPEC, "Accepted drafts per iteration")
    fig.update_layout(title="Accepted drafts per speculative iteration", barmode="group",
                      xaxis=dict(title="accepted drafts", dtick=1), yaxis=dict(title="share of iterations"),
                      height=380)
    return fig


def running_mean_figure(runs: Mapping[str, object]) -> go.Figure:
    """Mean acceptance length over the first n speculative iterations, against n."""
    fig = go.Figure()
    for k, (label, run) in enumerate(runs.items()):
        spec = _spec(run)
        if not spec:
            continue
        acc = np.cumsum([it.num_accepted for it in spec])
        mean = 1 + acc / np.arange(1, len(spec) + 1)
        fig.add_trace(go.Scatter(x=list(range(1, len(spec) + 1)), y=mean.tolist(), mode="lines", name=label,
                                 line=dict(color=PALETTE[k % len(PALETTE)]),
                                 hovertemplate=f"{label}<br>after %{{x}} iterations: %{{y:.2f}}<extra></extra>"))
    if not fig.data:
        return message_figure(NO_SPEC, "Running mean acceptance length")
    fig.update_layout(title="Running mean acceptance length (1 + accepted drafts per iteration)",
                      xaxis_title="speculative iteration", yaxis_title="mean acceptance length", height=380)
    return fig
