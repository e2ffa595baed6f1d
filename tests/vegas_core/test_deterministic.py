"""The batch-invariant mode (`EngineOptions(deterministic=True)`) on the kernel path, in bf16 (the
GPU's dtype), under Triton's interpreter with its `tl.dot` run row by row as tensor cores run it
(`tests.row_dot`).

- A position's logits, and the K/V it writes, are the same bits whether it is the last row of a
  prefill (in one chunk, or in two chunks beside other requests), a one-row decode step, or one
  of 17 rows of a verification in a batch.
- Every method's greedy output equals vanilla's, through the CUDA-graph path's static buffers
  (`cuda_graphs="static"`: what a GPU replays, without capturing).
- A seeded sampled request gives the same tokens alone and in a batch, vanilla and Vegas.

A tiny 2-layer Llama with SmolLM2's GQA ratio (6 query heads, 2 KV heads). The kernels' own rows
are checked in tests/vegas_core/kernels/test_batch_invariance.py.
"""
import dataclasses
import os

import pytest
import torch

from tests.engine_helpers import run_forked
from tests.row_dot import row_by_row_dot
from vegas_core.block_manager import BlockAllocator
from vegas_core.engine_core import EngineCore
from vegas_core.errors import InvalidRequestError
from vegas_core.loader import load_model
from vegas_core.model_runner import BatchEntry, ModelRunner
from vegas_core.options import EngineOptions, KernelOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

GPU = os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
GRAPHS = "auto" if GPU else "static"
METHODS = ("stream", "quest", "specextend", "vegas", "vegas-all")


@pytest.fixture(autouse=True)
def _row_dot():
    if GPU:
        yield
        return
    with row_by_row_dot():
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", seed=3, hidden_size=96,
                                  num_attention_heads=6, num_key_value_heads=2)
    return load_model(path)


def _tokens(n, seed):
    return torch.randint(0, 262, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_option_is_validated_and_reaches_the_kernels():
    with pytest.raises(InvalidRequestError, match="deterministic must be True or False"):
        EngineOptions(deterministic="yes")
    with pytest.raises(InvalidRequestError, match="deterministic must be True or False"):
        KernelOptions(deterministic=1)
    opts = EngineOptions(deterministic=True)
    assert opts.kernels.deterministic
    assert not dataclasses.replace(opts, deterministic=False).kernels.deterministic
    assert not EngineOptions(kernels=KernelOptions(deterministic=True)).kernels.deterministic


def test_a_position_has_the_same_logits_and_kv_in_any_forward(tiny):
    """Sequence 0: a 45-token prompt in one forward, then 16 decode steps, each alone. Sequence 1,
    the same tokens: the prompt in two chunks beside other requests' prefill, then the 17
    positions in one verification between two other requests' rows."""
    opts = EngineOptions(block_size=16, num_blocks=64, attention="triton", deterministic=True,
                         cuda_graphs="off")
    runner = ModelRunner(tiny.config, tiny.weights, torch.device(DEVICE), torch.bfloat16, 64, opts)
    prompt, rows = 45, 17
    seq = _tokens(prompt + rows, seed=0)
    others = [_tokens(n, seed=n) for n in (30, 50, 20)]
    alloc = BlockAllocator(64, 16)
    for sid, n in ((0, prompt + rows), (1, prompt + rows), (2, 31), (3, 50), (4, 20)):
        alloc.ensure(sid, n)
    decoded = [runner.forward([BatchEntry(0, seq[:prompt], 0, logits="last")], alloc)[0]]
    for j in range(prompt, prompt + rows - 1):
        decoded.append(runner.forward([BatchEntry(0, [seq[j]], j, logits="last")], alloc)[0])
    runner.forward([BatchEntry(2, others[0], 0), BatchEntry(1, seq[:20], 0), BatchEntry(3, others[1], 0)],
                   alloc)
    runner.forward([BatchEntry(4, others[2], 0), BatchEntry(1, seq[20:prompt - 1], 20)], alloc)
    verified = runner.forward([BatchEntry(2, [5], 30, logits="all"),
                               BatchEntry(1, seq[prompt - 1:prompt + rows - 1], prompt - 1, logits="all"),
                               BatchEntry(3, others[1][-3:], 47, logits="all")], alloc)[1:1 + rows]
    for j, (a, b) in enumerate(zip(decoded, verified)):
        assert torch.equal(a, b), f"position {prompt - 1 + j}"
    n = prompt + rows - 1
    slots = [runner.slots(alloc, s, 0, n) for s in (0, 1)]
    for layer in range(tiny.config.num_layers):
        k, v = runner.pool.flat(layer)
        assert torch.equal(k[slots[0]], k[slots[1]]) and torch.equal(v[slots[0]], v[slots[1]]), layer


def _core(loaded, **kw):
    opts = EngineOptions(block_size=16, num_blocks=128, max_num_seqs=32, attention="triton",
                         deterministic=True, cuda_graphs=GRAPHS, **kw)
    return EngineCore(loaded.config, loaded.weights, DEVICE, torch.bfloat16, opts)


def test_every_method_equals_vanilla_in_bf16(tiny):
    core = _core(tiny)
    specs = [SpecParams(method=m, gamma=3, sparsity=0.25, min_budget=4) for m in METHODS]
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    parents, children = run_forked(core, [_tokens(n, seed=n) for n in (33, 58)], sampling, specs)
    for spec in specs:
        for parent, child in zip(parents, children[spec]):
            assert child.output_ids == parent.output_ids, spec.method
    assert any(k.kind == "dense" and k.rows > 1 for k in core.runner.graphs.graphs) or GPU


@pytest.mark.parametrize("method", ["vanilla", "vegas"])
def test_seeded_sampling_is_the_same_alone_and_in_a_batch(tiny, method):
    core = _core(tiny)
    spec = SpecParams(method=method, gamma=3, sparsity=0.25, min_budget=4)
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=8, ignore_eos=True)
    prompt = _tokens(40, seed=1)
    alone = core.add_request(prompt, sampling, spec)
    core.run()
    others = [core.add_request(_tokens(n, seed=n), dataclasses.replace(sampling, seed=n), spec)
              for n in (25, 61)]
    batched = core.add_request(prompt, sampling, spec)
    core.run()
    assert batched.output_ids == alone.output_ids
    assert all(r.output_ids != alone.output_ids for r in others)
