"""After any mix of accepts and rejects the KV cache holds exactly what a vanilla run over the same
tokens holds: rejected drafts leave nothing behind."""
import torch

from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams


def _cache(core, req, n):
    r = core.runner
    return [(r.keys(layer, core.allocator, req.request_id, 0, n), r.values(layer, core.allocator, req.request_id, 0, n))
            for layer in range(core.config.num_layers)]


def test_cache_after_rejections_equals_vanilla(engine):
    core = engine.core
    prompt = engine.encode_prompt("Write a limerick about a cat who learns to code.", chat=True)
    sampling = SamplingParams(max_tokens=60, ignore_eos=True)
    spec = core.add_request(prompt, sampling, SpecParams(method="vegas", gamma=6, sparsity=0.03, min_budget=4))
    while True:
        core.step()
        its = [it for it in spec.iterations if it["drafts"]]
        rejected = sum(len(it["drafts"]) - it["num_accepted"] for it in its)
        accepted = sum(it["num_accepted"] for it in its)
        if len(its) >= 4 and rejected and accepted:
            break
    n = spec.num_cached
    # Pages past the verified prefix were given back.
    assert len(core.allocator.block_table(spec.request_id)) == core.allocator.blocks_needed(n)
    spec_cache, spec_tokens = _cache(core, spec, n), list(spec.token_ids)
    core.abort(spec.request_id)
    van = core.add_request(prompt, sampling, SpecParams(method="vanilla"))
    while van.num_cached < n:
        core.step()
    assert van.num_cached == n and van.token_ids[: n + 1] == spec_tokens[: n + 1]
    for (ks, vs), (kv, vv) in zip(spec_cache, _cache(core, van, n)):
        torch.testing.assert_close(ks, kv, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(vs, vv, atol=1e-4, rtol=1e-4)
    core.abort(van.request_id)
    assert core.allocator.num_free == core.allocator.num_blocks
