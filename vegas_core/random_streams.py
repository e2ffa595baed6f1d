"""Counter-based random numbers: one stream per request, addressed by (token position, purpose).

Why not a `torch.Generator` per request: drawing from 64 generators takes 64 calls (and a host
round trip each) per step, while a batch needs one op. Here a uniform is a pure function of
(request key, position, purpose, column), computed by integer hashing in int64 tensor ops, so a
whole batch draws in one vectorised call with no host read, on the CPU and the GPU alike (the
same integers on both), and inside a CUDA graph. A request's draws depend only on its own key and
positions, not on the batch it runs in or on how often a step is retried.

Contract:
- `stream_key(seed)`: a 32-bit key for a request; the same seed gives the same key, None draws one
  from torch's global generator (so `torch.manual_seed` still makes unseeded runs repeat).
- `uniforms(keys [N], positions [N] or [N, M], tag, width)`: float32 in (0, 1), shape
  [N, width] (or [N, M] for width 1 with 2-D positions); distinct (key, position, tag, column)
  give independent-looking values. 23 bits each: (h + 0.5) / 2^23 (`unit_interval`), never 0 or 1.
- Purposes (`tag`): TOKEN for the token kept at a position (a plain sample, a correction, a
  bonus), DRAFT for a draft's sample, ACCEPT for the acceptance test of a draft. One position
  uses each purpose at most once for what it emits (a draft redrawn after a rejection reuses its
  DRAFT draw, which nothing emitted depended on).
"""
from __future__ import annotations

import functools

import torch

TOKEN, DRAFT, ACCEPT = 0, 1, 2
_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' lowbias32 integer hash on int64 holding 32-bit values. The low 32 bits of an
    int64 product are exact even when it wraps, so the masks keep every step a 32-bit op."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _mix32_int(x: int) -> int:
    return int(_mix32(torch.tensor([x & _M32], dtype=torch.int64))[0])


def stream_key(seed: int | None) -> int:
    """A request's 32-bit stream key from its seed (None: a fresh one from torch's RNG)."""
    if seed is None:
        return int(torch.randint(0, 1 << 32, (1,), dtype=torch.int64))
    lo, hi = seed & _M32, (seed >> 32) & _M32
    return _mix32_int(lo ^ _mix32_int(hi + _GOLDEN))


def tag_salt(tag: int) -> int:
    """The 32-bit constant a purpose XORs into a request's key (`kernels.sampling` uses it too)."""
    return (tag * 0x632BE5AB + 0x5BD1E995) & _M32


@functools.lru_cache(maxsize=16)
def _column_hash(width: int, device: torch.device) -> torch.Tensor:
    return _mix32(torch.arange(width, dtype=torch.int64, device=device) * _GOLDEN + 1)


def uniforms(keys: torch.Tensor, positions: torch.Tensor, tag: int, width: int = 1) -> torch.Tensor:
    """Uniform (0, 1) float32 draws (see the module docstring)."""
    keys = keys.to(torch.int64)
    positions = positions.to(torch.int64)
    if positions.dim() == 2:
        if width != 1:
            raise ValueError("2-D positions draw one value each (width 1)")
        keys = keys[:, None]
    row = _mix32(_mix32(keys ^ tag_salt(tag)) + positions)
    if positions.dim() == 2:
        h = _mix32(row ^ _column_hash(1, keys.device)[0])
    else:
        h = _mix32(row[:, None] ^ _column_hash(width, keys.device)[None, :])
    return unit_interval(h)


def unit_interval(h: torch.Tensor) -> torch.Tensor:
    """float32 in (0, 1) from 32-bit hashes: the top 23 bits plus a half, over 2^23. Every value
    is exact in float32, the largest 1 - 2^-24. With 24 bits the largest, (2^24 - 0.5) / 2^24,
    rounds to 1.0 in float32: the race's -log(u) was then 0, a zero-weight token's w / E was NaN,
    and torch's argmax takes NaN as the maximum, so about one draw in 340 over a 49,152-token
    vocabulary could emit a token outside the top-p filter."""
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))
