"""The batch-invariant mode's kernels (`EngineOptions(deterministic=True)`): a row's output bits do
not depend on the rows computed beside it. Triton, run by the interpreter on the CPU, in bf16 (the
engine's GPU dtype).

Each kernel's row is computed alone, in a batch (64 rows where the interpreter is quick enough;
24 requests of attention, which at 3 KV heads and several tiles each is already ~200 programs),
and as one of 17 verification rows, and the results must be equal bit for bit (torch.equal). The
attention case also shows that the default launch is not invariant (splits follow each request's
context), so the check can tell the two apart.

`tests.row_dot.row_by_row_dot` runs the interpreter's `tl.dot` one row at a time, as a GPU's
tensor cores do (OpenBLAS's sgemm under the interpreter does not: see that module). With
TRITON_INTERPRET=0 on a GPU the same checks run compiled, which is where that assumption is tested.
"""
import math
import os

import pytest
import torch

from tests.row_dot import row_by_row_dot
from tests.vegas_core.kernels.paged import shuffled_tables
from vegas_core.kernels.argmax import argmax_rows
from vegas_core.kernels.fused import add_rms_norm, rotary_qkv
from vegas_core.kernels.fused_linear import DEFAULT_CONFIG, head_config, linear_add, norm_linear
from vegas_core.kernels.sampling import race, sample_rows
from vegas_core.kernels.sparse_attention import INVARIANT_SPLITS, sparse_attention
from vegas_core.kernels.verify_attention import batch_invariant_launch, verify_attention
from vegas_core.random_streams import DRAFT, TOKEN, stream_key

BF16 = torch.bfloat16
# CPU under the interpreter (CI); compiled on a GPU when run with TRITON_INTERPRET=0 there.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _row_dot():
    if DEVICE != "cpu":       # compiled: the tensor cores' own dot
        yield
        return
    with row_by_row_dot():
        yield


def randn(*shape, seed, scale=1.0, dtype=BF16):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


# -- attention ------------------------------------------------------------------------------------

HEADS, KV_HEADS, DIM, PAGE = 9, 3, 32, 16           # SmolLM2's GQA ratio


def _pool(ctx_lens, seed):
    g = torch.Generator().manual_seed(seed)
    tables, blocks = shuffled_tables([math.ceil(c / PAGE) for c in ctx_lens], 3, g)
    k = torch.randn(blocks, PAGE, KV_HEADS, DIM, generator=g).to(BF16)
    v = torch.randn(blocks, PAGE, KV_HEADS, DIM, generator=g).to(BF16)
    return tables.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def _attend(q, k, v, tables, ctx, q_lens, launch, collect="none"):
    qloc = _i32([0] + torch.tensor(q_lens).cumsum(0).tolist())
    return verify_attention(q, k, v, tables, _i32(ctx), qloc, 1 / math.sqrt(DIM), collect=collect,
                            **launch)


def _small_tiles(launch: dict) -> dict:
    """The launch with 16-key tiles and 32-key splits, so these short contexts cross several
    tiles and splits (the engine's 128 / 1024 do not at ~70 keys)."""
    return dict(launch, block_n=16, split_keys=32)


LAUNCHES = {"engine": batch_invariant_launch(DIM, HEADS // KV_HEADS),
            "small tiles": _small_tiles(batch_invariant_launch(DIM, HEADS // KV_HEADS))}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_verification_rows_equal_decode_rows_alone_and_in_a_batch(launch):
    """Request 0 verifies 17 rows at positions 53..69 in a batch of verifications (1 to 17 rows),
    with split programs and a merge and with the splits folded in each program (prefill's
    launch); each of those rows then runs as a one-row decode step alone, and all 17 as decode
    rows of a 24-request batch: the same out, lse and collected logits, bit for bit."""
    kw = LAUNCHES[launch]
    ctx = [70, 44, 90, 23]
    q_lens = [17, 1, 9, 5]
    tables, k, v = _pool(ctx, seed=1)
    q = randn(sum(q_lens), HEADS, DIM, seed=2)
    out, lse, logits = _attend(q, k, v, tables, ctx, q_lens, kw, collect="all")
    # A prefill's launch: the splits folded inside each program, the same bits.
    o2, l2, c2 = _attend(q, k, v, tables, ctx, q_lens, dict(kw, splits_in_program=True), collect="all")
    assert torch.equal(o2, out) and torch.equal(l2, lse) and torch.equal(c2.logits, logits.logits)
    rows = range(17)
    positions = [ctx[0] - 17 + r for r in rows]            # the row's own key is its last one
    for r, p in zip(rows, positions):
        o1, l1, c1 = _attend(q[r:r + 1], k, v, tables[:1], [p + 1], [1], kw, collect="all")
        assert torch.equal(o1[0], out[r]) and torch.equal(l1[0], lse[r]), r
        assert torch.equal(c1.logits[0, :, :p + 1], logits.logits[r, :, :p + 1]), r
    # 17 decode rows of request 0 and 7 of other requests, in one call.
    others = [1, 2, 2, 3, 1, 3, 2]
    b_tables = torch.cat([tables[[0] * 17], tables[others]])
    b_ctx = [p + 1 for p in positions] + [ctx[i] for i in others]
    b_q = torch.cat([q[:17], randn(len(others), HEADS, DIM, seed=3)])
    ob, lb, _ = _attend(b_q, k, v, b_tables, b_ctx, [1] * len(b_ctx), kw)
    assert torch.equal(ob[:17], out[:17]) and torch.equal(lb[:17], lse[:17])


def test_windowed_rows_equal_decode_rows():
    """A sliding-window layer (window 20, which skips whole tiles before it): the 17 verification
    rows, with the splits folded in the program too, equal the rows' decode steps."""
    kw = dict(LAUNCHES["small tiles"], window=20)
    ctx, q_lens = [70, 44], [17, 1]
    tables, k, v = _pool(ctx, seed=1)
    q = randn(sum(q_lens), HEADS, DIM, seed=2)
    out, lse, _ = _attend(q, k, v, tables, ctx, q_lens, kw)
    o2, l2, _ = _attend(q, k, v, tables, ctx, q_lens, dict(kw, splits_in_program=True))
    assert torch.equal(o2, out) and torch.equal(l2, lse)
    for r in range(17):
        o1, l1, _ = _attend(q[r:r + 1], k, v, tables[:1], [ctx[0] - 16 + r], [1], kw)
        assert torch.equal(o1[0], out[r]) and torch.equal(l1[0], lse[r]), r


def test_default_launch_is_not_invariant():
    """The check above can fail: with splits that follow each request's context (the default
    launch), some row's bits differ between the verification and its decode step."""
    ctx, q_lens = [100, 44], [17, 1]
    tables, k, v = _pool(ctx, seed=1)
    q = randn(sum(q_lens), HEADS, DIM, seed=2)
    kw = dict(block_n=16, num_splits=3)
    out, lse, _ = _attend(q, k, v, tables, ctx, q_lens, kw)
    same = []
    for r in range(17):
        o1, l1, _ = _attend(q[r:r + 1], k, v, tables[:1], [ctx[0] - 16 + r], [1], kw)
        same.append(torch.equal(o1[0], out[r]) and torch.equal(l1[0], lse[r]))
    assert not all(same)


def test_draft_rows_alone_and_in_a_batch():
    """A draft row's sparse attention (fixed split count, one program per KV head) alone, and in
    a batch of 24 whose other requests select per KV head (so its one set is read by every KV
    head of a [B, KV heads, K] index tensor)."""
    g = torch.Generator().manual_seed(4)
    ctx = [90, 70, 40, 120, 33, 64] * 4
    tails = [3, 1, 7, 2, 5, 4] * 4
    counts = [20, 40, 0, 64, 9, 30] * 4
    tables, k, v = _pool(ctx, seed=5)
    q = randn(len(ctx), HEADS, DIM, seed=6)
    width = max(counts)
    indices = torch.zeros(len(ctx), KV_HEADS, width, dtype=torch.int32)
    for b, (c, t, n) in enumerate(zip(ctx, tails, counts)):
        for h in range(KV_HEADS):
            indices[b, h, :n] = torch.randperm(c - t, generator=g)[:n]
    indices[0, 1:] = indices[0, :1]                 # request 0 selects per layer
    indices = indices.to(DEVICE)
    kw = dict(num_splits=INVARIANT_SPLITS, packed=False, block_n=16)
    scale = 1 / math.sqrt(DIM)
    tail = _i32([c - t for c, t in zip(ctx, tails)])
    batch = sparse_attention(q, k, v, tables, _i32(ctx), indices, _i32(counts), tail, scale, **kw)
    alone = sparse_attention(q[:1], k, v, tables[:1], _i32(ctx[:1]), indices[:1, :1].contiguous(),
                             _i32(counts[:1]), tail[:1], scale, **kw)
    assert torch.equal(alone[0], batch[0])
    for b in (3, 5):   # per-KV-head requests alone too
        one = sparse_attention(q[b:b + 1], k, v, tables[b:b + 1], _i32(ctx[b:b + 1]),
                               indices[b:b + 1], _i32(counts[b:b + 1]), tail[b:b + 1], scale, **kw)
        assert torch.equal(one[0], batch[b])


# -- projections and norms ------------------------------------------------------------------------

def _rows_alone_17_and_64(fn):
    """fn(rows) over rows 0..63, 0..16 and row 5 alone: the same bits for the same rows."""
    full = fn(slice(0, 64))
    assert torch.equal(fn(slice(0, 17)), full[:17])
    assert torch.equal(fn(slice(5, 6))[0], full[5])


@pytest.mark.parametrize("config", [None, DEFAULT_CONFIG, "head"])
def test_projection_rows(config):
    """`norm_linear` (with its RMSNorm prologue, plain, and with SiLU * up) and `linear_add`, at
    the launch the interpreter runs (None), a GPU one and the head's."""
    config = head_config() if config == "head" else config
    x = randn(64, 96, seed=7)
    nw, w, b = randn(96, seed=8), randn(80, 96, seed=9, scale=0.1), randn(80, seed=10)
    _rows_alone_17_and_64(lambda r: norm_linear(x[r], nw, 1e-6, w, b, config=config))
    _rows_alone_17_and_64(lambda r: norm_linear(x[r], None, 1e-6, w, config=config))
    _rows_alone_17_and_64(lambda r: norm_linear(x[r], nw, 1e-6, w, silu_mul=True, config=config))
    res = randn(64, 80, seed=11)
    _rows_alone_17_and_64(lambda r: linear_add(x[r], w, res[r].clone(), b, config=config))


def test_norm_and_rotary_rows():
    """`add_rms_norm` and `rotary_qkv` (each row reduced on its own; under the interpreter a
    program takes up to 32 rows, on a GPU one)."""
    x, res, w = randn(64, 96, seed=12), randn(64, 96, seed=13), randn(96, seed=14)
    _rows_alone_17_and_64(lambda r: add_rms_norm(x[r], w, 1e-6, res[r])[0])
    heads, kv, d = 4, 2, 16
    qkv = randn(64, (heads + 2 * kv) * d, seed=15)
    cos, sin = randn(64, d, seed=16), randn(64, d, seed=17)
    qn, kn = randn(d, seed=18), randn(d, seed=19)

    def rotate(r):
        cache = torch.zeros(8, 16, kv, d, dtype=BF16, device=DEVICE)
        slots = torch.arange(64, device=DEVICE)[r] + 40
        return rotary_qkv(qkv[r], cos[r], sin[r], heads, kv, d, cache, cache.clone(), slots, qn, kn)
    _rows_alone_17_and_64(rotate)


# -- the sampler ----------------------------------------------------------------------------------

def test_argmax_and_sampling_rows():
    """`argmax_rows`, `sample_rows` (probabilities and tokens, greedy and filtered rows mixed)
    and `race` over 64 rows, 17 and one."""
    n, vocab = 64, 300
    g = torch.Generator().manual_seed(20)
    logits = (4 * torch.randn(n, vocab, generator=g)).to(BF16).float()
    params = torch.stack([torch.where(torch.arange(n) % 5 == 0, 0.0, 0.8),
                          torch.where(torch.arange(n) % 2 == 0, 40.0, float(vocab)),
                          torch.where(torch.arange(n) % 3 == 0, 0.9, 1.0),
                          torch.where(torch.arange(n) % 4 == 0, 0.05, 0.0)])
    keys = torch.tensor([stream_key(i) for i in range(n)])
    pos = torch.randint(0, 1 << 20, (n,), generator=g)
    logits, params, keys, pos = (t.to(DEVICE) for t in (logits, params, keys, pos))

    def pick(rows):
        return logits[rows], params[:, rows], keys[rows], pos[rows]
    _rows_alone_17_and_64(lambda r: argmax_rows(logits[r].to(BF16)))
    full_p, full_t = sample_rows(*pick(slice(0, n)), DRAFT)
    for rows in (slice(0, 17), slice(5, 6)):
        p, t = sample_rows(*pick(rows), DRAFT)
        assert torch.equal(p, full_p[rows]) and torch.equal(t, full_t[rows])
    full = race(full_p, keys, pos, TOKEN)
    assert torch.equal(race(full_p[5:6], keys[5:6], pos[5:6], TOKEN), full[5:6])
