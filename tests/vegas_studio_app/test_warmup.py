"""The app's start-up warm-up (`vegas_studio_app/warmup.py`): every method at every batch bucket up to
the app's concurrency, on an engine that captures graphs; nothing where none are captured. On the
CPU the graph path runs uncaptured (`cuda_graphs="static"`, Triton's interpreter), so the graphs
it makes are what a GPU would capture."""
import pytest

from vegas_core.engine import Engine
from vegas_core.options import EngineOptions
from vegas_core.spec import METHODS
from vegas_studio_app.warmup import warm_up, warm_up_plan


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", seed=5)
    return path


def test_plan_covers_every_method_at_each_bucket_up_to_the_concurrency():
    assert warm_up_plan(8) == [(m, b) for m in METHODS for b in (1, 2, 4, 8)]
    assert warm_up_plan(6, ("vegas",)) == [("vegas", 1), ("vegas", 2), ("vegas", 4), ("vegas", 6)]


def test_an_engine_without_graphs_is_not_warmed(tiny_path):
    engine = Engine(tiny_path, "cpu", "float32", options=EngineOptions(max_num_seqs=4))
    calls = []
    assert warm_up(engine, 4, lambda *a: calls.append(a)) is False and calls == []


def test_warm_up_makes_each_methods_graphs_at_each_batch(tiny_path):
    opts = EngineOptions(block_size=16, num_blocks=128, max_num_seqs=4, attention="triton", cuda_graphs="static")
    engine = Engine(tiny_path, "cpu", "float32", options=opts)
    graphs = engine.core.runner.graphs
    calls = []
    assert warm_up(engine, 2, lambda *a: calls.append(a), methods=("vegas",),
                   settings=dict(gamma=1, sparsity=0.5, min_budget=4)) is True
    assert [(m, b) for _, _, m, b in calls] == [("vegas", 1), ("vegas", 2)]
    kinds = {(k.kind, k.batch) for k in graphs.graphs}     # draft chains at both batches, verifications
    assert {("fixed", 1), ("fixed", 2), ("dense", 2)} <= kinds
    assert engine.core.allocator.num_free == engine.core.allocator.num_blocks   # nothing left behind
    # A base model without a chat template (Gemma-3-270M) is warmed up with a plain prompt.
    engine.tokenizer.chat_template = engine.tokenizer._template = None
    assert warm_up(engine, 1, methods=("vanilla",)) is True
