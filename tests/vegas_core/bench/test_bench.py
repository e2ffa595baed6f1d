"""The benchmark commands run end to end and write well-formed result files.

They run on a tiny random Llama checkpoint (conftest's `make_tiny_hf_model`) so the whole file stays
within seconds; the real numbers come from `python -m vegas_core.bench ...` on the default model.
Nothing here is timed: only the presence and plausibility of the recorded fields are checked."""
from __future__ import annotations

import glob
import json
import os

import pytest

from vegas_core.bench import main, texts
from vegas_core.spec import METHODS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model

    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", max_position_embeddings=1024)
    return path


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny model's ops are microseconds of work: on a busy 2-core machine, waiting for a second
    OpenMP thread costs more than it saves."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _load(out_dir, kind: str) -> dict:
    [path] = glob.glob(os.path.join(out_dir, f"{kind}-*-cpu.json"))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _check_header(doc: dict, argv: list[str]) -> None:
    assert doc["device"].startswith("cpu: ") and "threads" in doc["device"]
    assert doc["command"] == "python -m vegas_core.bench " + " ".join(argv)
    assert doc["torch"] and len(doc["date"]) == 10
    assert doc["records"]


def test_decode_writes_records_with_hf_baseline(tmp_path, tiny_model):
    argv = ["decode", "--model", tiny_model, "--device", "cpu", "--batch", "1", "2", "--context", "40",
            "--gen-tokens", "8", "--hf", "--repeats", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "decode")
    _check_header(doc, argv)
    assert [(r["batch"], r["context"]) for r in doc["records"]] == [(1, 40), (2, 40)]
    for r in doc["records"]:
        assert r["device"] == doc["device"] and r["dtype"] == "float32" and r["method"] == "vanilla"
        assert r["generated_tokens"] == 8 * r["batch"]
        assert r["tokens_per_s"] > 0 and r["decode_s"] > 0 and r["decode_steps"] == 8
        assert r["hf_tokens_per_s"] > 0 and r["speedup_vs_hf"] > 0
        assert r["hf_same_tokens"] is True  # same weights, greedy, fp32: the same tokens
        assert len(r["tokens_per_s_samples"]) == len(r["hf_tokens_per_s_samples"]) == 2


def test_acceptance_writes_every_policy(tmp_path, tiny_model):
    argv = ["acceptance", "--model", tiny_model, "--device", "cpu", "--text-tokens", "300",
            "--gen-tokens", "16", "--min-budget", "32", "--sparsity", "0.1", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "acceptance")
    _check_header(doc, argv)
    assert doc["workload"]["kind"] == "summarise" and doc["workload"]["text_tokens"] == 300
    recs = doc["records"]
    assert recs[0]["method"] == "vanilla"
    runs = {(r["method"], r["granularity"]) for r in recs[1:]}
    assert runs == {(m, "layer") for m in METHODS if m != "vanilla"} | {
        (m, "kv-head") for m in ("specextend", "vegas", "vegas-all")}
    for r in recs[1:]:
        assert r["mean_acceptance_length"] >= 1
        assert len(r["per_position_acceptance"]) == 6
        assert all(0 <= a <= 1 for a in r["per_position_acceptance"])
        assert len(r["recall_per_layer"]) == 2                    # the tiny model has 2 layers
        assert all(0 <= x <= 1 + 1e-6 for x in r["recall_per_layer"])
        assert 0 <= r["mean_recall"] <= 1 + 1e-6
        assert r["budget"] >= 32 and r["prompt_tokens"] > 300
        assert r["generated_tokens"] >= 1 and r["iterations"] >= 1 and r["tokens_per_s"] > 0
        assert r["matches_vanilla"] is True                       # lossless at temperature 0


def test_long_text_is_exact_and_deterministic(tiny_model):
    from vegas_core.loader import load_model

    tok = load_model(tiny_model).tokenizer
    a = texts.long_text(2500, tok)
    assert len(a) == 2500 and a == texts.long_text(2500, tok)
    assert texts.long_text(100, tok, offset=997) != a[:100]
    assert "textwrap" in tok.decode(a[:50])
    corpus = len(texts.corpus_ids(tok))
    assert len(texts.long_text(corpus + 10, tok)) == corpus + 10   # tiles past the corpus end
    prompts = texts.short_prompts(40)
    assert len(set(prompts)) == 40 and all(p.strip() for p in prompts)
