"""The engine on the kernel path (Triton under the interpreter, on the CPU) gives the reference
path's tokens for every method and granularity, and its batched selection picks the sets the
per-request reference selection picks.

A tiny 2-layer Llama (4 query heads, 2 KV heads) in float32, so the two paths differ only by
summation order (~1e-6) and the verification logits the kernel path keeps in bf16. Prompts are
longer than the 17 rows the verification kernel takes, so prefill runs the SDPA path; decode,
verification, drafts, selection and Quest run the kernels.
"""
import os

import pytest
import torch

from tests.engine_helpers import run_forked
from vegas_core.engine_core import EngineCore
from vegas_core.options import EngineOptions
from vegas_core.errors import InvalidRequestError
from vegas_core.loader import load_model
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

# tests/conftest.py sets TRITON_INTERPRET=1 unless a GPU run asked for compiled kernels.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"

SPECS = [SpecParams(method="stream", gamma=3, sparsity=0.25, min_budget=4)] + [
    SpecParams(method=m, gamma=3, sparsity=0.25, min_budget=4, granularity=g)
    for m in ("quest", "specextend", "vegas", "vegas-all") for g in ("layer", "kv-head")] + [
    SpecParams(method=m, gamma=3, sparsity=0.25, min_budget=4, record_recall=True) for m in ("vegas", "quest")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", seed=3)
    return load_model(path)


def _core(loaded, attention):
    opts = EngineOptions(block_size=16, num_blocks=256, max_num_seqs=64, trace=True, attention=attention)
    return EngineCore(loaded.config, loaded.weights, DEVICE, torch.float32, opts)


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 262, (n,), generator=g).tolist() for n in (37, 70, 101)]


def test_kernel_path_tokens_and_selections_match_reference(tiny):
    assert _core(tiny, "triton").runner.kernels and not _core(tiny, "reference").runner.kernels
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    runs = {a: run_forked(_core(tiny, a), _prompts(), sampling, SPECS) for a in ("reference", "triton")}
    (ref_parents, ref_children), (k_parents, k_children) = runs["reference"], runs["triton"]
    assert [p.output_ids for p in k_parents] == [p.output_ids for p in ref_parents]
    overlaps = []
    for spec in SPECS:
        for ref, ker, parent in zip(ref_children[spec], k_children[spec], ref_parents):
            assert ker.output_ids == ref.output_ids == parent.output_ids, spec
            # The first speculative iteration selects from the same verification on both paths.
            r_sel = next(it["selection"] for it in ref.iterations if it["selection"])
            k_sel = next(it["selection"] for it in ker.iterations if it["selection"])
            assert (r_sel["base"], r_sel["budget"], r_sel["granularity"]) == \
                   (k_sel["base"], k_sel["budget"], k_sel["granularity"])
            key = "layers" if r_sel["granularity"] == "layer" else "heads"
            overlaps += [_overlap(a, b) for a, b in zip(_flat(r_sel[key]), _flat(k_sel[key]))]
            if spec.record_recall:   # the kernel path records recall too, and the same values
                r_rec = next(it["recall"] for it in ref.iterations if it["recall"])
                k_rec = next(it["recall"] for it in ker.iterations if it["recall"])
                assert len(k_rec) == len(r_rec) == 2 and all(0 < x <= 1 + 1e-6 for x in k_rec)
                assert k_rec == pytest.approx(r_rec, abs=0.05)
    # bf16 logits may swap near-ties at the budget's edge; anything else would be a real difference.
    assert min(overlaps) >= 0.8 and sum(overlaps) / len(overlaps) >= 0.95, overlaps


def _flat(sets):
    return [s for layer in sets for s in (layer if isinstance(layer, list) else [layer])]


def _overlap(a, b) -> float:
    from vegas_core.trace.positions import decode_positions
    a, b = set(decode_positions(a).tolist()), set(decode_positions(b).tolist())
    return len(a & b) / max(1, len(a | b))


def test_quest_page_must_be_a_block_on_the_kernel_path(tiny):
    core = _core(tiny, "triton")
    with pytest.raises(InvalidRequestError, match="page_size must be 16"):
        core.add_request([1, 2, 3], SamplingParams(max_tokens=4), SpecParams(method="quest", page_size=8))


def test_attention_choice_is_checked(tiny):
    with pytest.raises(InvalidRequestError, match="attention must be one of"):
        _core(tiny, "fast")
