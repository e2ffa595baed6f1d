"""The CUDA-graph path's static buffers (`vegas_core.graphs`) give the reference path's tokens (as
the dynamic kernel path does: tests/vegas_core/test_kernel_backend.py).

On the CPU the graphs are not captured (`cuda_graphs="static"`) but everything else is the same:
the step's numbers go through the staging buffer, the batch is padded to a bucket (three
requests run as four: one padding request with no rows, and padding rows writing to the scratch
slot), block tables and selections are copied only when they change, collected logits land in
the whole-model buffers; drafts and a vanilla batch's plain steps, greedy or sampled, run as
chains that advance themselves on the device. A tiny 2-layer Llama in float32 under Triton's interpreter; on a GPU
(TRITON_INTERPRET=0) the same test captures real graphs (`cuda_graphs="auto"`).
"""
import os

import pytest
import torch

from vegas_core.engine_core import EngineCore
from vegas_core.options import EngineOptions
from vegas_core.graphs import bucket
from vegas_core.loader import load_model
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

GPU = os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
GRAPHS = "auto" if GPU else "static"

SPECS = [SpecParams(method="vanilla")] + [
    SpecParams(method=m, gamma=3, sparsity=0.25, min_budget=4, granularity=g)
    for m, g in (("stream", "layer"), ("quest", "kv-head"), ("specextend", "layer"),
                 ("vegas", "layer"), ("vegas", "kv-head"))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", seed=5)
    return load_model(path)


def _core(loaded, graphs, attention="triton"):
    opts = EngineOptions(block_size=16, num_blocks=256, max_num_seqs=64, attention=attention,
                         cuda_graphs=graphs)
    return EngineCore(loaded.config, loaded.weights, DEVICE, torch.float32, opts)


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 262, (n,), generator=g).tolist() for n in (29, 54, 83)]


def test_bucket():
    assert [bucket(n, 128) for n in (1, 3, 5, 64, 65, 128)] == [1, 4, 8, 64, 80, 128]
    assert bucket(3, 3) == 3 and bucket(129, 128) is None and bucket(20, 16) is None


def _run(core, spec, sampling):
    reqs = [core.add_request(p, sampling, spec) for p in _prompts()]
    core.run()
    return [r.output_ids for r in reqs]


def test_graph_path_gives_the_reference_paths_tokens(tiny):
    """Every kind of graph, one method at a time (a draft step mixing kinds runs eagerly)."""
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    ref, core = _core(tiny, "off", "reference"), _core(tiny, GRAPHS)
    assert ref.runner.graphs is None and core.runner.graphs is not None
    for spec in SPECS:
        assert _run(core, spec, sampling) == _run(ref, spec, sampling), spec
    kinds = {(k.kind, k.collect, k.groups) for k in core.runner.graphs.graphs}
    # decode (no collection), first-step / vegas verification (first/last tile), specextend's
    # (main tile), fixed drafts per layer and per KV head, Quest drafts.
    assert {("dense", 0, 1), ("dense", 2, 1), ("dense", 1, 1), ("fixed", 0, 1), ("fixed", 0, 2),
            ("quest", 0, 2)} <= kinds, kinds
    assert any(k.batch == 4 for k in core.runner.graphs.graphs)     # three requests, padded
    # Greedy drafts and vanilla's plain steps ran as chains (several steps per host round trip).
    assert {("dense", True), ("fixed", True), ("quest", True)} <= {(k.kind, k.chain) for k in core.runner.graphs.graphs}
    assert core.allocator.num_free == core.allocator.num_blocks


def test_mixed_batch_runs_one_verification_graph(tiny):
    """Vanilla and vegas requests verify together (1 and 4 rows, ragged in one dense graph); a
    sampled request drafts beside greedy ones, in a chain that samples in the graph. Tokens equal
    the reference path's (one eager step at a time, sampling outside any graph)."""
    sampling = [SamplingParams(max_tokens=9, ignore_eos=True),
                SamplingParams(max_tokens=9, ignore_eos=True, temperature=0.8, seed=3),
                SamplingParams(max_tokens=9, ignore_eos=True)]
    specs = [SpecParams(method="vanilla"), SpecParams(method="vegas", gamma=3, min_budget=4, sparsity=0.3),
             SpecParams(method="vegas", gamma=2, min_budget=4, sparsity=0.3)]
    outs = {}
    for graphs, attention in (("off", "reference"), (GRAPHS, "triton")):
        core = _core(tiny, graphs, attention)
        reqs = [core.add_request(p, s, sp) for p, s, sp in zip(_prompts(), sampling, specs)]
        core.run()
        outs[graphs] = [r.output_ids for r in reqs]
    assert outs["off"] == outs[GRAPHS]
    keys = core.runner.graphs.graphs
    assert any(k.kind == "dense" and k.rows == 4 and k.batch == 4 for k in keys)
    # The batch holds a sampled request: its drafts and the greedy ones sampled in one chain.
    assert any(k.kind == "fixed" and k.chain and k.sampled for k in keys)


def test_run_ahead_chains_give_the_same_tokens(tiny):
    """The next iteration's chain is launched before the step returns (run-ahead): used when the
    next batch is the same (also across another request's prefill step), discarded when it
    changed (a request paused, then resumed); ragged gammas and lengths, requests finishing at
    different steps. Tokens and drafts accepted per step equal the reference path's; every page
    comes back."""
    cases = [
        (SpecParams(method="vegas", gamma=2, sparsity=0.3, min_budget=4), 9),
        (SpecParams(method="vegas", gamma=4, sparsity=0.3, min_budget=4), 14),
        (SpecParams(method="vanilla"), 34),
        (SpecParams(method="vanilla"), 52),
    ]
    late = _prompts()[1][:40]

    def run(core, specs):
        reqs = [core.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True), sp)
                for p, (sp, n) in zip(_prompts(), specs)]
        paused, state, accepted = reqs[0], 0, []
        while core.has_work:
            # Drafts accepted per step: a chain drafting from wrong positions or tokens would
            # still give the same output (verification corrects it), but accept fewer.
            accepted.append([(next(i for i, r in enumerate(reqs) if r is o.request), o.num_accepted)
                             for o in core.step()])
            if state == 0 and paused.num_generated >= 2:
                core.pause(paused.request_id)    # the chain launched ahead included it: stale
            elif state == 1:                     # arrives, prefills in the next step, then joins
                reqs.append(core.add_request(late, SamplingParams(max_tokens=5, ignore_eos=True), specs[0][0]))
            elif state == 2:
                core.resume(paused.request_id)
            else:
                continue
            state += 1
        return [r.output_ids for r in reqs], accepted

    for specs in (cases[:2], cases[2:]):
        ref, core = _core(tiny, "off", "reference"), _core(tiny, GRAPHS)
        (tokens, accepted), (ref_tokens, ref_accepted) = run(core, specs), run(ref, specs)
        assert tokens == ref_tokens
        if specs[0][0].speculative:       # (vanilla's steps differ: several per chain on graphs)
            assert accepted == ref_accepted and any(n for step in accepted for _, n in step)
        assert core.overlap.enabled and not ref.overlap.enabled
        used, launched = core.chains["ahead_used"], core.chains["ahead"]
        assert 0 < used < launched, core.chains          # some used, some discarded
        # Draft chains launched behind the verification (acceptance on the device) and used.
        # (Vanilla's chains launched behind each other: the next test; here its batch changes
        # at every chain, so they are all dropped.)
        if specs[0][0].speculative:
            assert 0 < core.chains["early_used"] <= core.chains["early"], core.chains
        assert core.allocator.num_free == core.allocator.num_blocks


@pytest.mark.parametrize("sampled", [False, True])
def test_vanilla_chains_launch_behind_each_other(tiny, sampled):
    """A vanilla batch's next chain is queued behind the running one, from its last tokens on
    the device, before the host has read them; it is used while the batch stays the same and
    none is past max_tokens (three requests finishing at different chains). Greedy, and sampled
    in the graph from each request's stream (top-p). The tokens equal the reference path's and
    every page comes back."""
    card = dict(temperature=0.8, top_p=0.9) if sampled else {}
    sampling = [SamplingParams(max_tokens=n, ignore_eos=True, seed=i, **card)
                for i, n in enumerate((34, 52, 40))]
    outs = {}
    for graphs, attention in (("off", "reference"), (GRAPHS, "triton")):
        core = _core(tiny, graphs, attention)
        reqs = [core.add_request(p, sa, SpecParams(method="vanilla")) for p, sa in zip(_prompts(), sampling)]
        core.run()
        outs[graphs] = [r.output_ids for r in reqs]
    assert outs["off"] == outs[GRAPHS]
    assert 0 < core.chains["early_used"] <= core.chains["early"], core.chains
    assert core.allocator.num_free == core.allocator.num_blocks


def test_sampled_batches_chain_and_give_the_reference_tokens(tiny):
    """Sampled batches chain on the GPU too: drafts sampled in the graph (with a top-p filter)
    and verified by the batched rejection sampler, the next chain launched behind the
    verification from its device outcome; a vanilla batch's plain steps sampled in the graph,
    launched ahead when the next batch is certain. Every token equals the reference path's,
    which samples one eager step at a time from the same streams."""
    card = dict(temperature=0.8, top_p=0.9, ignore_eos=True)
    batches = [[(SpecParams(method="vegas", gamma=3, sparsity=0.3, min_budget=4), SamplingParams(max_tokens=11, seed=1, **card)),
                (SpecParams(method="stream", gamma=2, sparsity=0.3, min_budget=4), SamplingParams(max_tokens=8, seed=2, **card))],
               [(SpecParams(method="vanilla"), SamplingParams(max_tokens=21, seed=3, **card)),
                (SpecParams(method="vanilla"), SamplingParams(max_tokens=13, seed=4, temperature=1.0, ignore_eos=True))]]
    for batch in batches:
        outs = {}
        for graphs, attention in (("off", "reference"), (GRAPHS, "triton")):
            core = _core(tiny, graphs, attention)
            reqs = [core.add_request(p, sa, sp) for p, (sp, sa) in zip(_prompts(), batch)]
            core.run()
            outs[graphs] = [r.output_ids for r in reqs]
        assert outs["off"] == outs[GRAPHS]
        kind = "fixed" if batch[0][0].speculative else "dense"
        assert any(k.kind == kind and k.chain and k.sampled == 2 for k in core.runner.graphs.graphs)
        assert core.chains["ahead_used"] > 0, core.chains
        # The speculative batch's next chain started behind its verification, from the
        # rejection sampler's device outcome (drafts and the sampled token it kept).
        assert (core.chains["early"] > 0) == batch[0][0].speculative, core.chains
        assert core.allocator.num_free == core.allocator.num_blocks


def test_a_forward_no_graph_takes_reads_chained_drafts_back(tiny):
    """Entries naming a chain column (drafts still on the device) get their tokens from the
    chain's history when the forward has to run without a graph."""
    from vegas_core.model_runner import BatchEntry
    graphs = _core(tiny, GRAPHS).runner.graphs
    graphs._hist[:3, 1] = torch.tensor([5, 6, 7])
    entries = [BatchEntry(0, [4], 10), BatchEntry(1, [9, 0, 0, 0], 20, device_drafts=1)]
    out = graphs.with_host_drafts(entries)
    assert out[0] is entries[0]
    assert out[1].tokens == [9, 5, 6, 7] and out[1].device_drafts is None and out[1].start == 20


def test_cached_table_rows_follow_every_change(tiny):
    """The graphs' cached block-table rows equal the allocator's table padded with zeros after
    any change: growing, shrinking, shrinking and growing again before the next read (the same
    length, other pages: another sequence took the freed ones), a free and a new table."""
    import numpy as np
    core = _core(tiny, GRAPHS)
    graphs, alloc = core.runner.graphs, core.allocator
    steps = [[("ensure", 40)], [("ensure", 100)], [("truncate", 50)],
             [("truncate", 20), ("other", 0), ("ensure", 50)], [("ensure", 70)], [("free", 0)],
             [("ensure", 33)], [("truncate", 0)], [("ensure", 20)]]
    for ops in steps:
        for op, n in ops:
            if op == "other":              # takes the pages sequence 7 just gave back
                alloc.ensure(99, alloc.capacity(99) + 3 * alloc.block_size)
            elif op == "free":
                alloc.free(7)
            else:
                getattr(alloc, op)(7, n)
        table = alloc.block_table(7)
        expect = np.zeros(graphs.blocks, dtype=np.int32)
        expect[:len(table)] = table
        assert (graphs._table_row(7, alloc) == expect).all(), ops
