"""`verify_attention` (Triton, run by the interpreter on the CPU) against
`verify_attention_reference` (plain PyTorch), and the reference against the engine's own maths.

Tolerances: fp32 inputs; `out` and `lse` must match with atol = rtol = 1e-4; collected logits are
bf16 and must match the reference's bf16 logits with rtol = 1e-2 (atol 1e-2 for values near zero)
and have -inf exactly where the reference does. `out` and `lse` must be bit-identical whether
nothing, the first and last rows (c2q, through the main tile or the small first/last tile) or all
rows are collected, and whether the call is padded as a CUDA graph pads it.
"""
import math
import os

import pytest
import torch

from vegas_core.kernels.verify_attention import (collected_row_slots, collected_rows, default_num_splits,
                                      verify_attention, verify_attention_into,
                                      verify_attention_reference)
from tests.vegas_core.kernels.paged import poison_before, shuffled_tables
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
    """Single pass and split-K both match the reference. With 16-key tiles each request's context
    is cut into 3 ranges of whole tiles (70 keys: 32 + 32 + 6; 5 keys: 16 + two empty ones)."""
    args = make_case(q_lens, ctx_lens, heads, kv_heads, head_dim)
    kw = dict(num_splits=num_splits, block_n=16)
    base_out, base_lse, none = verify_attention(*args, collect="none", **kw)
    assert none is None
    for collect, c2q_tile in (("none", None), ("c2q", True), ("c2q", False), ("all", None)):
        ref_out, ref_lse, ref_logits = verify_attention_reference(*args, collect=collect)
        out, lse, logits = verify_attention(*args, collect=collect, c2q_tile=c2q_tile, **kw)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
        assert torch.equal(out, base_out) and torch.equal(lse, base_lse)
        if collect == "none":
            assert logits is None and ref_logits is None
        else:
            check_logits(logits, ref_logits)


@pytest.mark.parametrize("window", [8, 20])
def test_sliding_window_matches_reference_and_skips_the_keys_before_it(window):
    """A sliding-window layer (Gemma 3's local layers): each row at position p sees keys in
    (p - window, p], as transformers masks them, so rows of one request start at different keys
    (17 rows over a window of 8: the last row sees none of the first row's keys). Every key and
    value before the first row's window is NaN, so reading one would show: the kernel answers as
    the clean reference does, single pass and split (fused merge or not), with the unmasked-tile
    launch too (a window masks every tile), and a window wider than the context is no window."""
    q_lens, ctx_lens = [1, 3, 8, 17], [5, 40, 37, 70]
    args = make_case(q_lens, ctx_lens, 9, 3, 16, seed=17)
    ref_out, ref_lse, _ = verify_attention_reference(*args, window=window)
    full_out, _, _ = verify_attention_reference(*args)
    assert not torch.allclose(ref_out, full_out)                  # the window changes the answer
    q, k_cache, v_cache, tables, ctx, loc, scale = args
    poison_before(k_cache, v_cache, tables,
                  [max(0, c - n + 1 - window) for c, n in zip(ctx_lens, q_lens)])
    for splits, fused, unmasked in ((1, False, False), (3, True, True), (4, False, False)):
        out, lse, _ = verify_attention(*args, window=window, num_splits=splits, block_n=16,
                                       fused_merge=fused, unmasked_tiles=unmasked)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    wide = make_case(q_lens, ctx_lens, 9, 3, 16, seed=17)
    out, lse, _ = verify_attention(*wide, window=71, num_splits=2, block_n=16)
    want_out, want_lse, _ = verify_attention_reference(*wide)
    torch.testing.assert_close(out, want_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="collects no logits"):
        verify_attention(*wide, window=window, collect="c2q")


def test_sliding_window_reference_is_the_engines_windowed_attention():
    """The kernel's reference windows rows as the engine's reference backend does (its
    `window_mask`, checked against transformers' Gemma 3 in the model tests)."""
    from vegas_core.attention.reference import window_mask
    q_lens, ctx_lens, window = [6, 1], [23, 30], 5
    q, k_cache, v_cache, tables, ctx, loc, scale = make_case(q_lens, ctx_lens, 4, 2, 16, seed=9)
    out, _, _ = verify_attention_reference(q, k_cache, v_cache, tables, ctx, loc, scale,
                                           window=window)
    kf, vf = k_cache.reshape(-1, 2, 16), v_cache.reshape(-1, 2, 16)
    for b, (n, c) in enumerate(zip(q_lens, ctx_lens)):
        pos = torch.arange(c, device=q.device)
        slots = tables[b].long()[pos // 16] * 16 + pos % 16
        s = dense_scores(q[loc[b]:loc[b + 1]], kf[slots], scale)
        s = s.masked_fill(window_mask(n, c, window, q.device)[:, None, :], float("-inf"))
        want = weighted_values(torch.softmax(s, dim=-1), vf[slots])
        torch.testing.assert_close(out[loc[b]:loc[b + 1]], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("unmasked", [False, True])
def test_unmasked_tiles_match_reference_and_collect_keeps_output(unmasked):
    """Tiles every row sees whole may skip the masks (`unmasked_tiles`): either way the reference's
    answers, with the fused merge and without, over requests whose contexts hold several whole
    tiles before the first new row (70 keys, 17 rows: 48 unmasked), none (ctx == q_len) and
    splits that end inside the masked part; and for one choice, collecting (C2Q through either
    tile, all rows) gives the no-collection output bit for bit. (Masked and unmasked may differ
    in the last bit once compiled, so `launch_config` makes one choice per head dim.)"""
    args = make_case([17, 1, 8, 3], [70, 50, 8, 97], 9, 3, 16, seed=13)
    for splits, fused in ((1, False), (3, True)):
        kw = dict(num_splits=splits, block_n=16, fused_merge=fused, unmasked_tiles=unmasked)
        base_out, base_lse, _ = verify_attention(*args, collect="none", **kw)
        for collect, c2q_tile in (("none", None), ("c2q", True), ("c2q", False), ("all", None)):
            ref_out, ref_lse, ref_logits = verify_attention_reference(*args, collect=collect)
            out, lse, logits = verify_attention(*args, collect=collect, c2q_tile=c2q_tile, **kw)
            assert torch.equal(out, base_out) and torch.equal(lse, base_lse)
            torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
            if collect != "none":
                check_logits(logits, ref_logits)


def test_c2q_tile_collects_an_explicit_first_last_subset():
    """A batch mixing policies: request 0 collects nothing, 1 its only row, 2 its first row only,
    3 its first and last. The small first/last tile stores exactly those rows (every other row of
    the buffer keeps its poison), as the main-tile store does."""
    q_lens, ctx_lens = [3, 1, 5, 4], [20, 33, 47, 64]
    args = make_case(q_lens, ctx_lens, 9, 3, 16, seed=11)
    rows = [3, 4, 9, 12]     # flat rows: request 1's row 0, 2's first, 3's first and last
    _, _, ref = verify_attention_reference(*args, collect=rows)
    for c2q_tile in (True, False):
        _, _, got = verify_attention(*args, collect=rows, c2q_tile=c2q_tile, num_splits=2, block_n=16)
        check_logits(got, ref)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the merge of padding rows reads unset memory
def test_graph_padded_launch_matches_unpadded():
    """As a CUDA graph calls it: padding requests with no rows and no context after the real ones,
    padding rows past the last request, a logits buffer wider than any context whose tail is left
    unwritten (logits_len 0), outputs preallocated. Real rows equal the plain call bit for bit."""
    q_lens, ctx_lens = [2, 7, 1], [30, 51, 18]
    q, k_cache, v_cache, tables, ctx, loc, scale = make_case(q_lens, ctx_lens, 9, 3, 16, seed=5)
    total, pad_rows, pad_reqs, width = int(loc[-1]), 6, 2, 80
    rows = collected_rows(loc.cpu(), "c2q")
    want_out, want_lse, want = verify_attention(q, k_cache, v_cache, tables, ctx, loc, scale,
                                                collect="c2q", num_splits=3, block_n=16)
    qp = torch.cat([q, torch.randn(pad_rows, *q.shape[1:], device=q.device)])
    tp = torch.cat([tables, torch.zeros(pad_reqs, tables.shape[1], dtype=tables.dtype,
                                        device=tables.device)])
    cp = torch.cat([ctx, torch.zeros(pad_reqs, dtype=ctx.dtype, device=ctx.device)])
    lp = torch.cat([loc, loc[-1:].expand(pad_reqs)])
    slot = collected_row_slots(rows, total + pad_rows).to(q.device)
    out = torch.full_like(qp, float("nan"))
    lse = torch.full((total + pad_rows, 9), float("nan"), device=q.device)
    logits = torch.full((len(rows) + 3, 9, width), 7.0, dtype=torch.bfloat16, device=q.device)
    for c2q_tile in (True, False):
        verify_attention_into(qp, k_cache, v_cache, tp, cp, lp, scale, out, lse, max_q=7,
                              num_splits=3, logits=logits, row_slot=slot, c2q_tile=c2q_tile,
                              logits_len=0, block_n=16)
        assert torch.equal(out[:total], want_out) and torch.equal(lse[:total], want_lse)
        for j, r in enumerate(rows.tolist()):
            c = int(ctx[[i for i in range(3) if loc[i] <= r < loc[i + 1]][0]])
            assert torch.equal(logits[j, :, :c], want.logits[j, :, :c])
            assert (logits[j, :, c:] == 7.0).all()          # past the context: left unwritten
        assert (logits[len(rows):] == 7.0).all()            # slots nobody owns


def test_block_size_and_tile_independent():
    """The key tile (block_n) need not equal the pool's page size (8 here)."""
    args = make_case([3, 8], [21, 45], 6, 2, 16, block_size=8, seed=3)
    ref_out, ref_lse, _ = verify_attention_reference(*args)
    for block_n, splits in ((16, 1), (64, 1), (16, 2)):
        out, lse, _ = verify_attention(*args, block_n=block_n, num_splits=splits)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("collect", ["none", "c2q"])
def test_fused_merge_matches_the_merge_kernel_and_leaves_counters_zeroed(collect):
    """The last split merges (kernels.split_merge): the separate merge kernel's answers,
    including a split with no keys (ctx 5 over 4 splits of 16-key tiles), the shared arrival
    counters zero again after the call, and the same bits from both merges (a collecting path
    may merge the other way: collecting must not change the output) and on a second call."""
    from vegas_core.kernels.split_merge import arrival_counters
    args = make_case([1, 2, 8, 17], [5, 40, 37, 70], 9, 3, 16, seed=5)
    ref_out, ref_lse, ref_logits = verify_attention_reference(*args, collect=collect)
    results = []
    for fused in (True, False, True):
        out, lse, logits = verify_attention(*args, collect=collect, num_splits=4, block_n=16,
                                            fused_merge=fused)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
        if collect != "none":
            check_logits(logits, ref_logits)
        assert not arrival_counters(out.device, 4 * 3).any()
        results.append((out, lse))
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


@pytest.mark.parametrize("fields", [dict(block_m=16), dict(block_m=32, fused_merge=True, page_ahead=1),
                                    dict(block_m=16, fused_merge=True, unmasked_tiles=True)],
                         ids=["row chunks", "row chunks, fused merge, pages ahead",
                              "row chunks, fused merge, unmasked"])
def test_invariant_candidate_launches_match_the_reference(fields):
    """Launches `bench invariant` may propose for the batch-invariant mode: a tile smaller than a
    request's rows takes them in chunks of block_m // group rows, one program each (17 rows at
    GQA 3: 4 chunks of a 16-row tile; the 1-row request's other chunks attend nothing), and the
    fused merge folds the fixed splits online; split programs and splits folded in one program
    (a prefill piece) give the reference's answers, the same bits, and the shared arrival
    counters zero again."""
    from vegas_core.kernels.split_merge import arrival_counters
    from vegas_core.kernels.verify_attention import batch_invariant_launch
    from vegas_core.options import InvariantConfig
    args = make_case([17, 1, 9, 5], [70, 44, 90, 23], 9, 3, 16, seed=6)
    launch = dict(batch_invariant_launch(16, 3, InvariantConfig(**fields)), block_n=16, split_keys=32)
    ref_out, ref_lse, ref_logits = verify_attention_reference(*args, collect="all")
    out, lse, logits = verify_attention(*args, collect="all", **launch)
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    check_logits(logits, ref_logits)
    assert not arrival_counters(out.device, 4 * 4 * 3).any()
    o2, l2, c2 = verify_attention(*args, collect="all", splits_in_program=True, **launch)
    assert torch.equal(o2, out) and torch.equal(l2, lse) and torch.equal(c2.logits, logits.logits)
    with pytest.raises(ValueError, match="first/last tile needs every row"):
        verify_attention(*args, collect="c2q", **dict(launch, c2q_tile=True))


def test_launch_config_caps_registers_only_where_measured_to_pay():
    """The H200 measurements behind launch_config: C2Q's register cap helps tiles of up to 32 rows
    and spills on 64 (12-16 rows), which keep the merge kernel and no cap; the main-tile path is
    never capped; without collection head dim 128 keeps the merge kernel."""
    from vegas_core.kernels.verify_attention import launch_config
    assert launch_config(2, 64, 32).max_registers == 168 and launch_config(2, 64, 32).fused_merge
    assert launch_config(2, 128, 16).max_registers == 128
    for dim in (64, 128):
        wide = launch_config(2, dim, 64)
        assert wide.max_registers == 0 and not wide.fused_merge
        assert launch_config(1, dim, 32).max_registers == 0
    assert not launch_config(0, 128, 16).fused_merge and launch_config(0, 64, 16).fused_merge
    # unmasked tiles: one choice per head dim for every path (collecting must not change the
    # output, and compiled the two can differ in the last bit): on at 128, off at 64
    for rows in (16, 32, 64):
        assert all(launch_config(mode, 128, rows).unmasked_tiles for mode in (0, 1, 2))
        assert not any(launch_config(mode, 64, rows).unmasked_tiles for mode in (0, 1, 2))


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (8, 2, 128)])
@pytest.mark.parametrize("q_rows", [1, 9])
def test_default_launches_collect_without_changing_the_output(heads, kv_heads, head_dim, q_rows):
    """At the launches the engine takes (no tile, split or merge given), every collection mode
    gives the no-collection bits: the paths of a head dim share the key tile (the online softmax
    rounds at tile boundaries), the masks, and the merge arithmetic."""
    from vegas_core.kernels.verify_attention import launch_config
    args = make_case([q_rows] * 3, [300, 517, 77], heads, kv_heads, head_dim, seed=23)
    base_out, base_lse, _ = verify_attention(*args, collect="none", num_splits=3)
    rows = [0, 3 * q_rows - 1]
    for collect, c2q_tile in (("c2q", True), ("c2q", False), ("all", None), (rows, None)):
        out, lse, _ = verify_attention(*args, collect=collect, c2q_tile=c2q_tile, num_splits=3)
        assert torch.equal(out, base_out) and torch.equal(lse, base_lse), (collect, c2q_tile)
    tiles = {launch_config(mode, head_dim, block_m, q).block_n for mode in (0, 1, 2)
             for block_m, q in ((16, 1), (32, 8), (64, 17))}
    assert tiles == {128 if head_dim <= 64 else 64}


@pytest.mark.parametrize("unmasked", [False, True])
def test_block_table_entries_loaded_ahead_give_the_same_bits(unmasked):
    """`page_ahead` 1 or 2 only moves when a tile's block-table entries are loaded (into the
    iteration before, or two before): the same output and logits bits as loading them in front of
    the gather, over ragged requests, splits that end mid-context, both tile kinds and collection;
    a one-row batch as a plain decode step runs it."""
    for q_lens, ctx_lens in (([1, 2, 8, 17], [5, 40, 37, 70]), ([1, 1, 1], [30, 51, 18])):
        args = make_case(q_lens, ctx_lens, 9, 3, 16, seed=21)
        for collect in ("none", "c2q"):
            kw = dict(collect=collect, num_splits=3, block_n=16, unmasked_tiles=unmasked)
            want = verify_attention(*args, page_ahead=0, **kw)
            for ahead in (1, 2):
                got = verify_attention(*args, page_ahead=ahead, **kw)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
                if collect != "none":
                    assert torch.equal(got[2].logits, want[2].logits)
    with pytest.raises(ValueError, match="page_ahead"):
        verify_attention(*args, page_ahead=3)


def test_one_row_launch_loads_pages_ahead_only_where_measured():
    """Run 49: one tile ahead over 3 stages sped the one-row call at head dim 64 and nothing else."""
    from vegas_core.kernels.verify_attention import launch_config
    one = launch_config(0, 64, 16, q_rows=1)
    assert (one.page_ahead, one.num_stages) == (1, 3)
    for cfg in (launch_config(0, 64, 16, q_rows=2), launch_config(0, 128, 16, q_rows=1),
                launch_config(2, 64, 16, q_rows=1), launch_config(1, 64, 16, q_rows=1),
                launch_config(0, 64, 32)):
        assert (cfg.page_ahead, cfg.num_stages) == (0, 2)


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


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter's tl.dot is wrong for bf16; compiled GPU runs only")
def test_bf16_at_smollm2s_shape_collect_keeps_output():
    """bf16 as the engine runs it (SmolLM2's 9 / 3 heads at head dim 64, 1 and 9 rows, contexts
    over several splits): within bf16 rounding of the float32 reference, and collecting (C2Q either
    way, all rows) gives the no-collection bits at the engine's own launches."""
    for q_rows in (1, 9):
        args = make_case([q_rows] * 6, [300, 517, 640, 1000, 77, 1200], 9, 3, 64, seed=21,
                         dtype=torch.bfloat16)
        ref_out, ref_lse, _ = verify_attention_reference(
            *(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
        kw = dict(num_splits=4)
        base_out, base_lse, _ = verify_attention(*args, collect="none", **kw)
        torch.testing.assert_close(base_out.float(), ref_out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(base_lse, ref_lse, atol=1e-2, rtol=1e-3)
        for collect, c2q_tile in (("c2q", True), ("c2q", False), ("all", None)):
            out, lse, logits = verify_attention(*args, collect=collect, c2q_tile=c2q_tile, **kw)
            assert torch.equal(out, base_out) and torch.equal(lse, base_lse)
