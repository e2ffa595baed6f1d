"""`kernels.sampling` (Triton, run by the interpreter on the CPU) against its PyTorch references:
`vegas_core.sampling.probs_from_tensors` (filtered form) and `sample_keyed`.

Tolerances: probabilities atol = 1e-6 (exp and the order of the sums differ), the kept sets equal,
the race's tokens equal. The uniforms are the same bits in both, so a token can differ only where
two race values tie within an ulp of the log; the data here are drawn so that never happens (the
test checks the margin). Logits are rounded to bf16 values, so ties at the top-k and top-p
thresholds occur, and both sides must keep every tied entry (the documented rule).
"""
import os

import pytest
import torch

from vegas_core.kernels.sampling import (race, race_reference, sample_rows, sample_rows_reference,
                                         topk_bound_tiles)
from vegas_core.random_streams import DRAFT, TOKEN, stream_key, uniforms

# CPU under the interpreter (CI); compiled on a GPU when run with TRITON_INTERPRET=0 there.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"


def _batch(n, vocab, seed):
    """bf16-valued logits and a mix of rows: greedy, plain, top-k, top-p, min-p and all three."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=g) * 4).bfloat16().float()
    temp = torch.rand(n, generator=g) * 1.5 + 0.1
    temp[::6] = 0.0
    top_k = torch.randint(1, vocab + 1, (n,), generator=g).float()
    top_k[1::2] = vocab
    top_p = torch.rand(n, generator=g) * 0.9 + 0.05
    top_p[::3] = 1.0
    min_p = torch.rand(n, generator=g) * 0.3
    min_p[1::4] = 0.0
    params = torch.stack([temp, top_k, top_p, min_p])
    keys = torch.tensor([stream_key(seed * 1000 + i) for i in range(n)])
    positions = torch.randint(0, 1 << 20, (n,), generator=g)
    return [t.to(DEVICE) for t in (logits, params, keys, positions)]


def _assert_race_margin(weights, keys, positions, tag):
    """The two largest race values of each row differ by far more than an ulp."""
    u = uniforms(keys, positions, tag, weights.shape[1])
    top = (weights.double() / -u.double().log()).topk(2, dim=-1).values
    assert ((top[:, 0] - top[:, 1]) > 1e-5 * top[:, 0]).all()


@pytest.mark.parametrize("n,vocab,block", [(24, 300, 64), (6, 1000, None), (12, 13, None)])
def test_sample_rows_matches_the_reference(n, vocab, block):
    logits, params, keys, positions = _batch(n, vocab, seed=vocab)
    probs, tokens = sample_rows(logits, params, keys, positions, DRAFT, block=block)
    ref_probs, ref_tokens = sample_rows_reference(logits, params, keys, positions, DRAFT)
    assert torch.equal(probs > 0, ref_probs > 0)
    torch.testing.assert_close(probs, ref_probs, atol=1e-6, rtol=0)
    _assert_race_margin(ref_probs, keys, positions, DRAFT)
    assert torch.equal(tokens, ref_tokens)
    greedy = params[0] == 0
    assert torch.equal(tokens[greedy], logits[greedy].argmax(dim=-1))
    # Every filter was exercised: some sampled rows keep a strict subset.
    kept = (probs > 0).sum(dim=-1)
    assert ((kept > 1) & (kept < vocab)).any() and (kept[~greedy] < vocab).any()


def test_sample_rows_without_tokens_gives_the_same_probs():
    logits, params, keys, positions = _batch(8, 200, seed=3)
    probs, tokens = sample_rows(logits, params, None, None, TOKEN, sample=False)
    assert tokens is None
    assert torch.equal(probs, sample_rows(logits, params, keys, positions, TOKEN)[0])


def test_ties_at_a_threshold_are_all_kept():
    # Scaled logits 3, 2, 2, 1, 1, 0: top-k 2 keeps both tied 2s with the 3 (a stable sort would
    # keep only the lower-index 2); top-p reaching its mass inside the tied 1s keeps both of them.
    logits = torch.tensor([[3.0, 2.0, 1.0, 2.0, 0.0, 1.0]] * 2, device=DEVICE)
    e = torch.exp(logits[0] - 3.0)
    mass_to_ones = float(e[:4].sum() / e.sum())      # 3, 2, 2 and one of the 1s
    params = torch.tensor([[1.0, 1.0], [2.0, 6.0], [1.0, mass_to_ones - 1e-3], [0.0, 0.0]],
                          device=DEVICE)
    keys = torch.tensor([stream_key(1), stream_key(2)], device=DEVICE)
    positions = torch.zeros(2, dtype=torch.long, device=DEVICE)
    for fn in (sample_rows, sample_rows_reference):
        probs, _ = fn(logits, params, keys, positions, TOKEN)
        assert (probs[0] > 0).tolist() == [True, True, False, True, False, False]
        assert (probs[1] > 0).tolist() == [True, True, True, True, False, True]


@pytest.mark.parametrize("tag", [TOKEN, DRAFT])
def test_race_gives_sample_keyed_tokens(tag):
    g = torch.Generator().manual_seed(tag)
    weights = torch.rand(32, 500, generator=g)
    weights[weights < 0.3] = 0.0                       # zero weights are never picked
    weights[5] = 0.0
    weights[5, 123] = 1.0                               # a one-hot row gives its token
    keys = torch.tensor([stream_key(i) for i in range(32)])
    positions = torch.randint(0, 1 << 30, (32,), generator=g)
    weights, keys, positions = weights.to(DEVICE), keys.to(DEVICE), positions.to(DEVICE)
    _assert_race_margin(weights, keys, positions, tag)
    tokens = race(weights, keys, positions, tag, block=128)
    assert torch.equal(tokens, race_reference(weights, keys, positions, tag))
    assert int(tokens[5]) == 123 and bool((weights.gather(1, tokens[:, None]) > 0).all())


def _topk_batch(vocab, ns, seed):
    """Rows for the top-k candidate path, with ``ns`` the row's sub-tile maxima
    (`topk_bound_tiles`): greedy; top-k 1, 20, ``ns`` (the largest k the bound covers) and
    ``ns`` + 1 (the full search); Qwen2.5's card (0.7, top-k 20, top-p 0.8) with min-p; top-p
    alone; plain; and two rows of logits on a grid of 3 x vocab / ns values (groups of about
    ns / 3 equal entries), one with k = 5 inside the top value's group, the other with k five
    past it, inside the second's: thresholds in a tie, the first at the bound itself."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(10, vocab, generator=g) * 4).bfloat16().float()
    logits[8:] = torch.randint(0, 3 * vocab // ns, (2, vocab), generator=g) * 0.25 - 12
    top = int((logits[9] == logits[9].max()).sum())
    rows = [  # temperature, top-k, top-p, min-p
        (0.0, 20, 1.0, 0.0), (0.7, 1, 1.0, 0.0), (0.7, 20, 1.0, 0.0), (1.0, ns, 1.0, 0.0),
        (1.0, ns + 1, 1.0, 0.0), (0.7, 20, 0.8, 0.05), (1.0, vocab, 0.9, 0.0), (1.2, vocab, 1.0, 0.0),
        (1.3, 5, 1.0, 0.0), (0.9, top + 5, 0.95, 0.02)]
    params = torch.tensor(rows).T.contiguous()
    keys = torch.tensor([stream_key(seed * 100 + i) for i in range(10)])
    positions = torch.randint(0, 1 << 20, (10,), generator=g)
    return [t.to(DEVICE) for t in (logits, params, keys, positions)]


def _candidate_count(x, k, sub):
    """How many entries of the scaled row x the kernel compacts for top-k: those at or above the
    k-th largest maximum of its sub-tiles of ``sub`` columns (the last one padded with -inf)."""
    pad = torch.full((-len(x) % sub,), float("-inf"), device=x.device)
    maxima = torch.cat([x, pad]).view(-1, sub).max(dim=1).values
    return int((x >= maxima.sort(descending=True).values[k - 1]).sum())


@pytest.mark.parametrize("vocab,block", [(3000, 256), (20000, 2048)])
@pytest.mark.parametrize("topk_candidates", [True, False])
def test_topk_rows_over_many_tiles_match_the_reference(vocab, block, topk_candidates):
    ns = topk_bound_tiles(vocab, block)
    logits, params, keys, positions = _topk_batch(vocab, ns, seed=vocab)
    n_c = torch.full((10,), -1, dtype=torch.int32, device=DEVICE)
    probs, tokens = sample_rows(logits, params, keys, positions, TOKEN, block=block,
                                topk_candidates=topk_candidates, candidates=n_c)
    ref_probs, ref_tokens = sample_rows_reference(logits, params, keys, positions, TOKEN)
    assert torch.equal(probs > 0, ref_probs > 0)
    torch.testing.assert_close(probs, ref_probs, atol=1e-6, rtol=0)
    _assert_race_margin(ref_probs, keys, positions, TOKEN)
    assert torch.equal(tokens, ref_tokens)
    kept = (probs > 0).sum(dim=-1).tolist()
    assert kept[0] == 1 and kept[7] == vocab and min(kept[1:6]) >= 1
    ranks = [(logits[r] >= logits[r].unique().flip(0)[:2, None]).sum(dim=-1) for r in (8, 9)]
    assert kept[8] == ranks[0][0] > 5 and kept[9] == ranks[1][1] > params[1, 9]  # tie groups whole
    # Which rows compacted candidates, and how many: top-p rows always; top-k rows with
    # k <= ns only on the candidate path, exactly the entries at or above the bound.
    n_c = n_c.tolist()
    assert n_c[0] == 0 and n_c[4] == 0 and n_c[7] == 0 and n_c[6] > 0
    for row in (1, 2, 3, 5, 8, 9):
        if topk_candidates:
            x = logits[row] / params[0, row]
            assert n_c[row] == _candidate_count(x, int(params[1, row]), block // 16) >= kept[row]
            assert n_c[row] < vocab // 4 or row == 3     # k = ns: the bound is the least max
        else:
            assert (n_c[row] > 0) == bool(params[2, row] < 1)


def test_topk_bound_tiles_counts_sub_tiles_of_a_sixteenth_of_the_block():
    assert topk_bound_tiles(151936, 4096) == 594      # Qwen2.5: top-k up to 594 takes candidates
    assert topk_bound_tiles(3000, 256) == 188 and topk_bound_tiles(13, 16) == 13
    assert topk_bound_tiles(100, 8) == 100           # a block below 16 columns: one-column sub-tiles
