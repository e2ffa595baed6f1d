"""`kernels.select`: the Triton kernels (run by the interpreter on the CPU) against their PyTorch
references, and the batched selection against the engine's per-request functions in
`vegas_core.spec.select`.

Tolerances: `selection_scores` (log-mean weights) vs its reference atol = 1e-6, rtol = 1e-5
(float32 maths on the same bf16 logits; only exp/log rounding and summation order differ); `quest_page_scores` vs its reference and
vs `quest_scores` atol = rtol = 1e-4. Selected positions must be exactly the engine's sets; the
random data are drawn so that scores are distinct (logits are distinct multiples of 1/8, exact in
bf16) and every test checks that the last chosen and first rejected reference scores differ by more than
twice the tolerance, so a top-k can never flip on rounding.
"""
import functools
import math
import os

import pytest
import torch

from vegas_core.kernels.select import (quest_page_scores, quest_page_scores_reference, quest_positions,
                            quest_positions_reference, quest_sizes, selection_scores,
                            selection_scores_reference, topk_positions, update_page_bounds)
from vegas_core.kernels.verify_attention import collected_rows, verify_attention_reference
from tests.vegas_core.kernels.paged import shuffled_tables
from vegas_core.spec.select import (quest_page_bounds, quest_scores, quest_select,
                                    select_from_logits)

# CPU under the interpreter (CI); compiled on a GPU when run with TRITON_INTERPRET=0 there.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"
GRANS = ("layer", "kv-head")


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def assert_margin(score, k, atol, rtol):
    """The k-th and (k+1)-th largest of each row of `score` [G, n] differ by more than twice the
    tolerance allowed on either, so any scores within tolerance of `score` give the same top-k set."""
    if 0 < k < score.shape[-1]:
        top = torch.topk(score.double(), k + 1, dim=-1).values
        gap = top[:, k - 1] - top[:, k]
        tol = atol + rtol * top[:, k - 1].abs()
        assert (gap > 2 * tol).all(), f"test data too close to a tie: gap {gap.min().item()}"


# ------------------------------------------------------------------------------------------------
# selection_scores / topk_positions
# ------------------------------------------------------------------------------------------------

SEL_CASES = [  # (q_lens, ctx_lens, bases, heads, kv_heads)
    # GQA 1; 1, 2, 8, 17 rows; base == ctx puts causally masked keys inside the scored range.
    ([1, 2, 8, 17], [9, 40, 37, 70], [8, 38, 37, 60], 4, 4),
    ([17, 1, 8], [30, 50, 45], [13, 49, 45], 9, 3),      # GQA 3
    ([2, 8, 1], [33, 16, 64], [31, 16, 64], 8, 1),       # GQA 8
]


@functools.lru_cache(maxsize=None)
def sel_case(idx):
    """Collected logits of every row of every request, causally masked, with distinct values per
    (row, head) (multiples of 1/8, exact in bf16). Rows are stored in reverse request order after one
    spare row that no request owns (the kernel must follow row_start)."""
    q_lens, ctx_lens, bases, heads, _ = SEL_CASES[idx]
    g = torch.Generator().manual_seed(100 + idx)
    n = max(ctx_lens)
    rows = 1 + sum(q_lens)
    logits = torch.randn(rows, heads, n, generator=g)                 # the spare row: never read
    row_start = [0] * len(q_lens)
    at = 1
    for b in reversed(range(len(q_lens))):
        q_len, ctx = q_lens[b], ctx_lens[b]
        row_start[b] = at
        for r in range(q_len):
            vals = torch.stack([torch.randperm(n, generator=g) for _ in range(heads)]).float()
            vals = (vals - n / 2) / 8
            visible = torch.arange(n) <= ctx - q_len + r
            logits[at + r] = vals.masked_fill(~visible, float("-inf"))
        at += q_len
    logits = logits.to(torch.bfloat16)
    lse = torch.logsumexp(logits.float(), dim=-1)
    return (logits.to(DEVICE), lse.to(DEVICE), _i32(row_start), _i32(q_lens), _i32(bases))


@functools.lru_cache(maxsize=None)
def sel_triton(idx, gran):
    logits, lse, row_start, row_count, bases = sel_case(idx)
    return selection_scores(logits, lse, row_start, row_count, bases, SEL_CASES[idx][4], gran)


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("idx", range(len(SEL_CASES)))
def test_selection_scores_matches_reference(idx, gran):
    logits, lse, row_start, row_count, bases = sel_case(idx)
    kv_heads = SEL_CASES[idx][4]
    got = sel_triton(idx, gran)
    want = selection_scores_reference(logits, lse, row_start, row_count, bases, kv_heads, gran)
    groups = 1 if gran == "layer" else kv_heads
    assert got.dtype == torch.float32 and got.shape == (len(bases), groups, logits.shape[-1])
    pos = torch.arange(logits.shape[-1], device=DEVICE)
    past = pos[None, None, :] >= bases[:, None, None]
    assert torch.isneginf(got[past.expand_as(got)]).all()
    assert torch.isfinite(got[~past.expand_as(got)]).all()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("idx", range(len(SEL_CASES)))
def test_selection_matches_engine(idx, gran):
    """selection_scores + topk_positions give, per request, select_from_logits's set."""
    logits, lse, row_start, row_count, bases = sel_case(idx)
    kv_heads = SEL_CASES[idx][4]
    score = sel_triton(idx, gran)
    base_list = bases.tolist()
    budgets = [max(1, b // 3) for b in base_list]
    budgets[-1] = base_list[-1]                                       # one full selection
    pos, counts = topk_positions(score, _i32(budgets))
    assert pos.dtype == torch.int32 and counts.dtype == torch.int32
    assert pos.shape == (len(budgets), score.shape[1], max(budgets))
    assert counts.tolist() == budgets
    for b, (s, c, base, k) in enumerate(zip(row_start.tolist(), row_count.tolist(), base_list,
                                            budgets)):
        lg, ls = logits[s:s + c, :, :base].cpu(), lse[s:s + c].cpu()
        ref_score = selection_scores_reference(lg, ls, _i32([0]).cpu(), _i32([c]).cpu(),
                                               _i32([base]).cpu(), kv_heads, gran)[0]
        assert_margin(ref_score, k, 1e-6, 1e-5)
        want = select_from_logits(lg, ls, k, kv_heads, gran)
        assert torch.equal(pos[b, :, :k].cpu().long(), want)
        assert (pos[b, :, k:] == 0).all()


def test_topk_positions_empty_and_full():
    g = torch.Generator().manual_seed(5)
    n, bases = 20, [20, 7, 12]
    score = torch.stack([torch.randperm(n, generator=g).float() for _ in range(6)]).view(3, 2, n)
    for b, base in enumerate(bases):
        score[b, :, base:] = float("-inf")
    score = score.to(DEVICE)
    pos, counts = topk_positions(score, _i32([0, 0, 0]))              # nothing selected
    assert pos.shape == (3, 2, 0) and pos.dtype == torch.int32 and counts.tolist() == [0, 0, 0]
    pos, counts = topk_positions(score, _i32(bases))                  # budget == base: everything
    assert counts.tolist() == bases and pos.shape == (3, 2, 20)
    for b, base in enumerate(bases):
        assert torch.equal(pos[b, :, :base].cpu(), torch.arange(base, dtype=torch.int32).expand(2, -1))
        assert (pos[b, :, base:] == 0).all()
    pos, counts = topk_positions(score, _i32([0, 7, 3]))              # mixed, one empty
    assert counts.tolist() == [0, 7, 3] and pos.shape == (3, 2, 7)
    assert (pos[0] == 0).all()
    assert torch.equal(pos[1].cpu(), torch.arange(7, dtype=torch.int32).expand(2, -1))
    for gi in range(2):
        want = torch.sort(torch.topk(score[2, gi].cpu(), 3).indices).values
        assert torch.equal(pos[2, gi, :3].cpu().long(), want)
    assert (pos[2, :, 3:] == 0).all()


def test_selection_scores_from_verify_attention():
    """Contract hook-up: CollectedLogits (C2Q) of the verification feed selection_scores as is."""
    g = torch.Generator().manual_seed(11)
    q_lens, ctx_lens, heads, kv_heads, dim, bs = [1, 5, 17], [12, 29, 40], 6, 2, 16, 8
    blocks = [math.ceil(c / bs) for c in ctx_lens]
    tables = torch.randperm(sum(blocks), generator=g).to(torch.int32)
    tables = torch.nn.utils.rnn.pad_sequence(list(tables.split(blocks)), batch_first=True)
    k_cache = torch.randn(sum(blocks), bs, kv_heads, dim, generator=g)
    v_cache = torch.randn(sum(blocks), bs, kv_heads, dim, generator=g)
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    _, lse, coll = verify_attention_reference(q, k_cache, v_cache, tables,
                                              torch.tensor(ctx_lens, dtype=torch.int32), loc,
                                              dim ** -0.5, collect="c2q")
    rows = collected_rows(loc, "c2q")
    per_req = [1 if n == 1 else 2 for n in q_lens]
    row_start = [0, *torch.tensor(per_req).cumsum(0).tolist()[:-1]]
    bases = [c - n for c, n in zip(ctx_lens, q_lens)]                 # verification starts at base
    args = (coll.logits.to(DEVICE), lse[rows].to(DEVICE), _i32(row_start), _i32(per_req),
            _i32(bases), kv_heads)
    for gran, block_n in (("layer", 16), ("kv-head", 64)):     # tiles smaller than the context
        torch.testing.assert_close(selection_scores(*args, gran, block_n=block_n),
                                   selection_scores_reference(*args, gran), atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Quest
# ------------------------------------------------------------------------------------------------

QUEST_CASES = [  # (bases, budgets, heads, kv_heads, head_dim, page_size)
    # GQA 1; base 5 < page: no complete page (partial only); budget >= base: every page (full).
    ([5, 40, 64, 16, 37], [4, 8, 64, 3, 20], 4, 4, 16, 8),
    ([17, 100, 15], [16, 30, 15], 9, 3, 32, 16),          # GQA 3
    ([33, 64, 80, 40], [1, 64, 40, 200], 8, 1, 24, 16),   # GQA 8; head_dim not a power of two
]


@functools.lru_cache(maxsize=None)
def quest_case(idx, dtype=torch.float32):
    """Paged pool with shuffled block tables (a spare block at the front of each table's padding,
    and unused blocks), page bounds of every complete page below each base, one draft row each."""
    bases, budgets, heads, kv_heads, dim, ps = QUEST_CASES[idx]
    g = torch.Generator().manual_seed(200 + idx)
    # one block past each base, and 2 blocks nobody owns
    tables, num_blocks = shuffled_tables([math.ceil(b / ps) + 1 for b in bases], 2, g)
    k_cache = torch.randn(num_blocks, ps, kv_heads, dim, generator=g).to(dtype)
    q = torch.randn(len(bases), heads, dim, generator=g).to(dtype)
    num_pages = [b // ps for b in bases]
    kmin = torch.full((num_blocks, kv_heads, dim), float("nan"), dtype=dtype)   # never read
    kmax = torch.full((num_blocks, kv_heads, dim), float("nan"), dtype=dtype)
    complete = torch.cat([tables[i, :n].long() for i, n in enumerate(num_pages)])
    k_cache, q, tables, kmin, kmax = (t.to(DEVICE) for t in (k_cache, q, tables, kmin, kmax))
    update_page_bounds(k_cache, kmin, kmax, complete.to(DEVICE))
    return q, k_cache, tables, kmin, kmax, _i32(num_pages)


def request_keys(k_cache, tables, b, base):
    ps, kv_heads, dim = k_cache.shape[1:]
    pos = torch.arange(base, device=k_cache.device)
    slots = tables[b].long()[pos // ps] * ps + pos % ps
    return k_cache.reshape(-1, kv_heads, dim)[slots]


def engine_bounds(idx, b):
    """The engine's page bounds of request b: quest_page_bounds over its keys [0, base)."""
    q, k_cache, tables, *_ = quest_case(idx)
    bases, ps = QUEST_CASES[idx][0], QUEST_CASES[idx][5]
    return quest_page_bounds(request_keys(k_cache, tables, b, bases[b]).cpu(), ps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_page_bounds_matches_engine(dtype):
    bases, _, _, kv_heads, dim, ps = QUEST_CASES[0]
    q, k_cache, tables, kmin, kmax, num_pages = quest_case(0, dtype)
    assert kmin.dtype == dtype
    touched = torch.zeros(k_cache.shape[0], dtype=torch.bool)
    for b, base in enumerate(bases):
        want_min, want_max = quest_page_bounds(request_keys(k_cache, tables, b, base).cpu(), ps)
        blk = tables[b, :base // ps].long()
        assert torch.equal(kmin[blk].float().cpu(), want_min)
        assert torch.equal(kmax[blk].float().cpu(), want_max)
        touched[blk.cpu()] = True
    assert torch.isnan(kmin[~touched.to(DEVICE)]).all()              # other blocks left alone
    update_page_bounds(k_cache, kmin, kmax, torch.zeros(0, dtype=torch.long, device=DEVICE))


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("idx", range(len(QUEST_CASES)))
def test_quest_page_scores(idx, gran):
    q, k_cache, tables, kmin, kmax, num_pages = quest_case(idx)
    bases, _, heads, kv_heads, _, ps = QUEST_CASES[idx]
    got = quest_page_scores(q, kmin, kmax, tables, num_pages, gran)
    want = quest_page_scores_reference(q, kmin, kmax, tables, num_pages, gran)
    groups = 1 if gran == "layer" else kv_heads
    assert got.dtype == torch.float32 and got.shape == (len(bases), groups, max(num_pages.tolist()))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for b, n in enumerate(num_pages.tolist()):
        assert torch.isneginf(got[b, :, n:]).all()
        if n == 0:
            continue
        kmin_r, kmax_r = engine_bounds(idx, b)
        s = quest_scores(q[b].cpu(), kmin_r, kmax_r)                  # [H, P], as quest_select
        agg = s.sum(0, keepdim=True) if groups == 1 else s.view(kv_heads, heads // kv_heads, n).sum(1)
        torch.testing.assert_close(got[b, :, :n].cpu(), agg, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gran", GRANS)
def test_quest_page_scores_bf16(gran):
    """A bf16 pool and query: the kernel and the reference both upcast to float32."""
    q, k_cache, tables, kmin, kmax, num_pages = quest_case(1, torch.bfloat16)
    got = quest_page_scores(q, kmin, kmax, tables, num_pages, gran, block_p=4)   # several tiles
    want = quest_page_scores_reference(q, kmin, kmax, tables, num_pages, gran)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


QUEST_POSITIONS = (quest_positions, quest_positions_reference)


@pytest.mark.parametrize("positions", QUEST_POSITIONS)
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("idx", range(len(QUEST_CASES)))
def test_quest_positions_match_engine(idx, gran, positions):
    q, k_cache, tables, kmin, kmax, num_pages = quest_case(idx)
    bases, budgets, heads, kv_heads, _, ps = QUEST_CASES[idx]
    scores = quest_page_scores(q, kmin, kmax, tables, num_pages, gran)
    idxs, counts = positions(scores, num_pages, _i32(bases), _i32(budgets), ps)
    # As a CUDA graph calls it: sizes given and wider than needed (the rest is padding 0).
    k, s_max = quest_sizes(num_pages.tolist(), bases, budgets, ps)
    wide, wide_counts = positions(scores, num_pages, _i32(bases), _i32(budgets), ps, sizes=(k + 5, min(s_max + 1, scores.shape[-1])))
    assert torch.equal(wide[:, :, :k], idxs) and (wide[:, :, k:] == 0).all()
    assert torch.equal(wide_counts, counts)
    groups = 1 if gran == "layer" else kv_heads
    assert idxs.dtype == torch.int32 and counts.dtype == torch.int32
    assert idxs.shape == (len(bases), groups, max(counts.tolist()))
    for b, (base, k, n) in enumerate(zip(bases, budgets, num_pages.tolist())):
        kmin_r, kmax_r = engine_bounds(idx, b)
        if n:
            ref = quest_page_scores_reference(q[b:b + 1].cpu(), kmin_r, kmax_r,
                                              torch.arange(n, dtype=torch.int32)[None],
                                              _i32([n]).cpu(), gran)[0]
            assert_margin(ref, min(n, max(1, -(-k // ps))), 1e-4, 1e-4)
        want = quest_select(q[b].cpu(), kmin_r, kmax_r, k, base, ps, gran)
        c = int(counts[b])
        assert c == want.shape[1]
        assert torch.equal(idxs[b, :, :c].cpu().long(), want)
        assert (idxs[b, :, c:] == 0).all()
    # the cases include a request with no complete page (partial only) and a full selection
    assert 0 in num_pages.tolist() or idx > 0
    assert any(k >= base for base, k in zip(bases, budgets))


def test_quest_positions_many_rows_match_reference():
    """Many (request, group) rows, random page counts, bases and budgets: each program ranks its
    own row's pages (not a neighbour's), against the reference."""
    g = torch.Generator().manual_seed(5)
    batch, groups, p_max, ps = 37, 2, 10, 4
    num_pages = torch.randint(0, p_max + 1, (batch,), generator=g)
    scores = torch.randn(batch, groups, p_max, generator=g)       # -inf past num_pages, as scored
    scores = scores.masked_fill(torch.arange(p_max) >= num_pages[:, None, None], float("-inf"))
    scores = scores.to(DEVICE)
    bases = num_pages * ps + torch.randint(0, ps, (batch,), generator=g)
    budgets = torch.randint(1, p_max * ps, (batch,), generator=g)
    args = (scores, _i32(num_pages.tolist()), _i32(bases.tolist()), _i32(budgets.tolist()), ps)
    got, got_counts = quest_positions(*args)
    want, want_counts = quest_positions_reference(*args)
    assert torch.equal(got_counts, want_counts) and torch.equal(got, want)


@pytest.mark.parametrize("positions", QUEST_POSITIONS)
def test_quest_no_complete_page_anywhere(positions):
    """Pmax == 0: no launch, only the partial tails; and nothing at all when every base is 0."""
    q, k_cache, tables, kmin, kmax, _ = quest_case(0)
    num_pages = _i32([0] * q.shape[0])
    for gran in GRANS:
        scores = quest_page_scores(q, kmin, kmax, tables, num_pages, gran)
        groups = 1 if gran == "layer" else kmin.shape[1]
        assert scores.shape == (q.shape[0], groups, 0)
        assert torch.equal(scores, quest_page_scores_reference(q, kmin, kmax, tables, num_pages, gran))
    scores = torch.empty(2, 3, 0, device=DEVICE)
    idx, counts = positions(scores, _i32([0, 0]), _i32([3, 5]), _i32([4, 4]), 8)
    assert counts.tolist() == [3, 5] and idx.shape == (2, 3, 5)
    assert idx[0].tolist() == [[0, 1, 2, 0, 0]] * 3 and idx[1].tolist() == [[0, 1, 2, 3, 4]] * 3
    idx, counts = positions(scores, _i32([0, 0]), _i32([0, 0]), _i32([0, 0]), 8)
    assert counts.tolist() == [0, 0] and idx.shape == (2, 3, 0)


def test_select_layers_equals_per_layer_selection():
    """One top-k over every layer's scores = each layer's own selection_scores + topk_positions."""
    from vegas_core.kernels.select import select_layers, selection_scores, topk_positions
    g = torch.Generator().manual_seed(11)
    rows, heads, kvh, n = 5, 6, 3, 48     # wider than every base: n_keys=40 scores less
    collected = []
    for _ in range(3):
        lg = (torch.randperm(rows * heads * n, generator=g).float() / 64).view(rows, heads, n)
        collected.append((lg.to(torch.bfloat16).to(DEVICE), torch.logsumexp(lg, -1).to(DEVICE)))
    start = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    count = torch.tensor([2, 1, 2], dtype=torch.int32, device=DEVICE)
    bases = torch.tensor([40, 17, 30], dtype=torch.int32, device=DEVICE)
    budgets = torch.tensor([9, 0, 30], dtype=torch.int32, device=DEVICE)
    stacked = (torch.stack([lg for lg, _ in collected]), torch.stack([ls for _, ls in collected]))
    for gran in ("layer", "kv-head"):
        got = select_layers(collected, start, count, bases, budgets, 30, kvh, gran)
        # The stacked form (one launch for every layer) and a narrower scored width agree.
        assert torch.equal(select_layers(stacked, start, count, bases, budgets, 30, kvh, gran, n_keys=40), got)
        for layer, (lg, ls) in enumerate(collected):
            want, _ = topk_positions(selection_scores(lg, ls, start, count, bases, kvh, gran), budgets)
            for b, k in enumerate(budgets.tolist()):
                assert torch.equal(got[layer, b, :, :k], want[b, :, :k]), (gran, layer, b)


@pytest.mark.parametrize("score_launch, topk_launch", [((16, 2), (16, 8)), ((32, 8), (64, 2))])
def test_select_layers_launch_sizes_choose_the_same(score_launch, topk_launch):
    """Other position tiles / chunks and warps than the engine's (kernels.select.SCORE_LAUNCH,
    TOPK_LAUNCH) give the engine's positions, ties included."""
    import vegas_core.kernels.select as select
    g = torch.Generator().manual_seed(12)
    rows, heads, kvh, n, layers = 6, 6, 3, 70, 2
    values = torch.tensor([-2.0, 0.0, 0.5, 3.0])     # few distinct values: many exact ties
    lg = values[torch.randint(0, 4, (layers, rows, heads, n), generator=g)]
    collected = (lg.to(torch.bfloat16).to(DEVICE), torch.logsumexp(lg, -1).to(DEVICE))
    start, count = _i32([0, 2, 3]), _i32([2, 1, 3])
    bases, budgets = _i32([70, 33, 51]), _i32([12, 1, 51])
    want = {gran: select.select_layers(collected, start, count, bases, budgets, 51, kvh, gran)
            for gran in ("layer", "kv-head")}
    for gran, positions in want.items():
        assert torch.equal(select.select_layers(collected, start, count, bases, budgets, 51, kvh, gran,
                                                score_launch=score_launch, topk_launch=topk_launch),
                           positions), gran


def test_radix_topk_equals_torch_topk_over_packed_keys():
    """The radix select against torch.topk over the int64 (score bits, reversed position) keys
    it replaced: rows of 2,500 positions (three 1,024-key chunks) full of exact ties, negative and
    positive scores, -inf and both zeros; budgets 0, 1, 7, all ties of a value, every position."""
    from vegas_core.kernels.select import _topk_sorted, radix_topk
    g = torch.Generator().manual_seed(5)
    batch, layers, groups, n = 5, 2, 2, 2500
    values = torch.tensor([-3.5, -1.0, -0.0, 0.0, 0.25, 2.0, float("-inf"), 7.0])
    scores = values[torch.randint(0, len(values), (layers * batch, groups, n), generator=g)]
    scores[3, 0, :] = 2.0                          # one row of one value: budget 900 of ties
    bits = scores.view(torch.int32)
    keys = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)          # order-preserving, as the kernel
    packed = (keys.long() << 32) | (0x7FFFFFFF - torch.arange(n))
    budgets = torch.tensor([0, 1, 7, 900, n])
    got = radix_topk(keys.to(DEVICE), budgets.to(DEVICE), n, block=1024).cpu()
    want = _topk_sorted(packed, budgets.repeat(layers), n)
    for r in range(layers * batch):
        k = int(budgets[r % batch])
        assert torch.equal(got[r, :, :k], want[r, :, :k]), r
        assert (got[r, :, k:] == 0).all()


def test_select_layers_breaks_ties_by_position():
    """Exactly equal scores (repeated keys) keep the lower positions; negative and positive
    log-weights order as floats do (the packed int64 keys the top-k runs on)."""
    from vegas_core.kernels.select import select_layers
    n = 12
    logits = torch.tensor([0.0, 2.0, 2.0, -1.0, 2.0, 5.0, -3.0, 5.0, 1.0, 0.5, 2.0, 4.0])
    logits = logits.view(1, 1, 1, n).to(torch.bfloat16).to(DEVICE)                # [L, R, H, N]
    lse = torch.logsumexp(logits.float(), -1)
    got = select_layers((logits, lse), _i32([0]), _i32([1]), _i32([n]), _i32([5]), 5, 1, "layer")
    assert got[0, 0, 0].tolist() == [1, 2, 5, 7, 11]          # 5, 5, 4, then the first two 2.0s
