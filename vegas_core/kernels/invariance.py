"""Checks that a launch keeps a row's output bits whatever is computed beside it: the promise of the
batch-invariant mode (`EngineOptions(deterministic=True)`). Shared by the interpreter's tests
(tests/vegas_core/kernels/test_batch_invariance.py, on the CPU with `tests.row_dot`'s row-by-row
dot) and `python -m vegas_core.bench invariant`, which runs them compiled on the GPU for every
candidate launch before it may propose one.

Each check returns a list of what differed (empty: the bits were equal everywhere), so a test
asserts it empty and the benchmark records it.

- `attention_mismatches`: `verify_attention` with one launch: a batch of verifications (1 to 17
  rows a request, collecting every row's logits), each row of request 0 again as a one-row decode
  step alone, all of them as decode rows among other requests, its last rows as a shorter
  verification, and (with fixed splits) the same rows with the splits folded in one program, as
  in a prefill piece, alone and inside a longer piece: out, lse and the collected logits.
- `rows_mismatches`: any row-wise function (a projection, a norm): rows 0..N-1 at once against the
  first 64, the first 17 and one row alone.
"""
from __future__ import annotations

import math

import torch

from .verify_attention import verify_attention


def _randn(shape, seed: int, device, dtype, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(device)


def _i32(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


def shuffled_tables(blocks_per: list[int], spare: int, generator: torch.Generator):
    """Request i gets `blocks_per[i]` distinct pages in shuffled (non-contiguous) order; `spare`
    further pages belong to nobody. Tables are int32 [B, max(blocks_per) + 1], padded with page 0
    (never read). Returns (tables, num_blocks)."""
    num_blocks = sum(blocks_per) + spare
    perm = torch.randperm(num_blocks, generator=generator)
    tables = torch.zeros(len(blocks_per), max(blocks_per) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per):
        tables[i, :n] = perm[used: used + n]
        used += n
    return tables, num_blocks


def paged_pool(ctx_lens, kv_heads: int, head_dim: int, page: int, seed: int, device,
               dtype=torch.bfloat16):
    """Block tables over a shuffled page pool holding every request's keys (`shuffled_tables`, 3
    spare pages), and random K and V: (tables int32 [B, pages + 1], k, v)."""
    g = torch.Generator().manual_seed(seed)
    tables, num_blocks = shuffled_tables([math.ceil(c / page) for c in ctx_lens], 3, g)
    k = torch.randn(num_blocks, page, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, page, kv_heads, head_dim, generator=g).to(dtype)
    return tables.to(device), k.to(device), v.to(device)


class _Attend:
    """`verify_attention` on one pool with one launch."""

    def __init__(self, k, v, launch: dict, head_dim: int):
        self.k, self.v, self.launch = k, v, dict(launch)
        self.scale = 1 / math.sqrt(head_dim)
        self.collects = not self.launch.get("window")      # a windowed call collects nothing

    def __call__(self, q, tables, ctx, q_lens, collect="all", **extra):
        device = q.device
        qloc = _i32([0] + torch.tensor(list(q_lens)).cumsum(0).tolist(), device)
        out, lse, logits = verify_attention(
            q, self.k, self.v, tables, _i32(ctx, device), qloc, self.scale,
            collect=collect if self.collects else "none", **dict(self.launch, **extra))
        return out, lse, None if logits is None else logits.logits


def attention_mismatches(launch: dict, heads: int, kv_heads: int, head_dim: int, *,
                         ctx=(70, 44, 90, 23), q_lens=(17, 1, 9, 5), rows_alone=None,
                         short_rows: int = 10, piece_rows: int = 0, others: int = 7,
                         page: int = 16, seed: int = 1, device="cpu",
                         dtype=torch.bfloat16) -> list[str]:
    """What differs when request 0's ``q_lens[0]`` verification rows (the last positions of its
    ``ctx[0]`` keys) are computed in other calls of the same ``launch`` (`verify_attention`'s
    keyword arguments, e.g. `batch_invariant_launch`'s):
    - the verification batch (requests of ``q_lens`` rows) with the splits folded in each program
      (``splits_in_program``, a prefill piece's launch; only with fixed ``split_keys``);
    - each row in ``rows_alone`` (default: all) as a one-row decode step alone;
    - all of them as decode rows of one call beside ``others`` other requests' rows;
    - the last ``short_rows`` of them as a verification of their own (collecting its first and
      last rows, as Collect-2-Query does);
    - with ``piece_rows`` > 0 (and fixed splits): inside a prefill piece of that many rows ending
      at the same position, splits folded in the program.
    Compared: out, lse and (without a window) the collected logits over the keys each row sees."""
    q_len = q_lens[0]
    fixed = bool(launch.get("split_keys"))
    tables, k, v = paged_pool(ctx, kv_heads, head_dim, page, seed, device, dtype)
    attend = _Attend(k, v, launch, head_dim)
    q = _randn((sum(q_lens), heads, head_dim), seed + 1, device, dtype)
    out, lse, logits = attend(q, tables, ctx, q_lens)
    bad: list[str] = []

    def compare(what, o, l, c, rows, positions=None):
        for j, r in enumerate(rows):
            if o is not None and (not torch.equal(o[j], out[r]) or not torch.equal(l[j], lse[r])):
                bad.append(f"{what}: row {r} out/lse")
            elif c is not None and positions is not None:
                p = positions[j]
                if not torch.equal(c[j, :, :p + 1], logits[r, :, :p + 1]):
                    bad.append(f"{what}: row {r} logits")

    positions = [ctx[0] - q_len + r for r in range(q_len)]      # each row's own key is its last
    if fixed:
        o2, l2, c2 = attend(q, tables, ctx, q_lens, splits_in_program=True)
        compare("splits in the program", o2, l2, c2, range(sum(q_lens)),
                None if c2 is None else [ctx[i] - 1 for i, n in enumerate(q_lens) for _ in range(n)])
    for r in (range(q_len) if rows_alone is None else rows_alone):
        o1, l1, c1 = attend(q[r:r + 1], tables[:1], [positions[r] + 1], [1])
        compare("decode alone", o1, l1, c1, [r], [positions[r]])
    pick = [1 + i % (len(ctx) - 1) for i in range(others)] if len(ctx) > 1 else []
    b_tables = torch.cat([tables[[0] * q_len], tables[pick]])
    b_ctx = [p + 1 for p in positions] + [ctx[i] for i in pick]
    b_q = torch.cat([q[:q_len], _randn((len(pick), heads, head_dim), seed + 2, device, dtype)])
    ob, lb, cb = attend(b_q, b_tables, b_ctx, [1] * len(b_ctx))
    compare("decode rows in a batch", ob[:q_len], lb[:q_len], None, range(q_len))
    if 0 < short_rows < q_len:
        first = q_len - short_rows
        os_, ls, cs = attend(q[first:q_len], tables[:1], [ctx[0]], [short_rows], collect="c2q")
        compare(f"{short_rows}-row verification", os_, ls, None, range(first, q_len))
        if cs is not None:
            compare(f"{short_rows}-row verification", None, None, cs, [first, q_len - 1],
                    [positions[first], positions[-1]])
    if piece_rows and fixed and piece_rows >= q_len and ctx[0] >= piece_rows:
        extra = piece_rows - q_len
        pq = torch.cat([_randn((extra, heads, head_dim), seed + 3, device, dtype), q[:q_len]])
        op, lp, cp = attend(pq, tables[:1], [ctx[0]], [piece_rows], splits_in_program=True)
        compare(f"{piece_rows}-row prefill piece", op[extra:], lp[extra:],
                None if cp is None else cp[extra:], range(q_len), positions)
    return bad


def rows_mismatches(fn, total: int = 64) -> list[str]:
    """``fn(rows)`` (a slice of rows in, their output out) over rows 0..total-1 at once against the
    first 64 (when total > 64), the first 17 and row 5 alone: which of those differ."""
    full = fn(slice(0, total))
    bad = []
    for rows in ([slice(0, 64)] if total > 64 else []) + [slice(0, 17), slice(5, 6)]:
        if not torch.equal(fn(rows), full[rows]):
            bad.append(f"rows {rows.start}..{rows.stop - 1} differ from the same rows among {total}")
    return bad
