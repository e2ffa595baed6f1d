"""A trace is checked against the model it declares before anything is built from it: a small file
cannot declare a huge context, layer count, token id or integer."""
import json

import pytest

from vegas_core.errors import TraceError
from vegas_core.trace import load_trace_bytes


def _load(obj) -> str:
    with pytest.raises(TraceError) as e:
        load_trace_bytes(json.dumps(obj).encode())
    return str(e.value)


@pytest.fixture
def obj(trace):
    return json.loads(trace.model_dump_json())


def test_the_fixture_loads(obj):
    assert load_trace_bytes(json.dumps(obj).encode()).num_iterations == 6


def test_a_position_past_the_request_is_refused(obj):
    obj["requests"][1]["iterations"][0]["position"] = 10**7
    assert "less than or equal to 131072" in _load(obj)
    obj["requests"][1]["iterations"][0]["position"] = 5000
    assert "at position 5000, past the request's 10 tokens" in _load(obj)


def test_a_layer_count_far_past_any_model_is_refused(obj):
    obj["model"]["num_layers"] = 200000
    assert "model.num_layers: Input should be less than or equal to 256" in _load(obj)


def test_a_selection_too_large_to_draw_is_refused(obj):
    req = obj["requests"][0]
    req["prompt_token_ids"] = [1] * 130000
    req["iterations"][2]["position"] = 130000
    obj["model"].update(num_layers=200, num_heads=200, num_kv_heads=200)
    sel = req["iterations"][2]["selection"]
    sel["layers"] = [""] * 200
    for it in req["iterations"][:2]:
        it["selection"]["layers"] = [""] * 200
        it["recall"] = None
    req["iterations"][2]["recall"] = None
    obj["requests"][1]["iterations"][1]["selection"] = obj["requests"][1]["iterations"][2]["selection"] = None
    obj["requests"][1]["iterations"][2]["recall"] = None
    assert "26,000,000 cells, over the 16,777,216 limit" in _load(obj)


@pytest.mark.parametrize("where,value,message", [
    (("requests", 0, "prompt_token_ids", 0), 49152, "token id 49152, outside the model's vocabulary of 49152"),
    (("requests", 0, "iterations", 0, "drafts", 0, "token_id"), 10**12, "less than 4194304"),
    (("token_texts", "100"), "x" * 2000, "at most 1024 characters"),
    (("config", "seed"), 1 << 64, "less than 18446744073709551616"),
    (("config", "max_tokens"), 10**9, "less than or equal to 131072"),
    (("requests", 0, "iterations", 0, "step"), 1 << 64, "less than or equal to 9223372036854775807"),
])
def test_integers_and_strings_are_bounded(obj, where, value, message):
    target = obj
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    assert message in _load(obj)


def test_an_integer_past_pythons_digit_limit_is_a_trace_error(obj):
    text = json.dumps(obj).replace('"max_tokens": 11', '"max_tokens": ' + "9" * 5000)
    with pytest.raises(TraceError, match="trace is not valid JSON: Exceeds the limit"):
        load_trace_bytes(text.encode())
