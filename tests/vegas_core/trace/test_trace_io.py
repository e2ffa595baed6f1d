import json

import pytest

from vegas_core.errors import TraceError
from vegas_core.trace import TRACE_SCHEMA_VERSION, load_trace, load_trace_bytes, save_trace


def _dumps(obj) -> bytes:
    return json.dumps(obj).encode()


def test_save_then_load_gives_an_equal_trace(trace, tmp_path):
    path = tmp_path / "run.json"
    save_trace(trace, path)
    loaded = load_trace(path)
    assert loaded == trace
    assert loaded.requests[1].iterations[1].selection.positions(29, 2).tolist() == \
        trace.requests[1].iterations[1].selection.positions(29, 2).tolist()
    assert loaded.token_texts[900] == "<0x0A>"
    assert load_trace_bytes(path.read_bytes()) == trace
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]              # no temp file left


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(TraceError, match="not a file"):
        load_trace(tmp_path)


def test_too_large_is_refused_before_reading(trace, tmp_path):
    path = tmp_path / "run.json"
    save_trace(trace, path)
    size = path.stat().st_size
    with pytest.raises(TraceError, match=f"trace is {size:,} bytes, over the 100-byte limit"):
        load_trace(path, max_bytes=100)
    with pytest.raises(TraceError, match="over the 10-byte limit"):
        load_trace_bytes(b"{" + b" " * 20 + b"}", max_bytes=10)


@pytest.mark.parametrize("data,message", [
    (b"this is not json", "not valid JSON: Expecting value at line 1 column 1"),
    (b'{"schema_version": 1,', "not valid JSON"),
    (b'{"a": "never closed', "not valid JSON: a string is never closed"),
    (b'\xff\xfe{}', "not UTF-8"),
])
def test_not_json(data, message):
    with pytest.raises(TraceError, match=message):
        load_trace_bytes(data)


def test_deep_nesting_is_refused_without_recursion(tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(TraceError, match="deeper than the 64-level limit"):
        load_trace(path)
    with pytest.raises(TraceError, match="deeper than the 3-level limit"):
        load_trace_bytes(b'{"a": [[[1]]]}', max_depth=3)
    with pytest.raises(TraceError, match="deeper"):
        load_trace_bytes(b"{" * 70)                                    # unbalanced is still too deep


def test_brackets_inside_strings_do_not_count(trace_dict):
    trace_dict["requests"][0]["output_text"] = '[[[[{{{{ "quoted \\" [[[[' * 40
    trace_dict["requests"][0]["prompt_text"] = "ends in a backslash \\"
    loaded = load_trace_bytes(_dumps(trace_dict), max_depth=10)
    assert loaded.requests[0].output_text.startswith("[[[[{{{{")


def test_nan_is_refused_with_its_location(trace_dict):
    trace_dict["requests"][1]["iterations"][2]["drafts"][0]["draft_prob"] = float("nan")
    data = _dumps(trace_dict)                                        # json.dumps writes NaN
    assert b"NaN" in data
    with pytest.raises(TraceError, match=r"NaN at requests\.1\.iterations\.2\.drafts\.0\.draft_prob; "
                                         r"numbers in a trace must be finite"):
        load_trace_bytes(data)
    with pytest.raises(TraceError, match="-Infinity at verify_ms"):
        load_trace_bytes(b'{"verify_ms": -Infinity}')


@pytest.mark.parametrize("version,found", [(2, "2"), ("1", "'1'"), (True, "True"), (None, "None")])
def test_other_schema_version(trace_dict, version, found):
    trace_dict["schema_version"] = version
    with pytest.raises(TraceError, match=f"schema_version is {found}; this build reads version {TRACE_SCHEMA_VERSION}"):
        load_trace_bytes(_dumps(trace_dict))


def test_missing_version_and_non_object():
    with pytest.raises(TraceError, match="schema_version is None"):
        load_trace_bytes(b'{"requests": []}')
    with pytest.raises(TraceError, match="must be a JSON object at the top level, found list"):
        load_trace_bytes(b"[1, 2]")


def test_schema_mismatch_lists_locations(trace_dict):
    del trace_dict["model"]["num_layers"]
    del trace_dict["requests"][0]["iterations"][1]["final_token"]
    trace_dict["requests"][1]["finish_reason"] = "bored"
    with pytest.raises(TraceError) as info:
        load_trace_bytes(_dumps(trace_dict))
    msg = str(info.value)
    assert msg.startswith("trace does not match schema version 1 (3 errors): ")
    assert "model.num_layers: Field required" in msg
    assert "requests.0.iterations.1.final_token: Field required" in msg
    assert "requests.1.finish_reason: Input should be 'stop', 'length', 'abort' or 'error'" in msg


def test_inconsistent_iteration_is_refused(trace_dict):
    trace_dict["requests"][0]["iterations"][1]["emitted"] = [104, 105, 106, 108]
    with pytest.raises(TraceError, match=r"requests\.0\.iterations\.1: Value error, emitted \[104, 105, 106, 108\] "
                                         r"is not a non-empty prefix of accepted drafts \+ final token \[104, 105, 106, 107, 108\]"):
        load_trace_bytes(_dumps(trace_dict))


def test_many_errors_are_summarised(trace_dict):
    for r in trace_dict["requests"]:
        for it in r["iterations"]:
            it["step"] = -1
    with pytest.raises(TraceError, match=r"\(6 errors\).*; and 3 more$"):
        load_trace_bytes(_dumps(trace_dict))


def _reference_depth(data: bytes) -> tuple[int, bool]:
    """Byte-by-byte scan: (max depth outside strings, ends inside a string)."""
    depth = best = 0
    in_string = escaped = False
    for ch in data:
        if escaped:
            escaped = False
            if in_string or ch in b'"\\':
                continue
        elif ch == ord("\\"):
            escaped = True
            continue
        if ch == ord('"'):
            in_string = not in_string
        elif not in_string and ch in b"[{":
            depth += 1
            best = max(best, depth)
        elif not in_string and ch in b"]}":
            depth -= 1
    return best, in_string


@pytest.mark.parametrize("chunk", [1, 3, 1 << 22])
def test_depth_scan_matches_a_byte_by_byte_scan_across_chunk_ends(monkeypatch, chunk):
    import random

    from vegas_core.trace import io
    monkeypatch.setattr(io, "_SCAN_CHUNK", chunk)
    rng = random.Random(chunk)
    for _ in range(300):
        data = bytes(rng.choice(b'[]{}"\\\\a') for _ in range(rng.randint(0, 24)))
        best, unclosed = _reference_depth(data)
        if unclosed:
            with pytest.raises(TraceError, match="never closed"):
                io._check_depth(data, best)
            continue
        io._check_depth(data, best)
        if best:
            with pytest.raises(TraceError, match="deeper"):
                io._check_depth(data, best - 1)
