"""The engine on the kernel path (Triton under the interpreter, on the CPU) gives the reference
path's tokens for every method and granularity, and its batched selection picks the sets the
per-request reference selection picks.

A tiny 2-layer Llama (4 query heads, 2 KV heads) in float32, so the two paths differ only by
summation order (~1e-6) and the verification logits the kernel path keeps in bf16. Prompts are
longer than the 17 rows the verification kernel takes, so prefill runs in pieces of the
verification kernel (their contexts are under `PIECES_MAX_CONTEXT`; `prefill_route` also sends them
to the reference's SDPA); decode, verification, drafts, selection and Quest run the kernels.
"""
import os

import pytest
import torch

from tests.engine_helpers import run_forked
from vegas_core.engine_core import EngineCore
from vegas_core.options import EngineOptions, KernelOptions
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


@pytest.fixture(params=["pieces", "sdpa"])
def prefill_route(request, monkeypatch):
    """The default mode's prefill chunks through the verification kernel in pieces, or (a context
    bound of 0) through the reference's SDPA, as chunks over longer contexts go."""
    import vegas_core.attention.kernel_backend as kb
    monkeypatch.setattr(kb, "PIECES_MAX_CONTEXT", 1 << 30 if request.param == "pieces" else 0)
    return request.param


def test_which_prefill_chunks_go_in_pieces():
    from vegas_core.attention.kernel_backend import PIECES_MAX_CONTEXT, KernelBackend
    from vegas_core.kernels.verify_attention import MAX_Q_ROWS
    default, invariant = KernelBackend(1.0), KernelBackend(1.0, options=KernelOptions(deterministic=True))
    assert default._in_pieces(MAX_Q_ROWS, 10 * PIECES_MAX_CONTEXT)        # verification-sized: the kernel
    assert default._in_pieces(1024, PIECES_MAX_CONTEXT)
    assert not default._in_pieces(1024, PIECES_MAX_CONTEXT + 1)           # a long context: SDPA
    assert invariant._in_pieces(1024, 10 * PIECES_MAX_CONTEXT)            # the same bits at any context


def test_prefill_chunks_on_either_route_match_the_reference(tiny, prefill_route):
    """Prefill steps on the kernel path give the reference path's logits (fp32, 1e-4) on either
    route: a whole 37-token prompt beside a 70-token one's first 40 tokens, then its other 30 (a
    chunk after a context, pieces of 17 rows and a last one of 13) beside a one-row decode."""
    from vegas_core.block_manager import BlockAllocator
    from vegas_core.model_runner import BatchEntry, ModelRunner
    runners = {a: ModelRunner(tiny.config, tiny.weights, torch.device(DEVICE), torch.float32, num_blocks=32,
                              options=EngineOptions(block_size=16, attention=a, cuda_graphs="off"))
               for a in ("reference", "triton")}
    alloc = BlockAllocator(32, 16)
    alloc.ensure(0, 38)
    alloc.ensure(1, 70)
    a, b = _prompts()[:2]
    steps = [[BatchEntry(0, a, 0, logits="all"), BatchEntry(1, b[:40], 0, logits="all")],
             [BatchEntry(0, [5], 37, logits="all"), BatchEntry(1, b[40:], 40, logits="all")]]
    for entries in steps:
        got = {name: runner.forward(entries, alloc, None) for name, runner in runners.items()}
        torch.testing.assert_close(got["triton"], got["reference"], atol=1e-4, rtol=1e-4)


def test_quest_page_must_be_a_block_on_the_kernel_path(tiny):
    core = _core(tiny, "triton")
    with pytest.raises(InvalidRequestError, match="page_size must be 16"):
        core.add_request([1, 2, 3], SamplingParams(max_tokens=4), SpecParams(method="quest", page_size=8))


def test_attention_choice_is_checked(tiny):
    with pytest.raises(InvalidRequestError, match="attention must be one of"):
        _core(tiny, "fast")


# -- a hybrid model: Gemma 3's sliding-window layers on the kernel path --------------------------

@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """TINY_GEMMA3 (layers sliding, sliding, global, sliding) with a window of 16, so prompts of
    40 and more move it on and a 12-row prefill chunk lies across it."""
    from tests.vegas_core.conftest import TINY_GEMMA3, build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("gemma"), "gemma3", seed=5,
                                  **{**TINY_GEMMA3, "sliding_window": 16})
    return load_model(path)


def test_gemma_forwards_on_the_kernel_path_match_the_reference(tiny_gemma, prefill_route):
    """Each forward the kernel path runs on a hybrid model gives the reference path's logits
    (fp32, 1e-4): one prefill step holding a 40-token prompt (pieces of the verification kernel,
    or the windowed SDPA: `prefill_route`) and a 12-token one (the verification kernel, windowed
    on sliding layers), a verification of 5 and 3 rows
    collecting Collect-2-Query's rows (the kernel's collected buffers hold the one global layer,
    its logits equal to the reference's within bf16), and a draft step (the sparse kernel: the
    query's window on sliding layers, the selection on the global one)."""
    from vegas_core.attention import LogitCollector
    from vegas_core.block_manager import BlockAllocator
    from vegas_core.model_runner import BatchEntry, ModelRunner
    from vegas_core.spec.views import FixedSelection
    cfg = tiny_gemma.config
    runners = {a: ModelRunner(cfg, tiny_gemma.weights, torch.device(DEVICE), torch.float32, num_blocks=32,
                              options=EngineOptions(block_size=16, attention=a, cuda_graphs="off"))
               for a in ("reference", "triton")}
    alloc = BlockAllocator(32, 16)
    alloc.ensure(0, 47)
    alloc.ensure(1, 17)
    g = torch.Generator().manual_seed(4)
    ids = lambda n: torch.randint(0, 262, (n,), generator=g).tolist()   # noqa: E731
    a, b, va, vb = ids(40), ids(12), ids(5), ids(3)
    sets = [torch.randperm(40, generator=g)[None, :6].sort().values for _ in range(cfg.num_layers)]
    steps = [
        ([BatchEntry(0, a, 0, logits="last"), BatchEntry(1, b, 0, logits="all")], None),
        ([BatchEntry(0, va, 40, collect_rows=[0, 4], logits="all"),
          BatchEntry(1, vb, 12, collect_rows=[0, 2], logits="all")], "collect"),
        ([BatchEntry(0, ids(1), 45, sparse=FixedSelection(45, 6, sets), logits="last"),
          BatchEntry(1, ids(1), 15, sparse=FixedSelection(15, 6, [s % 12 for s in sets]), logits="last")], None),
    ]
    for entries, collect in steps:
        got = {}
        for name, runner in runners.items():
            collector = LogitCollector() if collect else None
            got[name] = (runner.forward(entries, alloc, collector), collector)
        torch.testing.assert_close(got["triton"][0], got["reference"][0], atol=1e-4, rtol=1e-4)
    ref = ker = None
    # The verification step's collection, compared layer by layer.
    for name, runner in runners.items():
        collector = LogitCollector()
        runner.forward(steps[1][0], alloc, collector)
        if name == "reference":
            ref = collector
        else:
            ker = collector
    assert ker.layers == cfg.global_layers == (2,) and ker.layer_logits.shape[0] == 1
    assert all(set(layers) == {2} for layers in ref.logits.values())
    logits, lse = ker.stacked()
    for i, upto in ((0, 40), (1, 12)):
        rows = ker.rows_of[i]
        want = ref.logits[i][2]
        torch.testing.assert_close(logits[0, rows, :, :upto].float(), want, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[0, rows], ref.lse[i][2], atol=1e-4, rtol=1e-4)


def test_gemma_every_method_on_the_kernel_path_equals_vanilla(tiny_gemma):
    """A hybrid model on the kernel path through the CUDA-graph path's static buffers (captured
    on a GPU), with the chains that advance positions inside the graph (so each row's window start
    moves on the device) and run-ahead: every method's greedy tokens equal vanilla's, which equal
    the reference path's. Traced, the verification-guided methods and Quest select on the global
    layer only (the sliding layers' sets are empty), as on the reference path
    (spec/test_hybrid_lossless.py)."""
    from tests.vegas_core.spec.test_hybrid_lossless import _selected_layers
    graphs = "auto" if DEVICE == "cuda" else "static"
    # One granularity: per KV head changes nothing about windows (the Llama tests above run both).
    specs = [SpecParams(method=m, gamma=3, sparsity=0.25, min_budget=4)
             for m in ("stream", "quest", "specextend", "vegas", "vegas-all")]
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 262, (n,), generator=g).tolist() for n in (9, 45)]
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)

    def run(attention, graph, trace, specs):
        opts = EngineOptions(block_size=16, num_blocks=64, max_num_seqs=16, trace=trace,
                             attention=attention, cuda_graphs=graph)
        core = EngineCore(tiny_gemma.config, tiny_gemma.weights, DEVICE, torch.float32, opts)
        parents, children = run_forked(core, prompts, sampling, specs)
        for spec, reqs in children.items():
            assert [r.output_ids for r in reqs] == [p.output_ids for p in parents], (attention, spec)
        assert core.allocator.num_free == core.allocator.num_blocks
        return core, [p.output_ids for p in parents], children

    _, want, _ = run("reference", "off", False, specs)
    core, got, _ = run("triton", graphs, False, specs)
    assert got == want
    kinds = {(k.kind, k.collect, k.chain) for k in core.runner.graphs.graphs}
    # vanilla's decode chains, verifications collecting (the children's mixed rows: the main
    # tile), chains of drafts over fixed selections
    assert {("dense", 0, True), ("dense", 1, False), ("fixed", 0, True)} <= kinds, kinds
    _, _, children = run("triton", graphs, True, [s for s in specs if s.method in ("quest", "vegas")])
    for method in ("quest", "vegas"):
        assert _selected_layers(children, method) == {2}, method
