"""End-to-end throughput of every method, side by side, from `bench/results/e2e-<date>-<device>.json`
(written by `python -m vegas_core.bench e2e`: records with at least `method`, `granularity`,
`sampling`, `tokens_per_s`, `speedup_vs_vanilla`, `mean_acceptance_length`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import plotly.graph_objects as go

from ._common import message_figure, natural_key, read_result_files
from .provenance import file_provenance, stamp

NO_RESULTS = ("No end-to-end results yet. Run `python -m vegas_core.bench e2e` (on a CPU it uses a small "
              "workload); it writes bench/results/e2e-<date>-<device>.json, which this view reads.")
SAMPLING_COLORS = {"greedy": "#1971c2", "model-card": "#f08c00"}


@dataclass
class E2EResults:
    path: str
    date: str
    device: str
    workload: str
    records: list[dict] = field(default_factory=list)
    choice: str | None = None      # why `pick_results` chose this file

    @property
    def label(self) -> str:
        return f"measured {self.date} on {self.device}, {self.workload} workload ({os.path.basename(self.path)})"

    @property
    def provenance(self) -> str:
        return file_provenance(f"bench/results/{os.path.basename(self.path)}", self.date, self.device)


def load_e2e_results(results_dir: str | os.PathLike = "bench/results") -> list[E2EResults]:
    """Every readable e2e-*.json with records, newest first. Unreadable files are skipped."""
    out = []
    for path, doc in read_result_files(results_dir, "e2e-*.json", 20 * 1024 * 1024):
        if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
            continue
        recs = [r for r in doc["records"] if isinstance(r, dict) and "method" in r and "tokens_per_s" in r]
        if recs:
            workload = doc.get("workload", {})
            name = workload.get("name") if isinstance(workload, dict) else None
            out.append(E2EResults(str(path), str(doc.get("date", "")), str(doc.get("device", "unknown device")),
                                  str(name or recs[0].get("workload", "?")), recs))
    return sorted(out, key=lambda r: (r.date, natural_key(r.path)), reverse=True)


# What `bench e2e` runs by default. A file without all of them is an A/B of a few methods under some
# variant flag (bench/results holds many), not the comparison the view is for.
FULL_COMPARISON = {"vanilla", "stream", "quest", "specextend", "vegas", "vegas-all"}


def workload_size(r: E2EResults) -> int:
    """Batch x context of the file's workload (its first record's): the headline is the largest."""
    rec = r.records[0]
    try:
        return int(rec.get("batch") or 0) * int(rec.get("context") or 0)
    except (TypeError, ValueError):
        return 0


def pick_results(results: list[E2EResults], device_type: str | None) -> E2EResults | None:
    """The headline comparison for the running engine's kind of device ('cpu' or 'cuda'; any kind
    without one): among the full comparisons (`FULL_COMPARISON`) of that kind, the newest of the
    largest workload (batch x context), so a later small run (a trace-cost check) does not replace
    it; without a full comparison, the newest file (an A/B of a few methods). `choice` says which."""
    same = [r for r in results if device_type and r.device.startswith(device_type)] or results
    if not same:
        return None
    full = [r for r in same if FULL_COMPARISON <= {rec.get("method") for rec in r.records}]
    if not full:
        return replace(same[0], choice="the newest file (no full comparison of every method)")
    largest = max(workload_size(r) for r in full)
    pick = next(r for r in full if workload_size(r) == largest)     # `results` is newest first
    b = pick.records[0]
    return replace(pick, choice=f"the largest full comparison (batch {b.get('batch')} × {b.get('context')} "
                                f"tokens), newest of {sum(workload_size(r) == largest for r in full)} such")


def method_label(r: dict) -> str:
    gran = r.get("granularity")
    return r["method"] if r["method"] == "vanilla" or gran in (None, "layer") else f"{r['method']} ({gran})"


def throughput_figure(results: E2EResults | None) -> go.Figure:
    if results is None:
        return message_figure(NO_RESULTS, "End-to-end throughput", height=300)
    fig = go.Figure()
    for sampling in dict.fromkeys(r.get("sampling", "greedy") for r in results.records):
        recs = [r for r in results.records if r.get("sampling", "greedy") == sampling]
        speed = [r.get("speedup_vs_vanilla") for r in recs]
        fig.add_trace(go.Bar(
            x=[method_label(r) for r in recs], y=[r["tokens_per_s"] for r in recs], name=sampling,
            marker_color=SAMPLING_COLORS.get(sampling), text=[f"{s:.2f}×" if s else "" for s in speed],
            textposition="outside", cliponaxis=False,
            customdata=[[r.get("mean_acceptance_length") or 1.0, r.get("gamma") or 0, r.get("sparsity") or 0]
                        for r in recs],
            hovertemplate="%{x}: %{y:.1f} tokens/s (%{text} vanilla)<br>mean acceptance length "
                          "%{customdata[0]:.2f}, gamma %{customdata[1]}, sparsity %{customdata[2]}<extra></extra>"))
    b = results.records[0]
    top = max((r["tokens_per_s"] or 0) for r in results.records)
    fig.update_yaxes(range=[0, 1.12 * top])                 # room for the "× vanilla" labels above the bars
    fig.update_layout(barmode="group", yaxis_title="decode tokens/s", height=420,
                      title="End-to-end throughput per method (bar labels: × vanilla)",
                      meta={"date": results.date, "device": results.device})
    settings = f"batch {b.get('batch')}, up to {b.get('context')} tokens, {results.workload} workload"
    if results.choice:
        settings += f" — {results.choice}"
    return stamp(fig, settings, results.provenance)
