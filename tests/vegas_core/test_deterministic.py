"""The batch-invariant mode (`EngineOptions(deterministic=True)`) on the kernel path, in bf16 (the
GPU's dtype), under Triton's interpreter with its `tl.dot` run row by row as tensor cores run it
(`tests.row_dot`).

- A position's logits, and the K/V it writes, are the same bits whether it is the last row of a
  prefill (in one chunk, or in two chunks beside other requests), a one-row decode step, or one
  of 17 rows of a verification in a batch.
- Every method's greedy output equals vanilla's, through the CUDA-graph path's static buffers
  (`cuda_graphs="static"`: what a GPU replays, without capturing).
- A seeded sampled request gives the same tokens alone and in a batch, vanilla and Vegas.
- An `InvariantConfig` read from a `bench invariant` result reaches the kernels (a tuned launch
  with row chunks, small splits and the fused merge keeps the first point's promise too).

A tiny 2-layer Llama with SmolLM2's GQA ratio (6 query heads, 2 KV heads). The kernels' own rows
are checked in tests/vegas_core/kernels/test_batch_invariance.py.
"""
import dataclasses
import json
import os

import pytest
import torch

import vegas_core.kernels.verify_attention as va
from tests.engine_helpers import run_forked
from tests.row_dot import row_by_row_dot
from vegas_core.block_manager import BlockAllocator
from vegas_core.engine_core import EngineCore
from vegas_core.errors import InvalidRequestError
from vegas_core.loader import load_model
from vegas_core.model_runner import BatchEntry, ModelRunner
from vegas_core.options import EngineOptions, InvariantConfig, KernelOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

GPU = os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
GRAPHS = "auto" if GPU else "static"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


# A tuned launch as `bench invariant` could propose it for the tiny model (6 / 2 heads of 16):
# a 16-row tile (5 rows a program: verifications and prefill pieces in row chunks), 16-key tiles
# and 32-key splits (the 62-token contexts cross both), the fused merge, page prefetch.
TUNED = InvariantConfig(block_m=16, block_n=16, split_keys=32, fused_merge=True, page_ahead=1,
                        num_stages=3, linear=(((160, 96, False), (16, 64, 64, 4, 3)),),
                        head=(64, 256, 64, 8, 3))


def _bench_result(path, config: InvariantConfig) -> str:
    """A `bench invariant` result file holding `config` for the tiny model's shape beside another."""
    doc = {"best": {"qwen2.5-0.5b": {"shape": dict(heads=14, kv_heads=2, head_dim=64),
                                     "config": InvariantConfig(block_m=32).to_dict()},
                    "tiny": {"shape": dict(heads=6, kv_heads=2, head_dim=16), "config": config.to_dict()}}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_an_invariant_config_round_trips_through_json(tmp_path):
    loaded = InvariantConfig.from_file(_bench_result(tmp_path / "inv.json", TUNED), 6, 2, 16)
    assert loaded == TUNED and loaded.source.endswith("inv.json#tiny")
    assert loaded.linear_table() == {(160, 96, False): (16, 64, 64, 4, 3)}
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(TUNED.to_dict()))
    assert InvariantConfig.from_file(str(bare), 6, 2, 16) == TUNED
    assert InvariantConfig.from_dict(InvariantConfig().to_dict()) == InvariantConfig()
    with pytest.raises(InvalidRequestError, match="no invariant configuration for 9 query heads"):
        InvariantConfig.from_file(str(tmp_path / "inv.json"), 9, 3, 64)
    for bad in (dict(block_m=24), dict(num_warps=3), dict(page_ahead=3), dict(fused_merge=1),
                dict(linear={"96x96": [16, 16, 16, 4]}), dict(linear={"big": [16, 16, 16, 4, 3]})):
        with pytest.raises(InvalidRequestError):
            InvariantConfig.from_dict(dict(TUNED.to_dict(), **bad))
    with pytest.raises(InvalidRequestError, match="unknown invariant configuration fields"):
        InvariantConfig.from_dict({"block_k": 16})
    with pytest.raises(InvalidRequestError, match="invariant must be an InvariantConfig"):
        KernelOptions(invariant=TUNED.to_dict())


def test_the_measured_launches_are_the_bench_results_best_and_an_engine_takes_them(tiny, monkeypatch):
    """`MEASURED_INVARIANT` holds what its `bench invariant` file chose for that shape; an engine of
    that shape whose options leave the defaults runs it, and a configuration given is kept."""
    from vegas_core import options as options_mod
    for (heads, kv_heads, dim), (path, values) in options_mod.MEASURED_INVARIANT.items():
        best = InvariantConfig.from_file(os.path.join(ROOT, path), heads, kv_heads, dim)
        assert best == InvariantConfig(**values), path
    c = tiny.config
    monkeypatch.setitem(options_mod.MEASURED_INVARIANT, (c.num_heads, c.num_kv_heads, c.head_dim),
                        ("measured.json", dict(block_m=16, unmasked_tiles=True)))
    core = EngineCore(c, tiny.weights, "cpu", torch.float32, EngineOptions(num_blocks=8, deterministic=True))
    assert core.options.kernels.invariant == InvariantConfig(block_m=16, unmasked_tiles=True)
    assert core.runner.options.kernels.invariant.source == "measured.json"
    given = EngineOptions(num_blocks=8, deterministic=True, kernels=KernelOptions(invariant=TUNED))
    assert EngineCore(c, tiny.weights, "cpu", torch.float32, given).options.kernels.invariant == TUNED


class _Spy:
    """Stands in for a Triton kernel: records each launch's keyword arguments, then runs it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        run = self.kernel[grid]

        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return run(*args, **kwargs)
        return launch


@pytest.mark.parametrize("tuned", [False, True], ids=["default launch", "tuned launch"])
def test_a_position_has_the_same_logits_and_kv_in_any_forward(tiny, tuned, tmp_path, monkeypatch):
    """Sequence 0: a 45-token prompt in one forward, then 16 decode steps, each alone. Sequence 1,
    the same tokens: the prompt in two chunks beside other requests' prefill, then the 17
    positions in one verification between two other requests' rows. Tuned: the launch of a
    `bench invariant` result file, which every attention call then takes."""
    invariant = InvariantConfig.from_file(_bench_result(tmp_path / "inv.json", TUNED), 6, 2, 16) \
        if tuned else InvariantConfig()
    spy = _Spy(va._verify_attention_kernel)
    monkeypatch.setattr(va, "_verify_attention_kernel", spy)
    opts = EngineOptions(block_size=16, num_blocks=64, attention="triton", deterministic=True,
                         cuda_graphs="off", kernels=KernelOptions(invariant=invariant))
    runner = ModelRunner(tiny.config, tiny.weights, torch.device(DEVICE), torch.bfloat16, 64, opts)
    assert runner.model.ops.norm_linear.keywords["table"] == invariant.linear_table()
    assert runner.model.ops.head_config == invariant.head
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
    want = dict(BLOCK_M=16, BLOCK_N=16, FUSED_MERGE=True, PAGE_AHEAD=1, CHUNKED=True) if tuned \
        else dict(BLOCK_M=64, BLOCK_N=128, FUSED_MERGE=False, PAGE_AHEAD=0, CHUNKED=False)
    assert spy.launches and all(kw["num_stages"] == (3 if tuned else 2) for kw in spy.launches)
    for key, value in want.items():
        # a prefill piece folds its splits in the program: no split programs, so nothing to merge
        assert all(kw.get(key, False) == value for kw in spy.launches
                   if key != "FUSED_MERGE" or not kw["SPLIT_SEQ"]), key


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
