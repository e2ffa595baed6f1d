"""`kernels.select_fused`: scoring and selecting in one launch gives exactly the positions of the
two-launch path (`selection_scores(..., packed="bits")` + `radix_topk`), which
tests/kernels/test_select.py checks against torch.topk and the engine's per-request selection.
Exact equality, no tolerance: both compute each position's score with the same per-position
float32 maths and select by the same radix rule (ties to the lower position)."""
import os

import pytest
import torch

from kernels import select_fused
from kernels.select import select_layers

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _case(layers, rows, heads, width, seed, ties: bool):
    """Collected logits [L, R, H, W] with their lse; `ties` draws from a few values, so whole runs
    of positions have exactly equal scores (a greedy model's repeated keys do this)."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        values = torch.tensor([-2.0, 0.0, 0.5, 3.0, float("-inf")])
        logits = values[torch.randint(0, len(values), (layers, rows, heads, width), generator=g)]
        logits[..., 0] = 0.0                    # every (row, head) sees at least one key
    else:
        logits = torch.randn(layers, rows, heads, width, generator=g) * 3
    logits = logits.to(torch.bfloat16)
    lse = torch.logsumexp(logits.float(), dim=-1)
    return logits.to(DEVICE), lse.to(DEVICE)


# (row_start, row_count, bases, budgets): 1, 2 and 17 rows a request; a base of 0 (nothing to
# score), a budget of 0, of 1, of every position below the base, and bases below the width (the
# positions past a base score -inf and are never chosen).
REQUESTS = [
    ([0, 2, 3], [2, 1, 17], [37, 20, 29], [9, 1, 29]),
    ([5, 0, 1, 19], [2, 1, 2, 1], [0, 37, 11, 30], [0, 37, 4, 0]),
]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("granularity, heads, kv_heads", [("layer", 9, 3), ("kv-head", 9, 3),
                                                          ("layer", 8, 1)])
@pytest.mark.parametrize("requests", REQUESTS)
def test_fused_selection_equals_the_two_launch_path(ties, granularity, heads, kv_heads, requests):
    start, count, bases, budgets = requests
    logits, lse = _case(2, 20, heads, 48, seed=len(start) + heads, ties=ties)
    args = (_i32(start), _i32(count), _i32(bases), _i32(budgets), max(budgets), kv_heads, granularity)
    for n_keys in (37, None):          # a width that is not a power of two, and the whole 48
        want = select_layers((logits, lse), *args, n_keys=n_keys, fused=False)
        got = select_layers((logits, lse), *args, n_keys=n_keys, fused=True)
        assert got.shape == want.shape
        assert torch.equal(got, want)
        for b, k in enumerate(budgets):  # padding is 0, the chosen positions ascending and in range
            assert (got[:, b, :, k:] == 0).all()
            chosen = got[:, b, :, :k]
            assert (chosen < bases[b]).all() and (chosen.diff(dim=-1) > 0).all()


def test_the_engines_call_takes_the_fused_launch_only_where_rows_fit(monkeypatch):
    """With FUSED_SELECT on, the engine's call (fused=None) runs the one launch for rows of up to
    MAX_KEYS positions and the two launches for longer ones; insisting on the one launch for long
    rows is an error, not a silent fallback. With it off, never the one launch."""
    import kernels.select

    calls = []
    real = select_fused.select_fused
    monkeypatch.setattr(select_fused, "select_fused", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(select_fused, "MAX_KEYS", 32)
    logits, lse = _case(2, 4, 4, 40, seed=3, ties=False)
    args = (_i32([0, 2]), _i32([2, 2]), _i32([30, 25]), _i32([7, 3]), 7, 2, "kv-head")
    monkeypatch.setattr(kernels.select, "FUSED_SELECT", True)
    want = select_layers((logits, lse), *args, fused=False)
    assert torch.equal(select_layers((logits, lse), *args), want) and calls == []     # 40 > 32
    assert torch.equal(select_layers((logits, lse), *args, n_keys=32), want) and calls == [1]
    with pytest.raises(ValueError, match="32 positions"):
        select_layers((logits, lse), *args, fused=True)
    calls.clear()
    monkeypatch.setattr(kernels.select, "FUSED_SELECT", False)
    assert torch.equal(select_layers((logits, lse), *args, n_keys=32), want) and calls == []
