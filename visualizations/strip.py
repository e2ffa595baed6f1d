"""A compact per-layer strip of one KV selection: one row per layer, the prefix [0, base) binned into
columns, a cell as dark as the share of its positions the layer kept (for kv-head granularity, averaged
over the layer's KV heads). Small enough to sit inside a step-through card."""
from __future__ import annotations

import numpy as np

from ._common import esc

ROW_PX = 4
MAX_COLS = 96


def _kept_share(selection, layer: int, num_kv_heads: int, edges: np.ndarray) -> tuple[np.ndarray, int]:
    """(share of each bin kept, positions kept) for one layer."""
    heads = range(num_kv_heads) if selection.granularity == "kv-head" else [None]
    share = np.zeros(len(edges) - 1)
    kept = 0
    for h in heads:
        pos = selection.positions(layer, h)
        pos = pos[pos < selection.base]
        kept = max(kept, len(pos))
        counts = np.histogram(pos, bins=edges)[0]
        share += counts / np.diff(edges)
    return share / len(heads), kept


def selection_strip_html(selection, num_layers: int, num_kv_heads: int = 1, caption: str = "") -> str:
    """The strip as inline SVG (no JavaScript), with a row per layer carrying `data-layer` / `data-kept`."""
    base = selection.base
    if base <= 0:
        return "<div class='vs-strip' data-layers='0'><em>empty prefix: nothing to select from</em></div>"
    ncols = min(MAX_COLS, base)
    edges = np.unique(np.linspace(0, base, ncols + 1).round().astype(int))
    ncols = len(edges) - 1
    rows = []
    for layer in range(num_layers):
        share, kept = _kept_share(selection, layer, num_kv_heads, edges)
        y = layer * ROW_PX
        cells = "".join(f'<rect x="{c}" y="{y}" width="1" height="{ROW_PX - 1}" fill="#1c7ed6" '
                        f'fill-opacity="{min(1.0, 0.25 + 0.75 * s):.2f}"/>'
                        for c, s in enumerate(share) if s > 0)
        rows.append(f'<g data-layer="{layer}" data-kept="{kept}"><title>layer {layer}: kept {kept} of '
                    f'{base}</title><rect x="0" y="{y}" width="{ncols}" height="{ROW_PX - 1}" fill="#f1f3f5"/>'
                    f'{cells}</g>')
    height = num_layers * ROW_PX
    svg = (f'<svg viewBox="0 0 {ncols} {height}" preserveAspectRatio="none" width="100%" height="{height}" '
           f'role="img" aria-label="selected positions per layer">{"".join(rows)}</svg>')
    axis = (f'<div style="display:flex;justify-content:space-between;font-size:11px;color:#868e96">'
            f'<span>position 0</span><span>{esc(caption)}</span><span>{base - 1}</span></div>')
    side = (f'<div style="display:flex;flex-direction:column;justify-content:space-between;font-size:11px;'
            f'color:#868e96;height:{height}px;margin-right:4px"><span>L0</span><span>L{num_layers - 1}</span></div>')
    return (f'<div class="vs-strip" data-layers="{num_layers}" data-base="{base}" '
            f'data-granularity="{selection.granularity}"><div style="display:flex">{side}'
            f'<div style="flex:1">{svg}</div></div>{axis}</div>')
