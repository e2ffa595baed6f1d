"""Logit-collection overhead of the verification kernel: Collect-2-Query vs all rows, against the number
of query rows (the paper's Figure 6), from `bench/results/kernels-<date>-<device>.json`.

Those files are written on the GPU by `python -m vegas_core.bench kernels`: records with at least
`kernel`, `batch`, `context`, `q_rows`, `heads`, `kv_heads`, `head_dim`, `collect`, `us`. The file is
either a list of records or an object holding them under `records` (or `results`), optionally with
`date` and `device`; otherwise both are read from the file name. Overhead of a collect mode at a shape
and row count = us(collect) / us(no collection) - 1.
"""
from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

import plotly.graph_objects as go

from ._common import message_figure, natural_key, read_result_files
from .provenance import file_provenance, stamp

_NAME = re.compile(r"kernels-(\d{4}-?\d{2}-?\d{2}[^-]*)-(.+)\.json$")
NO_RESULTS = ("No kernel benchmark results yet. On a GPU machine run `python -m vegas_core.bench kernels`; it "
              "writes bench/results/kernels-<date>-<device>.json, which this view reads.")


@dataclass
class KernelResults:
    path: str
    date: str
    device: str
    records: list[dict] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"measured {self.date} on {self.device} ({os.path.basename(self.path)})"

    @property
    def provenance(self) -> str:
        return file_provenance(f"bench/results/{os.path.basename(self.path)}", self.date, self.device)


def collect_mode(value) -> str:
    """Normalise a record's `collect` field to 'none', 'c2q', 'all' or 'c2q-main' (Collect-2-Query
    stored from the main tile: a variant the kernel benchmark times, not the engine's C2Q)."""
    v = str(value).lower() if value is not None else "none"
    if v in ("", "none", "false", "0", "no"):
        return "none"
    if "all" in v:
        return "all"
    if "main" in v:
        return "c2q-main"
    if "2" in v or "first" in v or "two" in v or "c2q" in v:
        return "c2q"
    return v


def load_kernel_results(results_dir: str | os.PathLike = "bench/results") -> list[KernelResults]:
    """Every readable kernels-*.json, newest first (by date in the file, else name). Unreadable files are
    skipped: the view then says there are no results rather than failing."""
    out = []
    for path, data in read_result_files(results_dir, "kernels-*.json", 50 * 1024 * 1024):
        m = _NAME.search(path.name)
        date, device = (m.group(1), m.group(2)) if m else ("unknown date", "unknown device")
        records = data
        if isinstance(data, dict):
            date = str(data.get("date", date))
            device = str(data.get("device", device))
            records = data.get("records", data.get("results", []))
        if not isinstance(records, list):
            continue
        records = [r for r in records if isinstance(r, dict) and "us" in r and "q_rows" in r]
        if records:
            out.append(KernelResults(str(path), date, device, records))
    return sorted(out, key=lambda r: (r.date, natural_key(r.path)), reverse=True)


def pick_kernel_results(results: list[KernelResults], min_rows: int = 3) -> KernelResults | None:
    """The newest file that draws the curve: Collect-2-Query's overhead at `min_rows` or more row
    counts. Probe scripts write kernels-*.json too, timing one or two row counts of a variant;
    without a file that draws the curve, the newest."""
    for r in results:
        if len(overhead_series(r)[1]["c2q"]) >= min_rows:
            return r
    return results[0] if results else None


def _shape_key(r: dict) -> tuple:
    return tuple(r.get(k) for k in ("batch", "context", "heads", "kv_heads", "head_dim"))


def overhead_series(results: KernelResults, kernel: str = "verify_attention",
                    shape: tuple | None = None) -> tuple[tuple | None, dict[str, list[tuple[int, float]]]]:
    """(shape, {'c2q': [(rows, overhead %)], 'all': [...]}) for one shape (default: the one with the most
    row counts, preferring the largest batch x context)."""
    # Tuning trials time other tile configurations at one shape: not part of the curve.
    recs = [r for r in results.records if str(r.get("kernel", kernel)) == kernel
            and r.get("sweep") not in ("tune", "collect_tune")]
    by_shape: dict[tuple, dict[tuple[int, str], float]] = defaultdict(dict)
    for r in recs:
        try:
            by_shape[_shape_key(r)][(int(r["q_rows"]), collect_mode(r.get("collect")))] = float(r["us"])
        except (TypeError, ValueError):
            continue
    if not by_shape:
        return None, {}
    if shape is None or shape not in by_shape:
        def score(k):
            rows = {q for q, c in by_shape[k] if c != "none"}
            return (len(rows), (k[0] or 0) * (k[1] or 0))
        shape = max(by_shape, key=score)
    times = by_shape[shape]
    series: dict[str, list[tuple[int, float]]] = {"c2q": [], "all": []}
    for (rows, mode), us in sorted(times.items()):
        base = times.get((rows, "none"))
        if mode in series and base:
            series[mode].append((rows, 100.0 * (us / base - 1.0)))
    return shape, series


def overhead_figure(results: KernelResults | None, kernel: str = "verify_attention",
                    shape: tuple | None = None) -> go.Figure:
    if results is None:
        return message_figure(NO_RESULTS, "Logit-collection overhead", height=300)
    shape, series = overhead_series(results, kernel, shape)
    if not any(series.values()):
        return message_figure(f"{os.path.basename(results.path)} has no {kernel} records with and without "
                              "collection at the same shape.", "Logit-collection overhead", height=300)
    names = {"c2q": "Collect-2-Query (first + last row)", "all": "all rows"}
    colors = {"c2q": "#2f9e44", "all": "#e8590c"}
    fig = go.Figure()
    for mode, pts in series.items():
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                     name=names[mode], line=dict(color=colors[mode]),
                                     hovertemplate=f"{names[mode]}<br>%{{x}} rows: %{{y:.1f}} %<extra></extra>"))
    b, ctx, h, kvh, hd = shape
    fig.update_layout(
        title=f"{kernel} logit-collection overhead", xaxis=dict(title="query rows per request", dtick=2),
        yaxis_title="overhead vs no collection (%)", height=400,
        meta={"date": results.date, "device": results.device})
    return stamp(fig, f"batch {b}, context {ctx}, {h}/{kvh} heads, head dim {hd}", results.provenance)
