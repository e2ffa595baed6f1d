"""Speculative rejection sampling: exact fixed-probability cases, greedy matching, seeding, and a
statistical check (after vLLM's test_rejection_sampling_approximates_target_distribution) that the
emitted tokens follow the target distribution, not the draft's."""
import pytest
import torch

from vegas_core.rejection import RejectionResult, rejection_sample
from vegas_core.sampling import make_generator


def one_hot(*tokens, vocab=5):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_all_accepted_gives_bonus_from_last_row():
    q = torch.full((2, 5), 0.2)                     # p(d)/q(d) = 5 >= 1: certain accept
    p = one_hot(1, 3, 4)
    r = rejection_sample([1, 3], q, p, make_generator(0, "cpu"), greedy=False)
    assert r == RejectionResult(num_accepted=2, tokens=[1, 3, 4], bonus=True,
                                draft_probs=pytest.approx([0.2, 0.2]), target_probs=[1.0, 1.0])


def test_reject_at_position_1_resamples_from_residual():
    q = torch.tensor([[0.2] * 5, [0.0, 0.5, 0.5, 0.0, 0.0]])
    p = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0],    # accepts draft 1
                      [0.0, 0.5, 0.0, 0.5, 0.0],    # p(2) = 0: certain reject; max(0, p - q) is one-hot at 3
                      [1.0, 0.0, 0.0, 0.0, 0.0]])
    for seed in range(5):
        r = rejection_sample(torch.tensor([1, 2]), q, p, make_generator(seed, "cpu"), greedy=False)
        assert (r.num_accepted, r.tokens, r.bonus) == (1, [1, 3], False)
        assert r.draft_probs == pytest.approx([0.2, 0.5]) and r.target_probs == [1.0, 0.0]


def test_reject_at_position_0_and_zero_residual_falls_back_to_target():
    # p == q, both one-hot at 3, but the draft is 2: p(2) = q(2) = 0 rejects and the residual is all zero.
    q = one_hot(3, 0)
    p = one_hot(3, 0, 0)
    r = rejection_sample([2, 0], q, p, None, greedy=False)
    assert (r.num_accepted, r.tokens, r.bonus) == (0, [3], False)


def test_k_zero_is_a_plain_decode_token():
    r = rejection_sample([], torch.empty(0, 5), one_hot(4), make_generator(0, "cpu"), greedy=False)
    assert r == RejectionResult(num_accepted=0, tokens=[4], bonus=False, draft_probs=[], target_probs=[])
    r = rejection_sample([], torch.empty(0, 5), torch.full((1, 5), 0.2), None, greedy=True)
    assert r.tokens == [0] and not r.bonus


def test_greedy_argmax_matching():
    q = one_hot(1, 2, 3)                              # reported, not used for the decision
    p = torch.tensor([[0.1, 0.6, 0.1, 0.1, 0.1],
                      [0.1, 0.1, 0.5, 0.2, 0.1],
                      [0.1, 0.1, 0.1, 0.1, 0.6],
                      [0.0, 0.3, 0.3, 0.4, 0.0]])
    r = rejection_sample([1, 2, 3], q, p, None, greedy=True)      # d2 = 3 but argmax p2 = 4
    assert (r.num_accepted, r.tokens, r.bonus) == (2, [1, 2, 4], False)
    assert r.draft_probs == [1.0, 1.0, 1.0] and r.target_probs == pytest.approx([0.6, 0.5, 0.1])
    r = rejection_sample([1, 2, 4], one_hot(1, 2, 4), p, None, greedy=True)
    assert (r.num_accepted, r.tokens, r.bonus) == (3, [1, 2, 4, 3], True)
    r = rejection_sample([0, 2, 4], q, p, None, greedy=True)
    assert (r.num_accepted, r.tokens, r.bonus) == (0, [1], False)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        rejection_sample([1, 2], torch.full((2, 5), 0.2), torch.full((2, 5), 0.2), None, greedy=False)


def test_seeded_runs_repeat_exactly():
    g = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(3, 6, generator=g), -1)
    p = torch.softmax(torch.randn(4, 6, generator=g), -1)
    drafts = torch.multinomial(q, 1, generator=g).view(-1).tolist()
    def run(seed):
        gen = make_generator(seed, "cpu")
        return [rejection_sample(drafts, q, p, gen, greedy=False) for _ in range(30)]
    assert run(5) == run(5) and run(5) != run(6)


def test_emitted_tokens_follow_target_not_draft(one_thread):
    vocab, k, n_max = 8, 2, 100_000
    g = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(k + 1, vocab, generator=g), -1)   # a different p per position
    draft = torch.softmax(3 * torch.randn(k, vocab, generator=g), -1)    # a poor, peaky q
    drafts = torch.stack([torch.multinomial(draft[i], n_max, replacement=True, generator=g)
                          for i in range(k)], dim=1).tolist()
    gen = make_generator(1, "cpu")
    outputs = [rejection_sample(d, draft, target, gen, greedy=False).tokens for d in drafts]

    # Output position j exists when j drafts were accepted; whatever came before, it is distributed as p_j.
    sizes = [100, 1_000, 10_000, n_max]
    for j in range(k + 1):
        reference = draft[min(j, k - 1)]
        dist_target, dist_draft = [], []
        for n in sizes:
            tokens = torch.tensor([t[j] for t in outputs[:n] if len(t) > j])
            empirical = torch.bincount(tokens, minlength=vocab).float() / len(tokens)
            dist_target.append(torch.dist(empirical, target[j]).item())
            dist_draft.append(torch.dist(empirical, reference).item())
        assert all(a > b for a, b in zip(dist_target, dist_target[1:])), (j, dist_target)
        assert dist_target[-1] < dist_draft[-1] / 30, (j, dist_target, dist_draft)
        assert dist_target[-1] < dist_target[0] / 10, (j, dist_target)

    # First-draft acceptance rate is sum_x min(p_0(x), q_0(x)) = 1 - TV(p_0, q_0).
    accept_rate = sum(len(t) > 1 for t in outputs) / n_max
    assert accept_rate == pytest.approx(torch.minimum(target[0], draft[0]).sum().item(), abs=0.01)


def test_engine_greedy_fast_path_equals_rejection_sampler():
    """The engine's batched greedy acceptance (argmax per row, read once for the batch) gives what
    `rejection_sample` gives with one-hot distributions, accepted prefix, correction and bonus alike."""
    from vegas_core.acceptance import accept_greedy
    from vegas_core.sampling import SamplingParams, logits_to_probs

    g = torch.Generator().manual_seed(5)
    for trial in range(40):
        k = trial % 5
        logits = torch.randn(k + 1, 11, generator=g)
        targets = logits.argmax(dim=-1).tolist()
        # drafts agree with the target for a random prefix, then (sometimes) differ
        agree = int(torch.randint(0, k + 1, (1,), generator=g))
        drafts = [targets[i] if i < agree else (targets[i] + 1) % 11 for i in range(k)]
        got = accept_greedy(drafts, targets, None)
        p = logits_to_probs(logits, [SamplingParams()] * (k + 1))
        q = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long), 11).float() if k else torch.zeros(0, 11)
        want = rejection_sample(drafts, q, p, None, greedy=True)
        assert (got.num_accepted, got.tokens, got.bonus) == (want.num_accepted, want.tokens, want.bonus)
        assert got.draft_probs == want.draft_probs and got.target_probs == want.target_probs


def test_greedy_accept_batch_matches_rejection_sample_per_request():
    """The batched device form gives each request what greedy `rejection_sample` gives it:
    ragged draft counts (0 to 5, drafts past a request's count ignored), every prefix length."""
    from vegas_core.rejection import greedy_accept_batch
    g = torch.Generator().manual_seed(0)
    vocab, counts = 6, [3, 0, 5, 2, 5, 1, 4]
    steps = max(counts)
    logits = [torch.randn(k + 1, vocab, generator=g) for k in counts]
    targets = [lg.argmax(-1) for lg in logits]
    drafts = torch.randint(0, vocab, (steps, len(counts)), generator=g)
    for i, k in enumerate(counts):       # agree with the target for a random prefix, then maybe not
        agree = int(torch.randint(0, k + 1, (1,), generator=g))
        drafts[:agree, i] = targets[i][:agree]
    qloc = torch.tensor([0] + [k + 1 for k in counts]).cumsum(0)
    accepted, nxt = greedy_accept_batch(drafts, torch.cat(targets), qloc)
    for i, k in enumerate(counts):
        ref = rejection_sample(drafts[:k, i].tolist(), torch.zeros(k, vocab), logits[i].softmax(-1), None, True)
        assert int(accepted[i]) == ref.num_accepted and int(nxt[i]) == ref.tokens[-1], i
    assert sorted(set(accepted.tolist())) != [0]     # some drafts were accepted


def _batch_case(drafts_rows, draft, target, counts, seed=0):
    """Inputs of `rejection_sample_batch` for n requests sharing per-position q and p."""
    from vegas_core.random_streams import stream_key
    n, width = len(drafts_rows), draft.shape[0]
    drafts = torch.tensor(drafts_rows, dtype=torch.long).view(n, width)
    counts_t = torch.tensor(counts)
    qprobs = draft[None].expand(n, -1, -1)
    rows = [target[:k + 1] for k in counts]
    qloc = torch.tensor([0] + [k + 1 for k in counts]).cumsum(0)
    keys = torch.tensor([stream_key(seed * 1_000_003 + i) for i in range(n)])
    return drafts, counts_t, qprobs, torch.cat(rows), qloc, keys, torch.full((n,), 7)


def test_batched_rejection_follows_the_target_not_the_draft(one_thread):
    """The batched sampler's emitted tokens, over 100,000 requests with their own streams, follow
    p at every output position, and the first draft is accepted at rate 1 - TV(p_0, q_0)."""
    from vegas_core.random_streams import DRAFT, uniforms
    from vegas_core.rejection import rejection_sample_batch
    from vegas_core.sampling import sample_keyed
    vocab, k, n = 8, 2, 100_000
    g = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(k + 1, vocab, generator=g), -1)
    draft = torch.softmax(3 * torch.randn(k, vocab, generator=g), -1)
    from vegas_core.random_streams import stream_key
    keys = torch.tensor([stream_key(i) for i in range(n)])
    drafts = torch.stack([sample_keyed(draft[i].expand(n, -1), keys, torch.full((n,), 7 + i), DRAFT)
                          for i in range(k)], dim=1)
    qloc = torch.arange(0, n * (k + 1) + 1, k + 1)
    accepted, token, q_d, p_d = rejection_sample_batch(
        drafts, torch.full((n,), k), draft[None].expand(n, -1, -1), target.repeat(n, 1), qloc, keys,
        torch.full((n,), 7))
    outputs = [drafts[i, :a].tolist() + [t] for i, (a, t) in enumerate(zip(accepted.tolist(), token.tolist()))]
    for j in range(k + 1):
        tokens = torch.tensor([t[j] for t in outputs if len(t) > j])
        empirical = torch.bincount(tokens, minlength=vocab).float() / len(tokens)
        reference = draft[min(j, k - 1)]
        # ~1/sqrt(samples) noise: the fewest samples (position 2) still number in the thousands.
        assert torch.dist(empirical, target[j]) < 4 * (vocab / len(tokens)) ** 0.5, j
        assert torch.dist(empirical, target[j]) < torch.dist(empirical, reference) / 5, j
    accept_rate = float((accepted >= 1).float().mean())
    assert accept_rate == pytest.approx(torch.minimum(target[0], draft[0]).sum().item(), abs=0.01)
    assert torch.equal(q_d, draft[[0, 1], drafts].float()) and torch.equal(p_d, target[[0, 1], drafts])
    assert uniforms(keys[:3], torch.full((3,), 7), DRAFT, 1).shape == (3, 1)


def test_batched_rejection_ragged_greedy_and_repeatable():
    """Ragged counts (0 drafts: a plain sample of p_0), one-hot rows that must act greedily, and
    the same keys giving the same result; a different key set gives a different one."""
    from vegas_core.rejection import rejection_sample_batch
    g = torch.Generator().manual_seed(2)
    vocab, width = 6, 3
    counts = [3, 0, 2, 3, 1]
    target = torch.softmax(torch.randn(width + 1, vocab, generator=g), -1)
    draft = torch.softmax(torch.randn(width, vocab, generator=g), -1)
    rows = torch.randint(0, vocab, (len(counts), width), generator=g).tolist()
    case = _batch_case(rows, draft, target, counts)
    first = rejection_sample_batch(*case)
    again = rejection_sample_batch(*case)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    accepted = first[0]
    assert (accepted <= torch.tensor(counts)).all() and int(accepted[1]) == 0
    assert (first[2][1] == 0).all() and (first[2][4, 1:] == 0).all()      # padding columns are 0
    others = [rejection_sample_batch(*_batch_case(rows, draft, target, counts, seed=s))[1] for s in range(1, 9)]
    assert any(not torch.equal(first[1], o) for o in others)
    # One-hot q and p: argmax matching, as greedy_accept_batch gives it.
    from vegas_core.rejection import greedy_accept_batch
    oh = lambda t: torch.nn.functional.one_hot(t, vocab).float()          # noqa: E731
    tgt = torch.randint(0, vocab, (int(sum(counts)) + len(counts),), generator=g)
    qloc = torch.tensor([0] + [k + 1 for k in counts]).cumsum(0)
    drafts = torch.randint(0, vocab, (len(counts), width), generator=g)
    for i, k in enumerate(counts):                  # agree for a prefix, then maybe not
        drafts[i, :k - 1 if k > 1 else 0] = tgt[qloc[i]:qloc[i] + max(k - 1, 0)]
    accepted, token, _, _ = rejection_sample_batch(drafts, torch.tensor(counts), oh(drafts), oh(tgt), qloc,
                                                   case[5], case[6])
    want_acc, want_tok = greedy_accept_batch(drafts.t(), tgt, qloc)
    assert torch.equal(accepted, want_acc) and torch.equal(token, want_tok)
    assert int(accepted.max()) >= 1
