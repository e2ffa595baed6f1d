"""`verify_attention` (Triton, run by the interpreter on the CPU) against
`verify_attention_reference` (plain PyTorch), and the reference against the engine's own maths.

Tolerances: fp32 inputs; `out` and `lse` must match with atol = rtol = 1e-4; collected logits are
bf16 and must match the reference's bf16 logits with rtol = 1e-2 (atol 1e-2 for values near zero)
and have -inf exactly where the reference does. `out` and `lse` must be bit-identical whether
nothing, the first and last rows (c2q) or all rows are collected.
"""
import math
import os

import pytest
import torch

from kernels.verify_attention import (collected_rows, default_num_splits, verify_attention,
                                      verify_attention_reference)
from tests.kernels.paged import shuffled_tables
from vegas_core.attention.reference import causal_mask, dense_scores, weighted_values

# CPU under the interpreter (CI); compiled on a GPU when run with TRITON_INTERPRET=0 there.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"


def make_case(q_lens, ctx_lens, heads, kv_heads, head_dim, block_size=16, seed=0,
              dtype=torch.float32):
    """Random paged pool with shuffled (non-contiguous) block tables, padded with page 0 past each
    request's blocks (never read), on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    tables, num_blocks = shuffled_tables([math.ceil(c / block_size) for c in ctx_lens], 3, g)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=g).to(dtype)
    q_start_loc = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    tensors = (q, k_cache, v_cache, tables, ctx, q_start_loc)
    return (*(t.to(DEVICE) for t in tensors), 1.0 / math.sqrt(head_dim))


CASES = [  # (q_lens, ctx_lens, heads, kv_heads, head_dim)
    ([1, 2, 8, 17], [5, 40, 37, 70], 4, 4, 16),       # GQA 1; ragged; ctx not multiple of 16
    ([17, 1], [17, 50], 9, 3, 32),                    # GQA 3 (SmolLM2's ratio); ctx == q_len
    ([2, 8, 1], [33, 16, 64], 8, 1, 16),              # GQA 8; exact multiples of the page
]


def check_logits(got, want):
    assert got is not None and want is not None
    assert torch.equal(got.rows, want.rows)
    assert got.logits.dtype == torch.bfloat16 and got.logits.shape == want.logits.shape
    g, w = got.logits.float(), want.logits.float()
    assert torch.equal(torch.isinf(g), torch.isinf(w))
    fin = torch.isfinite(w)
    torch.testing.assert_close(g[fin], w[fin], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("q_lens,ctx_lens,heads,kv_heads,head_dim", CASES)
def test_matches_reference_and_collect_keeps_output(q_lens, ctx_lens, heads, kv_heads, head_dim,
                                                    num_splits):
    """Single pass and split-K (3 splits of a 70-key context: 32 + 32 + 6 keys, and requests
    shorter than the first split leave later splits empty) both match the reference."""
    args = make_case(q_lens, ctx_lens, heads, kv_heads, head_dim)
    base_out, base_lse, none = verify_attention(*args, collect="none", num_splits=num_splits)
    assert none is None
    for collect in ("none", "c2q", "all"):
        ref_out, ref_lse, ref_logits = verify_attention_reference(*args, collect=collect)
        out, lse, logits = verify_attention(*args, collect=collect, num_splits=num_splits)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
        assert torch.equal(out, base_out) and torch.equal(lse, base_lse)
        if collect == "none":
            assert logits is None and ref_logits is None
        else:
            check_logits(logits, ref_logits)


def test_block_size_and_tile_independent():
    """The key tile (block_n) need not equal the pool's page size (8 here)."""
    args = make_case([3, 8], [21, 45], 6, 2, 16, block_size=8, seed=3)
    ref_out, ref_lse, _ = verify_attention_reference(*args)
    for block_n, splits in ((16, 1), (64, 1), (16, 2)):
        out, lse, _ = verify_attention(*args, block_n=block_n, num_splits=splits)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_default_split_count():
    """About eight programs per SM, never a split shorter than 512 keys, never more than 64."""
    assert default_num_splits(64, 8, 8192, num_sms=132) == 2      # 512 programs -> 2 per (req, head)
    assert default_num_splits(64, 3, 8192, num_sms=132) == 6      # the tuned SmolLM2 shape
    assert default_num_splits(1, 3, 8192, num_sms=132) == 16      # capped by 8192 / 512
    assert default_num_splits(1, 3, 300, num_sms=132) == 1        # too short to split
    assert default_num_splits(128, 8, 32768, num_sms=132) == 1


def test_collected_rows_map():
    loc = torch.tensor([0, 1, 3, 11], dtype=torch.int32)
    assert collected_rows(loc, "none").tolist() == []
    assert collected_rows(loc, "c2q").tolist() == [0, 1, 2, 3, 10]
    assert collected_rows(loc, "all").tolist() == list(range(11))
    with pytest.raises(ValueError):
        collected_rows(loc, "some")


def test_reference_matches_engine_maths():
    """Tie the reference to vegas_core.attention.reference: dense_scores + causal_mask + softmax."""
    q_lens, ctx_lens = [1, 8], [9, 30]
    q, k_cache, v_cache, tables, ctx, loc, scale = make_case(q_lens, ctx_lens, 9, 3, 16, seed=7)
    q, k_cache, v_cache, tables, ctx, loc = (t.cpu() for t in (q, k_cache, v_cache, tables, ctx, loc))
    out, lse, logits = verify_attention_reference(q, k_cache, v_cache, tables, ctx, loc, scale,
                                                  collect="all")
    bs = k_cache.shape[1]
    kf, vf = k_cache.reshape(-1, 3, 16), v_cache.reshape(-1, 3, 16)
    for i, (n, c) in enumerate(zip(q_lens, ctx_lens)):
        a = int(loc[i])
        pos = torch.arange(c)
        slots = tables[i].long()[pos // bs] * bs + pos % bs
        s = dense_scores(q[a:a + n], kf[slots], scale)
        s = s.masked_fill(causal_mask(n, c, "cpu")[:, None, :], float("-inf"))
        want_out = weighted_values(torch.softmax(s, dim=-1), vf[slots])
        torch.testing.assert_close(out[a:a + n], want_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[a:a + n], torch.logsumexp(s, dim=-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits.logits[a:a + n, :, :c].float(),
                                   s.to(torch.bfloat16).float())
        assert torch.isinf(logits.logits[a:a + n, :, c:]).all()
