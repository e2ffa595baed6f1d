"""Compact text encoding of a set of KV-cache positions, for the attended sets stored in traces.

Format (version 1 of the trace schema): the positions are sorted and de-duplicated; the first one is
stored as itself and every later one as its gap to the previous one (always >= 1); each of these
unsigned integers is written as an LEB128 varint (7 bits per byte, least significant group first,
high bit set on every byte but the last); the bytes are base64-encoded with the standard alphabet
and padding. The empty set encodes as "". A 7%-of-8K set (~570 positions) typically takes 1-2 bytes
per position, so about 1 KB of text.

`decode_positions(encode_positions(x))` equals `np.unique(x)` exactly, as int64. Decoding rejects
anything that is not such a string with a `TraceError` (bad base64, a truncated varint, a zero gap, a
value past int64) so a malformed trace fails with one message instead of odd positions.
"""
from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import TraceError

_INT64_MAX = np.uint64(np.iinfo(np.int64).max)
_MAX_VARINT_BYTES = 9          # 9 * 7 = 63 bits: every gap of a valid int64 set fits
_BASE64_RE = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def looks_like_positions(text: str) -> bool:
    """Cheap syntactic check (base64 alphabet and padding) used by schema validation; the full check
    happens in `decode_positions`."""
    return _BASE64_RE.fullmatch(text) is not None


def encode_positions(positions: np.ndarray | Iterable[int]) -> str:
    """Encode a set of non-negative integer positions (any order, duplicates allowed) as text."""
    return encode_position_sets([positions])[0]


def encode_position_sets(sets: Sequence[np.ndarray | Iterable[int]]) -> list[str]:
    """`encode_positions` of every set."""
    return encode_position_rows([_as_int64(s).reshape(1, -1) for s in sets])


def encode_position_rows(blocks: Sequence[np.ndarray]) -> list[str]:
    """`encode_positions` of every row of every 2-D block ([sets, k], in order), in one pass of
    array operations over all of them: a trace records every layer (and KV head) of a batch's
    selections each iteration, which one call per set would spend milliseconds of host time on."""
    blocks = [_as_int64(b) for b in blocks]
    lengths = np.concatenate([np.full(b.shape[0], b.shape[1] if b.ndim == 2 else 0, dtype=np.int64)
                              for b in blocks]) if blocks else np.zeros(0, dtype=np.int64)
    out = [""] * len(lengths)
    if not lengths.any():
        return out
    flat = np.concatenate([b.reshape(-1) for b in blocks])
    if int(flat.min()) < 0:
        raise ValueError(f"positions must be non-negative, got {int(flat.min())}")
    keep = np.flatnonzero(lengths)
    lengths = lengths[keep]
    starts = np.cumsum(lengths) - lengths
    inner = np.ones(flat.size, dtype=bool)
    inner[starts] = False

    def gaps_of(values):
        g = np.diff(values, prepend=0)
        g[starts] = values[starts]
        return g
    gaps = gaps_of(flat)
    if not bool((gaps[inner] > 0).all()):
        # Unsorted (a top-k's sets are): every row sorted in one call per block, which costs a few
        # percent of the per-row np.unique below that a batch's thousands of sets would need.
        flat = np.concatenate([np.sort(b, axis=-1).reshape(-1) for b in blocks])
        gaps = gaps_of(flat)
    if not bool((gaps[inner] > 0).all()):      # repeated values: store each as a set
        sets = [np.unique(flat[a:a + n]) for a, n in zip(starts.tolist(), lengths.tolist())]
        flat = np.concatenate(sets)
        lengths = np.fromiter((x.size for x in sets), dtype=np.int64, count=len(sets))
        starts = np.cumsum(lengths) - lengths
        gaps = np.diff(flat, prepend=0)
        gaps[starts] = flat[starts]
    gaps = gaps.astype(np.uint64)
    # Bytes per value: ceil(bit_length / 7), at least 1.
    nbytes = np.ones(gaps.shape, dtype=np.int64)
    top = int(gaps.max())
    for k in range(1, _MAX_VARINT_BYTES):
        if top < 1 << (7 * k):
            break
        nbytes += gaps >= np.uint64(1 << (7 * k))
    width = int(nbytes.max())
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = (gaps[:, None] >> shifts[None, :]) & np.uint64(0x7F)
    cols = np.arange(width)[None, :]
    groups |= np.where(cols < nbytes[:, None] - 1, np.uint64(0x80), np.uint64(0))
    data = groups[cols < nbytes[:, None]].astype(np.uint8).tobytes()     # row-major: value by value
    ends = np.cumsum(np.add.reduceat(nbytes, starts)).tolist()
    begin = 0
    for i, end in zip(keep.tolist(), ends):
        out[i] = base64.b64encode(data[begin:end]).decode("ascii")
        begin = end
    return out


def _as_int64(positions) -> np.ndarray:
    arr = np.asarray(positions if isinstance(positions, np.ndarray) else list(positions))
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"positions must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > int(_INT64_MAX):
        raise ValueError("positions must fit in int64")
    return arr.astype(np.int64, copy=False)


def decode_positions(text: str) -> np.ndarray:
    """Decode `encode_positions` output into a sorted, unique int64 array (empty string -> empty)."""
    if not text:
        return np.zeros(0, dtype=np.int64)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise TraceError(f"positions {_preview(text)} are not valid base64: {e}") from None
    b = np.frombuffer(raw, dtype=np.uint8)
    is_last = b < 0x80
    if b.size == 0 or not is_last[-1]:
        raise TraceError(f"positions {_preview(text)} end in a truncated varint")
    ends = np.flatnonzero(is_last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if int(lengths.max()) > _MAX_VARINT_BYTES:
        raise TraceError(f"positions {_preview(text)} hold a varint longer than {_MAX_VARINT_BYTES} bytes")
    offset_in_value = np.arange(b.size) - np.repeat(starts, lengths)
    parts = (b & 0x7F).astype(np.uint64) << (offset_in_value.astype(np.uint64) * np.uint64(7))
    gaps = np.bitwise_or.reduceat(parts, starts)
    if gaps.size > 1 and not bool((gaps[1:] > 0).all()):
        raise TraceError(f"positions {_preview(text)} are not strictly increasing (a zero gap)")
    values = np.cumsum(gaps, dtype=np.uint64)
    # Each prefix sum below int64 max plus a gap below 2**63 cannot wrap, so the first value past the
    # limit is seen before any wrapped one.
    if bool((values > _INT64_MAX).any()):
        raise TraceError(f"positions {_preview(text)} exceed the int64 range")
    return values.astype(np.int64)


def _preview(text: str, n: int = 24) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")
