import base64

import numpy as np
import pytest

from vegas_core.errors import TraceError
from vegas_core.trace import decode_positions, encode_positions
from vegas_core.trace.positions import looks_like_positions


@pytest.mark.parametrize("seed,n,high", [(0, 1, 10), (1, 50, 100), (2, 573, 8192), (3, 2000, 1_000_001)])
def test_random_sets_round_trip(seed, n, high):
    x = np.random.default_rng(seed).choice(high, size=n, replace=False)
    out = decode_positions(encode_positions(x))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.sort(x))


def test_empty_round_trips_as_empty_string():
    assert encode_positions([]) == ""
    assert encode_positions(np.zeros(0, dtype=np.int32)) == ""
    out = decode_positions("")
    assert out.dtype == np.int64 and out.size == 0


def test_large_values_and_varint_boundaries():
    x = [0, 127, 128, 16383, 16384, 999_999, 1_000_000, 2**31, 2**62, 2**63 - 1]
    np.testing.assert_array_equal(decode_positions(encode_positions(np.array(x, dtype=np.int64))), x)


def test_unsorted_duplicates_and_lists_are_stored_as_a_set():
    assert encode_positions([5, 1, 5, 3]) == encode_positions(np.array([1, 3, 5], dtype=np.uint16))
    np.testing.assert_array_equal(decode_positions(encode_positions([5, 1, 5, 3])), [1, 3, 5])


def test_encoding_is_compact_base64():
    s = encode_positions(np.arange(0, 8192, 14))      # gaps of 14: one byte each
    assert looks_like_positions(s)
    assert len(base64.b64decode(s)) == len(np.arange(0, 8192, 14))


@pytest.mark.parametrize("bad", [[-1, 2], [0.5, 1.0]])
def test_encode_rejects_negative_or_fractional(bad):
    with pytest.raises(ValueError):
        encode_positions(np.array(bad))


@pytest.mark.parametrize("text,message", [
    ("!!!!", "not valid base64"),
    ("AAE", "not valid base64"),                                       # bad padding
    (base64.b64encode(b"\x05\x80").decode(), "truncated varint"),
    (base64.b64encode(b"\x05\x00").decode(), "not strictly increasing"),
    (base64.b64encode(b"\xff" * 9 + b"\x01").decode(), "longer than 9 bytes"),
    (base64.b64encode(b"\xff" * 8 + b"\x7f" + b"\xff" * 8 + b"\x7f").decode(), "int64"),
])
def test_decode_rejects_malformed_text(text, message):
    with pytest.raises(TraceError, match=message):
        decode_positions(text)


def test_many_sets_at_once_encode_as_each_alone():
    """`encode_position_sets` (a selection's every layer and head in one call) gives each set's own
    encoding: sorted and unsorted sets, repeats, empty ones, mixed dtypes and varint widths."""
    from vegas_core.trace.positions import encode_position_rows, encode_position_sets
    rng = np.random.default_rng(7)
    sets = [np.sort(rng.choice(8192, 573, replace=False)), np.zeros(0, dtype=np.int32),
            np.array([9, 3, 3, 0], dtype=np.int32), np.arange(0, 40, 3, dtype=np.uint16),
            np.array([2**40, 5, 2**62]), [1], np.sort(rng.choice(300, 16, replace=False)).astype(np.int32)]
    texts = encode_position_sets(sets)
    assert texts == [encode_position_sets([s])[0] for s in sets]
    for s, t in zip(sets, texts):
        np.testing.assert_array_equal(decode_positions(t), np.unique(np.asarray(s, dtype=np.int64)))
    assert encode_position_sets([]) == [] and encode_position_sets([[], []]) == ["", ""]
    with pytest.raises(ValueError):
        encode_position_sets([[1, 2], [-3]])
    # Blocks of rows (a selection's [layers x heads, k] sets, one block per request).
    blocks = [rng.integers(0, 5000, (6, 40)), np.zeros((3, 0), dtype=np.int32),
              np.sort(rng.choice(9000, (4, 573))).astype(np.int32)]
    assert encode_position_rows(blocks) == encode_position_sets([row for b in blocks for row in b])
