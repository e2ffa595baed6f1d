"""Saving and safely loading traces (files written on a GPU machine, or uploaded to the app).

`load_trace` / `load_trace_bytes` treat their input as untrusted and check, in this order, each
failure one `TraceError` with one message:
  1. the file exists and is a file (path only);
  2. its size is at most `max_bytes`, from `os.stat` before reading a byte;
  3. it is UTF-8;
  4. its bracket nesting is at most `max_depth`, by a linear scan that skips string contents, before
     any Python object is built (so `[[[[...` 100k deep neither recurses nor crashes);
  5. it is JSON, with no NaN / Infinity / -Infinity (the message names the field) and no integer
     past Python's digit limit;
  6. the top level is an object whose `schema_version` equals TRACE_SCHEMA_VERSION;
  7. it validates as a `Trace`, bounds included (the message lists the first few errors with their
     locations).
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from ..errors import TraceError
from .schema import TRACE_SCHEMA_VERSION, Trace

DEFAULT_MAX_BYTES = 200 * 1024 * 1024
DEFAULT_MAX_DEPTH = 64

_SCAN_CHUNK = 1 << 22
_QUOTE, _BACKSLASH = 2, 3
_KIND = np.zeros(256, dtype=np.int8)          # byte -> +1 open, -1 close, quote, backslash, 0 other
_KIND[list(b"[{")], _KIND[list(b"]}")], _KIND[ord('"')], _KIND[ord("\\")] = 1, -1, _QUOTE, _BACKSLASH


def save_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write `trace` as compact UTF-8 JSON; the file appears whole or not at all."""
    path, tmp = Path(path), None
    try:
        # A unique name beside the target: concurrent writers never share a temporary file.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(trace.model_dump_json())
        os.chmod(tmp, 0o644)        # what a plain open() would give, not mkstemp's 0600
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise TraceError(f"cannot write the trace to {os.fspath(path)!r}: {e.strerror or e}") from None


def load_trace(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES,
               max_depth: int = DEFAULT_MAX_DEPTH) -> Trace:
    """Load and validate a trace file (checks in the module docstring)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TraceError(f"trace file {os.fspath(path)!r} does not exist") from None
    except OSError as e:
        raise TraceError(f"cannot read trace file {os.fspath(path)!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"trace path {os.fspath(path)!r} is not a file")
    _check_size(st.st_size, max_bytes)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)        # a file that grew since the stat still hits the cap
    except OSError as e:
        raise TraceError(f"cannot read trace file {os.fspath(path)!r}: {e.strerror}") from None
    return load_trace_bytes(data, max_bytes=max_bytes, max_depth=max_depth)


def load_trace_bytes(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES,
                     max_depth: int = DEFAULT_MAX_DEPTH) -> Trace:
    """Load and validate a trace from bytes (an upload); same checks as `load_trace` from step 2."""
    _check_size(len(data), max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"trace is not UTF-8 text (bad byte at offset {e.start})") from None
    _check_depth(data, max_depth)
    obj = _parse_json(text)
    _check_version(obj)
    try:
        return Trace.model_validate(obj)
    except ValidationError as e:
        raise TraceError(_summarize(e)) from None


def _check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise TraceError(f"trace is {size:,} bytes, over the {max_bytes:,}-byte limit")


def _check_depth(data: bytes, max_depth: int) -> None:
    """Max nesting of [ and { outside strings, by one linear pass in numpy over fixed-size chunks
    (carrying depth, in-string parity and a trailing backslash run across chunk ends). Only the few
    structural bytes are looked at individually: a quote ends or starts a string unless an odd run of
    backslashes precedes it. A backslash outside a string is invalid JSON and the parser stops there,
    so treating it the same way never hides brackets the parser would reach."""
    buf = np.frombuffer(data, dtype=np.uint8)
    depth = deepest = parity = carry = 0
    for start in range(0, buf.size, _SCAN_CHUNK):
        chunk = buf[start:start + _SCAN_CHUNK]
        pos = np.flatnonzero(_KIND[chunk])
        kind = _KIND[chunk[pos]]
        quotes, backslashes = pos[kind == _QUOTE], pos[kind == _BACKSLASH]
        runs, carry_next = _backslash_runs_before(quotes, backslashes, carry, chunk.size)
        real_quotes = quotes[runs % 2 == 0]
        is_bracket = np.abs(kind) == 1
        brackets, steps = pos[is_bracket], kind[is_bracket].astype(np.int64)
        outside = (np.searchsorted(real_quotes, brackets) + parity) % 2 == 0
        if outside.any():
            running = depth + np.cumsum(steps[outside])
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
        if deepest > max_depth:
            raise TraceError(f"trace nests deeper than the {max_depth}-level limit")
        parity = (parity + real_quotes.size) % 2
        carry = carry_next
    if parity:
        raise TraceError("trace is not valid JSON: a string is never closed")


def _backslash_runs_before(quotes: np.ndarray, backslashes: np.ndarray, carry: int, size: int):
    """Length of the backslash run right before each quote (`carry` = run ending the previous chunk),
    and the run ending this chunk."""
    if backslashes.size == 0:
        return np.where(quotes == 0, carry, 0), 0
    new_run = np.ones(backslashes.size, dtype=bool)
    new_run[1:] = np.diff(backslashes) != 1
    run_start = backslashes[np.maximum.accumulate(np.where(new_run, np.arange(backslashes.size), 0))]
    j = np.maximum(np.searchsorted(backslashes, quotes) - 1, 0)
    adjacent = backslashes[j] == quotes - 1
    runs = np.where(adjacent, quotes - run_start[j], 0)
    runs += np.where((adjacent & (run_start[j] == 0)) | (quotes == 0), carry, 0)
    if backslashes[-1] != size - 1:
        return runs, 0
    return runs, size - run_start[-1] + (carry if run_start[-1] == 0 else 0)


class _NonFinite(Exception):
    def __init__(self, literal: str):
        self.literal = literal


def _parse_json(text: str):
    def reject(literal: str):
        raise _NonFinite(literal)

    try:
        return json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as e:
        raise TraceError(f"trace is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:   # an integer past Python's digit limit (sys.set_int_max_str_digits)
        raise TraceError(f"trace is not valid JSON: {e}") from None
    except _NonFinite as e:
        try:
            where = _find_non_finite(json.loads(text, parse_constant=_Marker))
        except ValueError:
            where = "(unknown place)"
        raise TraceError(f"trace holds {e.literal} at {where}; numbers in a trace must be finite") from None


class _Marker(str):
    """Stands in for a NaN / Infinity literal so its location can be found (depth is already capped)."""


def _find_non_finite(obj, loc: str = "") -> str | None:
    if isinstance(obj, _Marker):
        return loc or "(top level)"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        found = _find_non_finite(value, f"{loc}.{key}" if loc else str(key))
        if found:
            return found
    return None


def _check_version(obj) -> None:
    if not isinstance(obj, dict):
        raise TraceError(f"trace must be a JSON object at the top level, found {type(obj).__name__}")
    found = obj.get("schema_version")
    if type(found) is not int or found != TRACE_SCHEMA_VERSION:
        raise TraceError(f"trace schema_version is {found!r}; this build reads version {TRACE_SCHEMA_VERSION}")


def _summarize(e: ValidationError, limit: int = 3) -> str:
    errors = e.errors(include_url=False)
    parts = []
    for err in errors[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{loc}: {err['msg']}")
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return (f"trace does not match schema version {TRACE_SCHEMA_VERSION} "
            f"({len(errors)} error{'s' * (len(errors) != 1)}): " + "; ".join(parts) + more)
