import csv
import json

import pytest

from vegas_core.trace.export import (ITERATION_COLUMNS, PHASES, iterations_table, to_chrome_trace,
                                     write_chrome_trace, write_csv, write_parquet)


def test_chrome_trace_has_one_event_per_phase_per_iteration(trace, tmp_path):
    doc = to_chrome_trace(trace)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 3 * trace.num_iterations
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {1: "req-0", 2: "req-1"}
    for req_index, req in enumerate(trace.requests):
        for it in req.iterations:
            events = [e for e in spans if e["tid"] == req_index + 1 and e["args"]["iteration"] == it.index]
            assert [e["name"] for e in events] == list(PHASES)
            for e in events:
                assert e["dur"] == pytest.approx(getattr(it, f"{e['name']}_ms") * 1000)
                assert e["args"]["num_accepted"] == it.num_accepted
            assert events[0]["ts"] == pytest.approx(it.start_s * 1e6)
            for a, b in zip(events, events[1:]):                    # laid end to end
                assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    path = tmp_path / "chrome.json"
    write_chrome_trace(trace, path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))


def test_iterations_table_rows(trace):
    rows = iterations_table(trace)
    assert len(rows) == 6 and all(list(r) == list(ITERATION_COLUMNS) for r in rows)
    first, decode = rows[0], rows[3]
    assert (first["request_id"], first["iteration"], first["num_accepted"], first["num_emitted"]) == ("req-0", 0, 2, 3)
    assert (first["granularity"], first["selection_base"], first["budget"]) == ("layer", 11, 6)
    assert first["mean_recall"] == pytest.approx(sum(trace.requests[0].iterations[0].recall) / 30)
    assert decode["final_kind"] == "decode" and decode["budget"] is None and decode["mean_recall"] is None
    assert rows[4]["granularity"] == "kv-head"


def test_parquet_round_trips_to_the_same_rows(trace, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "iterations.parquet"
    write_parquet(trace, path)
    table = pq.read_table(path)
    assert table.column_names == list(ITERATION_COLUMNS)
    assert table.to_pylist() == iterations_table(trace)


def test_csv_has_header_and_rows(trace, tmp_path):
    path = tmp_path / "iterations.csv"
    write_csv(trace, path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and list(rows[0]) == list(ITERATION_COLUMNS)
    assert rows[3]["budget"] == "" and rows[0]["draft_ms"] == "4.0"
