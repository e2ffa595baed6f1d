"""Selection correctness against brute force (issue 3)."""
import math

import pytest
import torch

from vegas_core.attention import AttentionMetadata, LogitCollector, ReferenceBackend, SeqAttention
from vegas_core.config import ModelConfig
from vegas_core.kv_cache import KVPool
from vegas_core.spec.select import (quest_page_bounds, quest_scores, quest_select, select_from_logits,
                                    stream_positions)


def _pool(ctx, heads, kvh, d, block=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(arch="llama", vocab_size=10, hidden_size=heads * d, intermediate_size=8, num_layers=1,
                      num_heads=heads, num_kv_heads=kvh, head_dim=d, max_position_embeddings=4096)
    blocks = -(-ctx // block) + 3
    pool = KVPool(cfg, blocks, block, torch.float32, "cpu")
    # a shuffled block table: pages need not be contiguous
    table = torch.randperm(blocks, generator=g)[: -(-ctx // block)]
    pos = torch.arange(ctx)
    slots = table[pos // block] * block + pos % block
    keys = torch.randn(ctx, kvh, d, generator=g)
    vals = torch.randn(ctx, kvh, d, generator=g)
    return pool, slots, keys, vals, g


@pytest.mark.parametrize("granularity", ["layer", "kv-head"])
@pytest.mark.parametrize("heads,kvh", [(9, 3), (8, 8), (8, 1)])
def test_vegas_selection_equals_brute_force(granularity, heads, kvh):
    d, rows, ctx = 16, 5, 203           # verification of 4 drafts over a 198-token prefix
    base, k = ctx - rows, 37
    pool, slots, keys, vals, g = _pool(ctx, heads, kvh, d)
    pool.write(0, slots[:base], keys[:base], vals[:base])
    q = torch.randn(rows, heads, d, generator=g)
    scale = d ** -0.5
    collector = LogitCollector()
    meta = AttentionMetadata(slot_mapping=slots[base:], collector=collector,
                             seqs=[SeqAttention(0, rows, slots, collect_rows=[0, rows - 1], collect_upto=base)])
    ReferenceBackend(scale).forward(0, q, keys[base:], vals[base:], pool, meta)
    got = select_from_logits(collector.logits[0][0], collector.lse[0][0], k, kvh, granularity)

    # Brute force: explicit softmax per (row, head) over the keys that row may see.
    group = heads // kvh
    weights = torch.zeros(2, heads, base, dtype=torch.float64)
    for ri, r in enumerate([0, rows - 1]):
        visible = base + r + 1
        for h in range(heads):
            s = torch.tensor([float(q[r, h].double() @ keys[j, h // group].double()) * scale for j in range(visible)])
            p = torch.exp(s - s.max())
            weights[ri, h] = (p / p.sum())[:base]
    if granularity == "layer":
        want = [set(torch.topk(weights.mean((0, 1)), k).indices.tolist())]
    else:
        per = weights.view(2, kvh, group, base).mean((0, 2))
        want = [set(torch.topk(per[h], k).indices.tolist()) for h in range(kvh)]
    assert got.shape == (len(want), k)
    assert [set(row.tolist()) for row in got] == want
    assert torch.all(got[:, 1:] > got[:, :-1])   # sorted, unique


def test_collecting_does_not_change_attention_output():
    heads, kvh, d, rows, ctx = 9, 3, 16, 7, 100
    pool, slots, keys, vals, g = _pool(ctx, heads, kvh, d, seed=1)
    base = ctx - rows
    pool.write(0, slots[:base], keys[:base], vals[:base])
    q = torch.randn(rows, heads, d, generator=g)
    outs = []
    for collect in (None, [0, rows - 1]):
        meta = AttentionMetadata(slot_mapping=slots[base:], collector=LogitCollector(),
                                 seqs=[SeqAttention(0, rows, slots, collect_rows=collect, collect_upto=base)])
        outs.append(ReferenceBackend(d ** -0.5).forward(0, q, keys[base:], vals[base:], pool, meta))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_quest_scores_equal_upper_bound_formula():
    g = torch.Generator().manual_seed(2)
    heads, kvh, d, page, n = 6, 2, 8, 16, 100
    keys = torch.randn(n, kvh, d, generator=g)
    q = torch.randn(heads, d, generator=g)
    kmin, kmax = quest_page_bounds(keys, page)
    assert kmin.shape == (n // page, kvh, d)
    scores = quest_scores(q, kmin, kmax)
    group = heads // kvh
    for h in range(heads):
        for pg in range(n // page):
            block = keys[pg * page:(pg + 1) * page, h // group]
            lo, hi = block.min(0).values, block.max(0).values
            bound = sum(max(float(q[h, i] * hi[i]), float(q[h, i] * lo[i])) for i in range(d))
            assert math.isclose(float(scores[h, pg]), bound, rel_tol=1e-5, abs_tol=1e-5)
            # and it is an upper bound of every real q.k in the page
            assert float((block @ q[h]).max()) <= bound + 1e-5


def test_quest_select_keeps_top_pages_and_the_partial_page():
    g = torch.Generator().manual_seed(3)
    heads, kvh, d, page, base = 4, 2, 8, 16, 90
    keys = torch.randn(base, kvh, d, generator=g)
    q = torch.randn(heads, d, generator=g)
    kmin, kmax = quest_page_bounds(keys, page)
    pos = quest_select(q, kmin, kmax, k=32, base=base, page_size=page, granularity="layer")
    best = torch.topk(quest_scores(q, kmin, kmax).sum(0), 2).indices.sort().values
    want = torch.cat([torch.arange(p * page, (p + 1) * page) for p in best.tolist()] + [torch.arange(80, 90)])
    assert pos.tolist() == [want.tolist()]
    per_head = quest_select(q, kmin, kmax, k=32, base=base, page_size=page, granularity="kv-head")
    assert per_head.shape == (kvh, 2 * page + 10)


def test_stream_is_exactly_sink_plus_window():
    assert stream_positions(base=1000, k=70, sink=4).tolist() == [list(range(4)) + list(range(934, 1000))]
    assert stream_positions(base=10, k=10, sink=4).tolist() == [list(range(10))]
    assert stream_positions(base=0, k=0, sink=4).shape == (1, 0)
    # The batched device form gives the same rows (padding 0 past each budget).
    from vegas_core.spec.select import stream_indices
    t = lambda xs: torch.tensor(xs)  # noqa: E731
    got = stream_indices(t([1000, 10, 0, 7]), t([70, 10, 0, 3]), t([4, 4, 4, 4]), 70)
    for row, (b, k) in zip(got.tolist(), [(1000, 70), (10, 10), (0, 0), (7, 3)]):
        assert row[:k] == stream_positions(base=b, k=k, sink=4).tolist()[0] and row[k:] == [0] * (70 - k)


def test_empty_and_full_budgets():
    logits = torch.randn(2, 3, 10)
    lse = torch.logsumexp(logits, -1) + 1.0
    assert select_from_logits(logits, lse, 10, 3, "layer").tolist() == [list(range(10))]
    assert select_from_logits(logits, lse, 0, 3, "kv-head").shape == (3, 0)
    assert select_from_logits(logits[:, :, :0], lse, 0, 3, "layer").shape == (1, 0)
