"""What each layer's draft attention saw in one iteration.

An iteration's `selection` holds, per layer (or per layer and KV head), the prefix positions below
`base` that its drafts attended; every position from `base` on (written since the last verification)
is always attended. `selection_matrix` turns that into a rows x positions array:
    0 = not attended, 1 = selected, 2 = recent (>= base, always attended).
The heatmaps are an overview of the whole context binned to at most `max_cols` columns (value: share
of the bin's positions attended) and a window at full resolution; hovering shows token text.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ._common import context_ids, esc, message_figure, token_text, visible

NOT_ATTENDED, SELECTED, RECENT = 0, 1, 2


def selection_matrix(iteration, num_layers: int, num_kv_heads: int = 1,
                     length: int | None = None) -> tuple[np.ndarray, list[str]]:
    """(matrix [rows, length] int8, row labels). Rows are layers, or (layer, KV head) pairs for
    kv-head granularity. `length` defaults to the iteration's verified length (`position`)."""
    sel = iteration.selection
    if sel is None:
        raise ValueError(f"iteration {iteration.index} has no selection")
    length = iteration.position if length is None else length
    heads = sel.granularity == "kv-head"
    rows = [(layer, h) for layer in range(num_layers) for h in (range(num_kv_heads) if heads else [None])]
    mat = np.zeros((len(rows), length), dtype=np.int8)
    mat[:, min(sel.base, length):] = RECENT
    labels = []
    for r, (layer, h) in enumerate(rows):
        pos = sel.positions(layer, h)
        pos = pos[(pos < min(sel.base, length))]
        mat[r, pos] = SELECTED
        labels.append(f"L{layer}" if h is None else f"L{layer}·h{h}")
    return mat, labels


def _request_and_iteration(trace, request_index: int, iteration_index: int):
    if not trace.requests:
        return None, None
    req = trace.requests[min(max(request_index, 0), len(trace.requests) - 1)]
    if not req.iterations:
        return req, None
    return req, req.iterations[min(max(iteration_index, 0), len(req.iterations) - 1)]


def _bin_texts(ids: list[int], token_texts, edges: np.ndarray) -> list[str]:
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        snippet = "".join(token_text(token_texts, t) for t in ids[a:min(b, a + 12)])
        more = "…" if b - a > 12 else ""
        out.append(f"{a}–{b - 1}: {visible(snippet)}{more}" if b - a > 1 else f"{a}: {visible(snippet)}")
    return out


def selection_heatmaps(trace, request_index: int = 0, iteration_index: int = -1, max_cols: int = 512,
                       window_start: int | None = None, window: int = 128) -> tuple[go.Figure, go.Figure]:
    """(overview, zoom) heatmaps of what each layer selected in one iteration. `iteration_index` -1 is
    the last iteration. The zoom window defaults to the last `window` positions."""
    req, it = _request_and_iteration(trace, request_index, iteration_index if iteration_index >= 0 else 10**9)
    if it is None or it.selection is None:
        why = ("No trace loaded yet: generate, compare or upload a trace." if req is None else
               "No iterations recorded." if it is None else
               f"Iteration {it.index} drafted nothing, so no KV selection: vanilla decoding, or the first "
               "iteration (it selects for the next one from its own verification).")
        return message_figure(why, "KV selection (overview)"), message_figure(why, "KV selection (zoom)")
    m = trace.model
    mat, labels = selection_matrix(it, m.num_layers, m.num_kv_heads)
    length = mat.shape[1]
    ids = context_ids(req)
    tt = trace.token_texts
    sel = it.selection
    title = (f"KV selection, iteration {it.index + 1} ({trace.config.method}): {sel.budget} of {sel.base} prefix "
             f"entries kept per {'layer' if sel.granularity == 'layer' else 'KV head'}, positions ≥ {sel.base} always attended")

    # Overview: bins of equal width over the whole context.
    ncols = max(1, min(max_cols, length))
    edges = np.unique(np.linspace(0, length, ncols + 1).round().astype(int))
    attended = (mat > 0).astype(np.float32)
    sums = np.add.reduceat(attended, edges[:-1], axis=1)
    share = sums / np.diff(edges)[None, :]
    centers = (edges[:-1] + edges[1:] - 1) / 2
    bin_text = _bin_texts(ids, tt, edges)
    overview = go.Figure(go.Heatmap(
        z=share.round(4).tolist(), x=centers.tolist(), y=labels, zmin=0, zmax=1,
        colorscale=[[0, "#f1f3f5"], [1, "#1c7ed6"]],
        customdata=[bin_text] * len(labels),
        hovertemplate="%{y} · positions %{customdata}<br>attended share %{z:.2f}<extra></extra>",
        colorbar=dict(title="attended"), name="overview"))
    overview.add_vline(x=sel.base - 0.5, line=dict(color="#e8590c", dash="dash"),
                       annotation_text="recent →", annotation_position="top")
    overview.update_layout(title=title, height=max(360, 11 * len(labels) + 160),
                           xaxis_title=f"context position (binned to {len(edges) - 1} columns)",
                           yaxis=dict(autorange="reversed"), margin=dict(l=60, r=20, t=60, b=50),
                           meta={"iteration": it.index, "request": req.request_id, "length": length})

    # Zoom: full resolution over [start, start + window).
    # A start left over from a longer run is pulled back so the window stays full (never one column).
    start = max(0, length - window) if window_start is None else min(max(0, window_start), max(0, length - window))
    stop = min(length, start + window)
    xs = np.arange(start, stop)
    texts = [visible(token_text(tt, ids[p])) if p < len(ids) else "" for p in xs]
    zoom = go.Figure(go.Heatmap(
        z=mat[:, start:stop].tolist(), x=xs.tolist(), y=labels, zmin=0, zmax=2, xgap=1,
        colorscale=[[0, "#f1f3f5"], [0.33, "#f1f3f5"], [0.34, "#1c7ed6"], [0.66, "#1c7ed6"],
                    [0.67, "#fd7e14"], [1, "#fd7e14"]],
        customdata=[texts] * len(labels),
        hovertemplate="%{y} · position %{x}: %{customdata}<br>%{z} (0 no · 1 selected · 2 recent)<extra></extra>",
        colorbar=dict(title="", tickvals=[0, 1, 2], ticktext=["not attended", "selected", "recent"]),
        name="zoom"))
    zoom.update_layout(title=f"KV selection zoom, iteration {it.index + 1}: positions {start}–{stop - 1} at full resolution",
                       height=max(360, 11 * len(labels) + 160), xaxis_title="context position",
                       yaxis=dict(autorange="reversed"), margin=dict(l=60, r=20, t=50, b=50),
                       meta={"iteration": it.index, "start": int(start), "stop": int(stop)})
    return overview, zoom


def prompt_selection_html(trace, request_index: int = 0, iteration_index: int = -1) -> str:
    """The context text, each token shaded by how many layers selected it in one iteration (for
    kv-head granularity: layers weighted by the share of their KV heads)."""
    req, it = _request_and_iteration(trace, request_index, iteration_index if iteration_index >= 0 else 10**9)
    if it is None or it.selection is None:
        return "<div class='vs-prompt-sel'><em>No selection in this iteration.</em></div>"
    m = trace.model
    mat, _ = selection_matrix(it, m.num_layers, m.num_kv_heads)
    per_row = (mat == SELECTED).astype(np.float32)
    if it.selection.granularity == "kv-head":
        per_row = per_row.reshape(m.num_layers, m.num_kv_heads, -1).mean(axis=1)
    counts = per_row.sum(axis=0)
    ids = context_ids(req)
    n_prompt = len(req.prompt_token_ids)
    spans = []
    for p in range(mat.shape[1]):
        text = esc(token_text(trace.token_texts, ids[p])) if p < len(ids) else ""
        if p >= it.selection.base:
            spans.append(f'<span class="vs-ps" data-pos="{p}" data-recent="1" title="position {p}: recent, '
                         f'always attended" style="background:#ffe8cc">{text}</span>')
            continue
        c = float(counts[p])
        alpha = c / m.num_layers
        style = f"background:rgba(28,126,214,{alpha:.3f});" + ("color:white;" if alpha > 0.6 else "")
        style += "" if p < n_prompt else "font-style:italic;"
        spans.append(f'<span class="vs-ps" data-pos="{p}" data-layers="{c:g}" '
                     f'title="position {p}: selected by {c:g} of {m.num_layers} layers" style="{style}">{text}</span>')
    return ("<div class='vs-prompt-sel' style='font-family:ui-monospace,monospace;white-space:pre-wrap;"
            f"line-height:1.8'>{''.join(spans)}</div><div style='font-size:12px;color:#868e96'>Shade: layers "
            "that selected the token (darker = more); italic: generated text; orange: recent entries.</div>")


def recall_figure(trace, request_index: int = 0, iteration_index: int = -1) -> go.Figure:
    """Attention recall per layer (share of the full attention mass the selected set covers)."""
    req, it = _request_and_iteration(trace, request_index, iteration_index if iteration_index >= 0 else 10**9)
    if it is None or not it.recall:
        return message_figure("No attention recall in this iteration: it is recorded only when the run asks "
                              "for it (‘record recall’), and only for iterations that drafted.", "Recall per layer")
    recall = list(it.recall)
    mean = sum(recall) / len(recall)
    fig = go.Figure(go.Bar(x=list(range(len(recall))), y=recall, name="recall", marker_color="#1c7ed6",
                           hovertemplate="layer %{x}: recall %{y:.3f}<extra></extra>"))
    fig.add_hline(y=mean, line=dict(color="#e8590c", dash="dash"), annotation_text=f"mean {mean:.3f}")
    fig.update_layout(title=f"Attention recall per layer, iteration {it.index + 1}", xaxis_title="layer",
                      yaxis=dict(title="recall", range=[0, 1.02]), height=300,
                      margin=dict(l=60, r=20, t=50, b=50))
    return fig

