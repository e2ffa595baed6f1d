"""The throughput sweep (`bench.sweep`) on real engines: a tiny random Llama for the grid's
mechanics (refusals, parents or not, stop, progress, the command's file), the embedded SmolLM2 for
one real cell. Nothing is timed: only what was run, what was refused and why, and the bound."""
from __future__ import annotations

import glob
import json
import threading

import pytest

from vegas_core.bench import e2e, main
from vegas_core.bench.sweep import (METHODS, Grid, SweepProgress, cell_prompts, pages_per_request, run_sweep,
                                    template_parts)
from vegas_core.engine import Engine
from vegas_core.loader import load_model
from vegas_core.options import EngineOptions
from vegas_core.spec import SpecParams

SPEC = SpecParams(method="vegas", gamma=3, sparsity=0.3, min_budget=4)
pytestmark = pytest.mark.usefixtures("one_thread")     # the tiny model's ops are microseconds


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")     # 512 positions
    return load_model(path)


def _engine(loaded, **opts):
    return Engine(device="cpu", loaded=loaded, options=EngineOptions(trace=True, **opts))


def _idle(engine):
    alloc = engine.core.allocator
    return alloc.num_free == alloc.num_blocks and not engine.core.requests


def test_every_cell_that_fits_is_measured_and_the_others_are_refused_with_the_reason(tiny):
    # 20 pages of 16: batch 1 x 96 (9 pages) has room for its prefilled parent too, batch 2 x 96
    # (18) only for itself, batch 2 x 160 (26) not at all; batch 8 is more than 4 requests at once.
    engine = _engine(tiny, num_blocks=20, max_num_seqs=4)
    assert pages_per_request(96, 16) == 9 and pages_per_request(160, 16) == 13
    progress, seen, traced = SweepProgress(), set(), []
    decode = engine.core._decode

    def spy(reqs):                  # the engine traces by default (the app's); the sweep's requests don't
        traced.extend(r.trace for r in reqs)
        return decode(reqs)
    engine.core._decode = spy
    doc = run_sweep(engine, Grid((1, 2, 8), (96, 160, 1024), 4), SPEC, progress,
                    between_steps=lambda: seen.add((progress.cell, progress.method)))
    assert engine.core.options.trace and traced and not any(traced)
    cells = {(r["batch"], r["context"]): r for r in doc["records"]}
    assert list(cells) == [(1, 96), (2, 96), (8, 96), (1, 160), (2, 160), (8, 160), (1, 1024), (2, 1024),
                           (8, 1024)]
    measured = [c for c, r in cells.items() if not r["refused"]]
    assert measured == [(1, 96), (2, 96), (1, 160)]
    assert "more than the 4 requests this engine runs at once" in cells[8, 96]["refused"]
    assert cells[2, 160]["refused"] == "batch 2 × 160 tokens needs 26 KV pages; the pool has 20 free"
    assert cells[1, 1024]["refused"] == "context 1,024 is beyond the model's 512 positions"
    weights = e2e.read_weight_bytes(tiny.weights, 4)
    for cell in measured:
        r = cells[cell]
        assert list(r["methods"]) == list(METHODS) and r["prompt_tokens"] == cell[1] - 4
        assert r["bound"]["weight_bytes"] == weights           # counted as bench e2e counts them
        assert r["bound"]["mean_context"] == r["prompt_tokens"] + 1.5
        for m in r["methods"].values():
            assert m["tokens_per_s"] > 0 and m["generated_tokens"] == 4 * cell[0]
            assert m["of_bound"] == pytest.approx(m["tokens_per_s"] / r["bound"]["tokens_per_s"])
        assert r["methods"]["vegas"]["gamma"] == 3 and r["methods"]["vanilla"]["gamma"] is None
    assert doc["complete"] and not doc["stopped"] and doc["settings"]["sparsity"] == 0.3
    assert doc["device_tag"] == "cpu" and doc["mode"] == "reference" and doc["traced"] is False
    # Progress named every measured cell and method; the tokens add up; the engine is idle again.
    assert {(c, m) for c in (1, 2, 4) for m in METHODS} <= seen
    assert progress.done and progress.tokens == progress.total_tokens == 3 * 4 * (1 + 2 + 1)
    assert _idle(engine)
    json.dumps(doc, allow_nan=False)                           # what the cache and the file hold


def test_stop_ends_the_sweep_after_the_current_step_and_frees_the_engine(tiny):
    engine = _engine(tiny, max_num_seqs=8)
    stop, steps = threading.Event(), []
    progress = SweepProgress()

    def between_steps():
        steps.append(progress.method)
        if progress.method == "stream":
            stop.set()

    doc = run_sweep(engine, Grid((2,), (160, 320), 8), SPEC, progress, stop, between_steps)
    assert doc["stopped"] and not doc["complete"]
    [cell] = doc["records"]                                     # the second cell never started
    assert list(cell["methods"]) == ["vanilla"] and progress.line == "stopped"
    assert _idle(engine)


def test_prompts_are_real_text_of_the_exact_length_in_the_chat_template(default_model):
    tok = default_model.tokenizer
    parts = template_parts(tok)
    prompts = cell_prompts(tok, 2, 300, parts)
    assert [len(p) for p in prompts] == [300, 300] and prompts[0] != prompts[1]
    text = tok.decode(prompts[0], skip_special_tokens=False)
    assert "<|im_start|>user\nSummarise what the following source file provides:" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_a_cell_on_the_embedded_model(engine):
    """SmolLM2 itself (the session's engine): one small cell, speculation accepts real drafts."""
    doc = run_sweep(engine, Grid((1,), (160,), 12), SpecParams(method="vegas", gamma=4, sparsity=0.5,
                                                               min_budget=16))
    [cell] = doc["records"]
    assert not cell["refused"] and doc["model"] == engine.config.name
    assert cell["methods"]["vegas"]["mean_acceptance_length"] > 1.0
    assert _idle(engine)


def test_the_command_writes_the_sweep_and_prints_it(tmp_path, tiny, capsys):
    argv = ["sweep", "--model", tiny.source, "--device", "cpu", "--batches", "1", "2", "--contexts", "96", "600",
            "--gen-tokens", "4", "--gamma", "3", "--out", str(tmp_path)]
    assert main(argv) == 0
    [path] = glob.glob(str(tmp_path / "sweep-*-cpu.json"))
    doc = json.loads(open(path, encoding="utf-8").read())
    assert doc["command"] == "python -m vegas_core.bench " + " ".join(argv)
    assert [(r["batch"], r["context"], bool(r["refused"])) for r in doc["records"]] == \
        [(1, 96, False), (2, 96, False), (1, 600, True), (2, 600, True)]
    assert doc["settings"]["gamma"] == 3 and doc["complete"]
    out = capsys.readouterr().out
    assert "refused: context 600 is beyond the model's 512 positions" in out and "wrote " in out
