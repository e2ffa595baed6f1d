"""Where does Vegas pay off? Decode tokens/s of vanilla, stream and vegas against batch size, one
panel per context, with the bandwidth bound that no plain decoder passes drawn in each panel.

Input: a sweep document (`vegas_core.bench.sweep.run_sweep`, the app's cache, or a
`bench/results/sweep-*.json` file): `date`, `device`, `model`, `dtype`, `mode`, `settings`, `grid`
and one record per cell (`batch`, `context`, `bound`, `methods`, or `refused`). A sweep still
running, or stopped, draws the cells it has.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._common import message_figure
from .provenance import stamp, wrap

TITLE = "Where does Vegas pay off? Decode tokens/s by batch, one panel per context"
METHOD_COLORS = {"vanilla": "#495057", "stream": "#f08c00", "vegas": "#2f9e44"}
BOUND_COLOR = "#c92a2a"
NO_SWEEP = ("No sweep measured with this model on this device yet: press Run sweep to measure vanilla, stream "
            "and vegas over the grid on this app's engine.")
MODES = {"deterministic": "batch-invariant kernels", "default": "Triton kernels", "reference": "PyTorch reference"}


def context_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else f"{tokens:,}"


def measured_at(doc: dict) -> str:
    """'2026-12-07 10:31 +01:00' from the document's ISO time."""
    date = str(doc.get("date", ""))
    if "T" not in date:
        return date
    day, clock = date.split("T", 1)
    return f"{day} {clock[:5]}" + (f" {clock[8:]}" if len(clock) > 8 else "")


def live_label(doc: dict, cached: bool = False) -> str:
    when = f"measured live on {doc.get('device', 'an unknown device')} at {measured_at(doc)}"
    state = " (stopped: the cells it reached)" if doc.get("stopped") else \
        "" if doc.get("complete") else " (running)"
    return when + state + ("; cached, Run sweep measures again" if cached else "")


def settings_label(doc: dict) -> str:
    s, grid = doc.get("settings", {}), doc.get("grid", {})
    traced = " · trace recorded" if doc.get("traced") else ""
    return (f"{doc.get('model')} · {doc.get('dtype')} · {MODES.get(doc.get('mode'), doc.get('mode'))}{traced} · "
            f"γ {s.get('gamma')} · sparsity {s.get('sparsity'):g} · min budget {s.get('min_budget')} · "
            f"{grid.get('gen_tokens')} greedy tokens a request")


def sweep_figure(doc: dict | None, provenance: str | None = None) -> go.Figure:
    """The figure; `provenance` replaces the live label (e.g. for a committed file)."""
    records = (doc or {}).get("records") or []
    if not records:
        return message_figure(NO_SWEEP if doc is None else "The sweep has not measured a cell yet.", TITLE,
                              height=320)
    contexts = list(dict.fromkeys(doc["grid"]["contexts"]))
    fig = make_subplots(rows=1, cols=len(contexts), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"context {context_label(c)}" for c in contexts])
    for col, context in enumerate(contexts, start=1):
        cells = [r for r in records if r["context"] == context and not r["refused"] and r.get("bound")]
        if not cells:    # a panel with nothing measured says why, not an empty grid
            reached = any(r["context"] == context for r in records)
            fig.add_annotation(text="not run (below)" if reached else "not reached", showarrow=False,
                               x=0.5, y=0.5, xref=f"x{col if col > 1 else ''} domain",
                               yref=f"y{col if col > 1 else ''} domain", font=dict(size=13, color="#868e96"))
        _add_bound(fig, cells, col)
        for method in doc.get("methods", METHOD_COLORS):
            done = [r for r in cells if method in r["methods"]]
            m = [r["methods"][method] for r in done]
            fig.add_trace(go.Scatter(
                x=[r["batch"] for r in done], y=[x["tokens_per_s"] for x in m], name=method,
                legendgroup=method, showlegend=col == 1, mode="lines+markers",
                line=dict(color=METHOD_COLORS.get(method), width=2.5 if method == "vegas" else 1.8),
                customdata=[[x["of_bound"] * 100, x.get("speedup_vs_vanilla") or 1.0,
                             x.get("mean_acceptance_length") or 1.0] for x in m],
                hovertemplate=f"{method}, batch %{{x}}, context {context_label(context)}: %{{y:,.0f}} tokens/s"
                              "<br>%{customdata[0]:.0f} % of the bound, %{customdata[1]:.2f}× vanilla, "
                              "mean acceptance length %{customdata[2]:.2f}<extra></extra>"), row=1, col=col)
    batches = doc["grid"]["batches"]
    span = [math.log10(min(batches)) - 0.15, math.log10(max(batches)) + 0.15]   # the same on every panel
    fig.update_xaxes(type="log", range=span, tickvals=batches, ticktext=[str(b) for b in batches], title_text="batch")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="decode tokens/s", row=1, col=1)
    refused = [r for r in records if r["refused"]]
    note = "Not run: " + "; ".join(f"batch {r['batch']} × {context_label(r['context'])} ({r['refused']})"
                                   for r in refused) if refused else None
    if note:
        fig.add_annotation(text=wrap(note, 140), showarrow=False, x=0, y=-0.28, xref="paper", yref="paper",
                           xanchor="left", yanchor="top", align="left", font=dict(size=11, color="#862e9c"))
    fig.update_layout(title=TITLE, height=470 + (40 if note else 0),
                      margin=dict(t=150, b=90 + (50 if note else 0)),
                      meta={"kind": "sweep", "date": doc.get("date"), "device": doc.get("device"),
                            "refused": len(refused), "stopped": bool(doc.get("stopped"))})
    return stamp(fig, settings_label(doc), provenance or live_label(doc))


def _add_bound(fig: go.Figure, cells: list[dict], col: int) -> None:
    """The bandwidth bound of each measured cell: weights + the batch's KV a step at the copy rate."""
    fig.add_trace(go.Scatter(
        x=[r["batch"] for r in cells], y=[r["bound"]["tokens_per_s"] for r in cells], name="bandwidth bound",
        legendgroup="bound", showlegend=col == 1, mode="lines", line=dict(color=BOUND_COLOR, dash="dash", width=1.5),
        customdata=[[r["bound"]["copy_TBps"], r["bound"]["mean_context"]] for r in cells],
        hovertemplate="bandwidth bound, batch %{x}: %{y:,.0f} tokens/s (weights and the batch's KV a step at "
                      "%{customdata[0]:.2f} TB/s copy, mean context %{customdata[1]:,.0f})<extra></extra>"),
        row=1, col=col)
