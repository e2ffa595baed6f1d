"""Exports of a trace for other tools: Chrome / Perfetto timeline, flat per-iteration table, Parquet, CSV.

Timeline contract: one process ("vegas engine"), one thread per request (tid = request index + 1,
named by request_id), and per iteration three complete ("X") events in engine order — draft, verify,
select (Vegas selects from the verify pass, for the next draft phase) — laid end to end from the
iteration's `start_s`, with ts and dur in microseconds. All three are emitted even when zero long, so
every iteration has exactly one event per phase.

Table contract: one row per (request, iteration) with the columns of ITERATION_COLUMNS, scalars only
(None where an iteration has no selection or recall), so it goes to Parquet / CSV / a DataFrame as is.
"""
from __future__ import annotations

import csv
import json
import os

from .schema import Trace

PHASES = ("draft", "verify", "select")

# name -> Arrow type name; the order is the column order of every export.
ITERATION_COLUMNS: dict[str, str] = {
    "request_id": "string", "iteration": "int64", "step": "int64", "position": "int64",
    "num_drafts": "int64", "num_accepted": "int64", "num_emitted": "int64",
    "final_kind": "string", "final_token": "int64",
    "draft_ms": "float64", "select_ms": "float64", "verify_ms": "float64", "start_s": "float64",
    "granularity": "string", "selection_base": "int64", "budget": "int64", "mean_recall": "float64",
}


def to_chrome_trace(trace: Trace) -> dict:
    """Chrome trace-event JSON object (load in Perfetto or chrome://tracing)."""
    pid = 1
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"vegas engine ({trace.config.method})"}}]
    for r, req in enumerate(trace.requests):
        tid = r + 1
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": req.request_id}})
        for it in req.iterations:
            ts = it.start_s * 1e6
            args = {"request_id": req.request_id, "iteration": it.index, "step": it.step,
                    "position": it.position, "num_drafts": len(it.drafts),
                    "num_accepted": it.num_accepted, "final_kind": it.final_kind}
            for phase in PHASES:
                dur = getattr(it, f"{phase}_ms") * 1e3
                events.append({"name": phase, "cat": "iteration", "ph": "X", "pid": pid, "tid": tid,
                               "ts": ts, "dur": dur, "args": args})
                ts += dur
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"model": trace.model.name, "method": trace.config.method,
                          "schema_version": trace.schema_version, "created": trace.created}}


def write_chrome_trace(trace: Trace, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_chrome_trace(trace), f)


def iterations_table(trace: Trace) -> list[dict]:
    """Flat rows, one per iteration, keys in ITERATION_COLUMNS order."""
    rows = []
    for req in trace.requests:
        for it in req.iterations:
            sel = it.selection
            rows.append({
                "request_id": req.request_id, "iteration": it.index, "step": it.step,
                "position": it.position, "num_drafts": len(it.drafts),
                "num_accepted": it.num_accepted, "num_emitted": len(it.emitted),
                "final_kind": it.final_kind, "final_token": it.final_token,
                "draft_ms": it.draft_ms, "select_ms": it.select_ms, "verify_ms": it.verify_ms,
                "start_s": it.start_s,
                "granularity": sel.granularity if sel else None,
                "selection_base": sel.base if sel else None,
                "budget": sel.budget if sel else None,
                "mean_recall": sum(it.recall) / len(it.recall) if it.recall else None,
            })
    return rows


def write_parquet(trace: Trace, path: str | os.PathLike) -> None:
    """The iterations table as Parquet with a fixed schema (needs pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in ITERATION_COLUMNS.items()])
    pq.write_table(pa.Table.from_pylist(iterations_table(trace), schema=schema), path)


def write_csv(trace: Trace, path: str | os.PathLike) -> None:
    """The iterations table as CSV with a header row (None is written as an empty cell)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ITERATION_COLUMNS))
        writer.writeheader()
        writer.writerows(iterations_table(trace))
