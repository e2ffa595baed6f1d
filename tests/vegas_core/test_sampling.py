"""SamplingParams validation, logits_to_probs filters (hand-computed), seeded sampling."""
import math

import pytest
import torch

from vegas_core.errors import InvalidRequestError
from vegas_core.sampling import SamplingParams, logits_to_probs, make_generator, sample_from_probs

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("field,value,range_text", [
    ("temperature", -0.1, ">= 0"), ("temperature", NAN, ">= 0"), ("temperature", INF, "finite"),
    ("temperature", "1", ">= 0"),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_p", -1.0, "(0, 1]"), ("top_p", NAN, "(0, 1]"),
    ("top_k", -2, ">= -1"), ("top_k", 2.5, ">= -1"), ("top_k", True, ">= -1"),
    ("min_p", -0.01, "[0, 1]"), ("min_p", 1.01, "[0, 1]"), ("min_p", NAN, "[0, 1]"),
    ("max_tokens", 0, ">= 1"), ("max_tokens", -5, ">= 1"), ("max_tokens", 3.0, ">= 1"),
    ("stop", "eos", "non-empty strings"), ("stop", ("a", ""), "non-empty strings"),
    ("stop", ("a", 3), "non-empty strings"), ("stop", None, "non-empty strings"),
    ("seed", "42", "[0, 2**64) or None"), ("seed", 1 << 64, "[0, 2**64) or None"),
    ("seed", -1, "[0, 2**64) or None"),
])
def test_bad_params_raise_naming_field_value_and_range(field, value, range_text):
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams(**{field: value})
    msg = str(exc.value)
    assert msg.startswith(field + " ") and repr(value) in msg and range_text in msg


def test_validate_rechecks_after_mutation_and_good_params_pass():
    p = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, min_p=1.0, seed=3, max_tokens=1, stop=["</s>"])
    assert p.stop == ("</s>",) and not p.is_greedy and SamplingParams().is_greedy
    p.top_p = 2.0
    with pytest.raises(InvalidRequestError, match="top_p"):
        p.validate()


def _probs(*values):
    return torch.tensor([values], dtype=torch.float32)


def test_temperature_matches_hand_computation():
    out = logits_to_probs(torch.tensor([[1.0, 2.0, 3.0]]), [SamplingParams(temperature=0.5)])
    e = [math.exp(2.0), math.exp(4.0), math.exp(6.0)]
    assert torch.allclose(out, torch.tensor([[x / sum(e) for x in e]]), atol=1e-6)
    assert out.dtype == torch.float32


def test_top_k_keeps_exactly_k_tokens():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    out = logits_to_probs(logits, [SamplingParams(temperature=1.0, top_k=3)])
    top = logits[0].topk(3).indices
    assert (out > 0).sum() == 3 and set(out[0].nonzero().view(-1).tolist()) == set(top.tolist())
    assert torch.allclose(out[0, top], torch.softmax(logits[0, top], -1))
    # top_k larger than the vocabulary, and 0 / -1, disable the filter
    for k in (0, -1, 500):
        assert (logits_to_probs(logits, [SamplingParams(temperature=1.0, top_k=k)]) > 0).sum() == 50


def test_top_p_keeps_minimal_nucleus():
    # probs 0.05, 0.5, 0.15, 0.3 (shuffled, so the sort is scattered back correctly)
    logits = _probs(0.05, 0.5, 0.15, 0.3).log()
    def run(top_p):
        return logits_to_probs(logits, [SamplingParams(temperature=1.0, top_p=top_p)])[0]
    assert torch.allclose(run(0.4), torch.tensor([0.0, 1.0, 0.0, 0.0]))            # first token alone
    assert torch.allclose(run(0.75), torch.tensor([0.0, 0.625, 0.0, 0.375]))       # 0.5 + 0.3 >= 0.75
    assert torch.allclose(run(0.81), torch.tensor([0.0, 0.5, 0.15, 0.3]) / 0.95)   # needs three
    assert torch.allclose(run(1.0), torch.tensor([0.05, 0.5, 0.15, 0.3]))


def test_min_p_threshold():
    logits = _probs(0.05, 0.5, 0.15, 0.3).log()
    out = logits_to_probs(logits, [SamplingParams(temperature=1.0, min_p=0.25)])[0]  # drop < 0.125
    assert torch.allclose(out, torch.tensor([0.0, 0.5, 0.15, 0.3]) / 0.95)
    out = logits_to_probs(logits, [SamplingParams(temperature=1.0, min_p=1.0)])[0]   # max only
    assert torch.equal(out, torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_greedy_is_one_hot_at_first_argmax():
    out = logits_to_probs(torch.tensor([[1.0, 3.0, 3.0, -2.0]]), [SamplingParams()])
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))


def test_mixed_params_rows_match_single_row_results():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(1)) * 3
    params = [SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=1.3, top_k=5),
              SamplingParams(temperature=1.0, top_p=0.6, min_p=0.05), SamplingParams(temperature=2.0, min_p=0.2)]
    batched = logits_to_probs(logits, params)
    for i, p in enumerate(params):
        assert torch.allclose(batched[i], logits_to_probs(logits[i:i + 1], [p])[0], atol=1e-6)
    assert torch.allclose(batched.sum(-1), torch.ones(5))
    assert batched[0].max() == 1.0 and (batched[2] > 0).sum() == 5 and (batched[1] > 0).sum() == 40


def test_seeded_sampling_repeats_and_seeds_differ():
    probs = torch.full((3, 1000), 1e-3)
    def draws(seeds):
        gens = [make_generator(s, "cpu") for s in seeds]
        return torch.stack([sample_from_probs(probs, gens) for _ in range(20)])
    a = draws([1, 2, 1])
    assert torch.equal(a, draws([1, 2, 1]))
    assert torch.equal(a[:, 0], a[:, 2]) and not torch.equal(a[:, 0], a[:, 1])
    assert make_generator(None, "cpu") is None


def test_sample_from_probs_greedy_rows_and_distribution():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.7, 0.1, 0.1, 0.1]]).repeat(1000, 1)  # rows alternate
    torch.manual_seed(0)
    out = sample_from_probs(probs, [None, make_generator(0, "cpu")] * 1000).view(1000, 2)
    assert (out[:, 0] == 2).all()
    assert abs((out[:, 1] == 0).float().mean().item() - 0.7) < 0.05
    assert torch.equal(sample_from_probs(probs, [None] * 2000).view(1000, 2)[:, 0], out[:, 0])


def test_sample_keyed_races_to_the_weights_and_repeats():
    from vegas_core.random_streams import TOKEN, stream_key
    from vegas_core.sampling import sample_keyed
    n = 40_000
    w = torch.tensor([3.0, 0.0, 1.0, 6.0])                 # unnormalised; token 1 impossible
    keys = torch.tensor([stream_key(i) for i in range(n)])
    pos = torch.zeros(n, dtype=torch.long)
    toks = sample_keyed(w.expand(n, -1), keys, pos, TOKEN)
    freq = torch.bincount(toks, minlength=4).float() / n
    assert freq[1] == 0 and torch.allclose(freq, w / w.sum(), atol=0.01)
    # One stream along positions is as good as many keys.
    toks_pos = sample_keyed(w.expand(n, -1), keys[:1].expand(n), torch.arange(n), TOKEN)
    assert torch.allclose(torch.bincount(toks_pos, minlength=4).float() / n, w / w.sum(), atol=0.01)
    assert torch.equal(sample_keyed(w.expand(n, -1), keys, pos, TOKEN), toks)
    one_hot = torch.nn.functional.one_hot(torch.tensor([2, 0, 3]), 4).float()
    assert sample_keyed(one_hot, keys[:3], pos[:3], TOKEN).tolist() == [2, 0, 3]
    with pytest.raises(ValueError):
        sample_keyed(w.expand(3, -1), keys[:2], pos[:2], TOKEN)

