"""The batch-invariant mode's kernels (`EngineOptions(deterministic=True)`): a row's output bits do
not depend on the rows computed beside it. Triton, run by the interpreter on the CPU, in bf16 (the
engine's GPU dtype).

Each kernel's row is computed alone, in a batch (64 rows where the interpreter is quick enough;
24 requests of attention, which at 3 KV heads and several tiles each is already ~200 programs),
and as one of 17 verification rows, and the results must be equal bit for bit (torch.equal). The
attention checks (`vegas_core.kernels.invariance`, which `bench invariant` runs compiled on the
GPU) take today's launch and the launches `bench invariant` can propose; they also show that the
default launch is not invariant (splits follow each request's context), so the check can tell
the two apart.

`tests.row_dot.row_by_row_dot` runs the interpreter's `tl.dot` one row at a time, as a GPU's
tensor cores do (OpenBLAS's sgemm under the interpreter does not: see that module). With
TRITON_INTERPRET=0 on a GPU the same checks run compiled, which is where that assumption is tested.
"""
import dataclasses
import math
import os

import pytest
import torch

from tests.row_dot import row_by_row_dot
from vegas_core.bench.invariant import attention_axes, resolved
from vegas_core.kernels.argmax import argmax_rows
from vegas_core.kernels.fused import add_rms_norm, rotary_qkv
from vegas_core.kernels.fused_linear import DEFAULT_CONFIG, head_config, linear_add, norm_linear
from vegas_core.kernels.invariance import attention_mismatches, paged_pool, rows_mismatches
from vegas_core.kernels.sampling import race, sample_rows
from vegas_core.kernels.sparse_attention import INVARIANT_SPLITS, sparse_attention
from vegas_core.kernels.verify_attention import batch_invariant_launch, invariant_piece_rows
from vegas_core.options import MEASURED_INVARIANT, InvariantConfig
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
GROUP = HEADS // KV_HEADS


def _pool(ctx_lens, seed):
    return paged_pool(ctx_lens, KV_HEADS, DIM, PAGE, seed, DEVICE)


def _interpreter_scale(cfg: InvariantConfig) -> InvariantConfig:
    """``cfg`` with its tiles and splits shrunk (keys per tile / 4, keys per split / 16), so the
    ~70-key contexts here cross several of each as 8K contexts cross the GPU's."""
    return dataclasses.replace(cfg, block_n=cfg.block_n // 4, split_keys=cfg.split_keys // 16)


def _covering_configs() -> list[InvariantConfig]:
    """Every value of every knob that `bench invariant`'s descent can set, each in one of these
    few configurations (config i takes value i of each knob, cyclically), at the interpreter's
    scale. Warps, stages and the register cap mean nothing to the interpreter (the benchmark
    checks them compiled, on the GPU); the tile rows (row chunks), keys per tile, split size, page
    prefetch, fused merge and unmasked tiles change what it runs."""
    axes = attention_axes(DIM, GROUP)
    today = resolved(InvariantConfig(), DIM, GROUP)
    return [_interpreter_scale(resolved(dataclasses.replace(
        today, **{k: v[i % len(v)] for k, v in axes}), DIM, GROUP))
        for i in range(max(len(v) for _, v in axes))]


# SmolLM2's measured launch (`options.MEASURED_INVARIANT`, what a deterministic engine of its shape runs).
MEASURED = _interpreter_scale(resolved(InvariantConfig(**MEASURED_INVARIANT[HEADS, KV_HEADS, 64][1]), DIM, GROUP))
LAUNCHES = {"engine": (batch_invariant_launch(DIM, GROUP), InvariantConfig()),
            "measured smollm2": (batch_invariant_launch(DIM, GROUP, MEASURED), MEASURED),
            **{f"bench candidates {i}": (batch_invariant_launch(DIM, GROUP, c), c)
               for i, c in enumerate(_covering_configs())}}


def test_the_covering_configurations_take_every_value_the_bench_tries():
    configs = _covering_configs()
    for knob, values in attention_axes(DIM, GROUP):
        if knob in ("block_n", "split_keys"):
            values = [v // (4 if knob == "block_n" else 16) for v in values]
        assert {getattr(c, knob) for c in configs} == set(values), knob
    assert {c.block_m for c in configs} == {64, 32, 16}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_verification_rows_equal_decode_rows_alone_and_in_a_batch(launch):
    """Request 0 verifies 17 rows at positions 53..69 in a batch of verifications (1 to 17 rows),
    with split programs and a merge and with the splits folded in each program (prefill's
    launch); each of those rows then runs as a one-row decode step alone, all 17 as decode rows
    of a 24-request batch, the last 10 as a verification of their own, and inside a prefill
    piece: the same out, lse and collected logits, bit for bit (`kernels.invariance`). Today's
    launch takes every row alone; the candidates' (row chunks make the interpreter slower) the
    first, middle and last."""
    kw, cfg = LAUNCHES[launch]
    bad = attention_mismatches(kw, HEADS, KV_HEADS, DIM, device=DEVICE,
                               rows_alone=None if launch == "engine" else (0, 8, 16),
                               piece_rows=invariant_piece_rows(GROUP, cfg))
    assert not bad, bad


def test_windowed_rows_equal_decode_rows():
    """A sliding-window layer (window 20, which skips whole tiles before it): the 17 verification
    rows, with the splits folded in the program too, equal the rows' decode steps."""
    kw = dict(batch_invariant_launch(DIM, GROUP, _covering_configs()[0]), window=20)
    bad = attention_mismatches(kw, HEADS, KV_HEADS, DIM, ctx=(70, 44), q_lens=(17, 1),
                               short_rows=0, device=DEVICE)
    assert not bad, bad


def test_default_launch_is_not_invariant():
    """The check above can fail: with splits that follow each request's context (the default
    launch), some row's bits differ between the verification and its decode step."""
    assert attention_mismatches(dict(block_n=16, num_splits=3), HEADS, KV_HEADS, DIM,
                                ctx=(100, 44), q_lens=(17, 1), short_rows=0, device=DEVICE)


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
    assert not rows_mismatches(fn, 64)


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
