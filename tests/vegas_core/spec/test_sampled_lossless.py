"""Sampled self-speculative decoding is lossless in distribution, through the engine: over
thousands of requests that differ only in their seed, the tokens that rejection sampling emits
follow the target model's own distribution (computed exactly), although the sparse drafts are
often rejected. (The exact sampler rule is tested alone in test_rejection.py; this checks the
engine's batched wiring: draft distributions, positions, streams.)"""
import pytest
import torch

from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

TEMPERATURE = 0.12
N = 3000


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    from vegas_core.engine import Engine
    from vegas_core.options import EngineOptions
    from vegas_core.loader import load_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", seed=3)
    return Engine(device="cpu", dtype="float32", loaded=load_model(path),
                  options=EngineOptions(max_num_seqs=N, max_prefill_tokens=4096, trace=True))


def _noise_bound(p: torch.Tensor, n: int) -> float:
    """About three times the expected total-variation distance of n draws from p."""
    return 3 * float((p * (1 - p) / n).sqrt().sum()) * (2 / torch.pi) ** 0.5 / 2


@pytest.mark.parametrize("method", ["vegas", "stream"])
def test_sampled_tokens_follow_the_target(tiny_engine, method, one_thread):
    core = tiny_engine.core
    prompt = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(1)).tolist()
    parent = core.add_request(prompt, SamplingParams(max_tokens=1), SpecParams(method="vanilla"))
    while parent.needs_prefill:
        core.step()
    spec = SpecParams(method=method, gamma=3, sparsity=0.05, min_budget=1, sink=1)
    kids = [core.fork(parent, SamplingParams(temperature=TEMPERATURE, seed=i, max_tokens=3, ignore_eos=True),
                      spec) for i in range(N)]
    core.run()
    core.abort(parent.request_id)
    assert core.allocator.num_free == core.allocator.num_blocks

    def target(ids):
        return torch.softmax(core.next_token_logits(ids) / TEMPERATURE, dim=-1)

    # The first token comes from a plain verification (no selection yet): a plain sample.
    first = torch.tensor([k.output_ids[0] for k in kids])
    p1 = target(prompt)
    emp1 = torch.bincount(first, minlength=p1.numel()).float() / N
    assert 0.5 * float((emp1 - p1).abs().sum()) < _noise_bound(p1, N)
    # The second and third come from rejection sampling: check them after the commonest first token.
    top = int(torch.bincount(first).argmax())
    after = [k for k in kids if k.output_ids[0] == top]
    p2 = target(prompt + [top])
    emp2 = torch.bincount(torch.tensor([k.output_ids[1] for k in after]), minlength=p2.numel()).float() / len(after)
    tv2 = 0.5 * float((emp2 - p2).abs().sum())
    assert len(after) > 300 and tv2 < _noise_bound(p2, len(after)), (len(after), tv2)
    # Drafts were sparse and often wrong: always accepting them would have drawn from q instead.
    drafted = [it for k in kids for it in k.iterations if it["drafts"]]
    rate = sum(it["num_accepted"] for it in drafted) / sum(len(it["drafts"]) for it in drafted)
    assert drafted and rate < 0.9, rate
    # A request's tokens depend on its seed alone: the same seeds again give the same tokens.
    again = [core.fork(parent, SamplingParams(temperature=TEMPERATURE, seed=i, max_tokens=3, ignore_eos=True),
                       spec) for i in range(0, N, 300)] if not parent.finished else []
    core.run()
    assert all(a.output_ids == kids[i * 300].output_ids for i, a in enumerate(again))
