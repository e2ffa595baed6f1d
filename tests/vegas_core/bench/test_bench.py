"""The benchmark commands run end to end and write well-formed result files.

They run on a tiny random Llama checkpoint (conftest's `make_tiny_hf_model`) so the whole file stays
within seconds; the real numbers come from `python -m vegas_core.bench ...` on the default model.
Nothing here is timed: only the presence and plausibility of the recorded fields are checked."""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from vegas_core.bench import main, texts
from vegas_core.spec import METHODS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.vegas_core.conftest import build_tiny_hf_model

    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama", max_position_embeddings=1024)
    return path


# The tiny model's ops are microseconds of work: one intra-op thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_e2e_runs_every_method_side_by_side_and_stays_lossless(tmp_path, tiny_model):
    argv = ["e2e", "--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "2",
            "--replays", "2", "--gen-tokens", "12", "--methods", "vanilla", "stream", "vegas", "vegas/kv-head",
            "--sampling", "greedy", "model-card", "--gamma", "3", "--sparsity", "0.2", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "e2e")
    _check_header(doc, argv)
    assert doc["complete"] and doc["tuned_from"] is None and doc["attention"] == "reference"
    # The reference path takes no kernel options (they are the GPU kernel path's).
    assert doc["kernel_options"] is None
    recs = doc["records"]
    # The bound no plain decoder passes: weights plus the batch's whole KV a step, at the measured
    # copy rate (2 layers x K and V x 2 KV heads x head dim 16 x 4 bytes of float32 a token).
    bound = doc["bandwidth_bound"]
    assert bound["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4 and bound["copy_TBps"] > 0
    assert bound["weight_bytes"] > 0
    assert bound["tokens_per_s"] == pytest.approx(2 * bound["copy_TBps"] * 1e12 / bound["step_bytes"])
    assert doc["workload"]["prompt_tokens"] == [200, 400]
    for r in recs:
        assert r["of_bound"] == pytest.approx(r["tokens_per_s"] / bound["tokens_per_s"])
    assert [(r["sampling"], r["method"], r["granularity"]) for r in recs] == [
        (s, m, g) for s in ("greedy", "model-card")
        for m, g in (("vanilla", None), ("stream", "layer"), ("vegas", "layer"), ("vegas", "kv-head"))]
    for r in recs:
        assert r["workload"] == "small" and r["batch"] == 2 and r["requests"] == 4
        assert r["generated_tokens"] == 4 * 12 and r["tokens_per_s"] > 0
        assert r["full_batch_steps"] > 0 and r["decode_steps"] >= r["full_batch_steps"]
        for key in ("draft_ms", "select_ms", "verify_ms", "select_overhead", "speedup_vs_vanilla"):
            assert r[key] is not None and r[key] >= 0, key
        steps = r["step_ms"]                  # the rate's steps' spread brackets their mean
        assert 0 < steps["min"] <= steps["median"] <= steps["max"]
        assert steps["min"] <= r["iteration_ms"] * (1 + 1e-9) and r["iteration_ms"] <= steps["max"] * (1 + 1e-9)
        gc_ = r["host_gc"]
        assert gc_["collections"] >= 0 and 0 <= gc_["slowest_ms"] <= gc_["ms"] + 1e-9
        assert r["chains"]["launched"] == 0      # the CPU reference path runs no graphs
        assert 0.0 <= r["page_adjacency"] <= 1.0  # sampled once, at the first full-batch step
        if r["method"] == "vanilla":
            assert r["speedup_vs_vanilla"] == 1.0 and r["mean_acceptance_length"] is None
            assert r["draft_ms"] == 0.0 or r["draft_ms"] < 0.05 * r["iteration_ms"]
        else:
            assert (r["gamma"], r["sparsity"], r["tuned"]) == (3, 0.2, False)
            assert len(r["per_position_acceptance"]) == 3
            assert 1.0 <= r["mean_acceptance_length"] <= 4.0
            assert r["draft_ms"] > 0
        if r["sampling"] == "greedy":
            assert r["exact_match_vs_vanilla"] == 1.0    # speculation is lossless through the harness


def test_e2e_trace_cost_runs_every_method_traced_and_untraced(tmp_path, tiny_model):
    """`--trace-cost`: each method also runs on an engine recording the trace, untraced and traced
    runs alternating; the same tokens, and the cost as the share of decode time tracing adds."""
    argv = ["e2e", "--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "1",
            "--gen-tokens", "6", "--methods", "vanilla", "vegas", "--sampling", "greedy", "--gamma", "2",
            "--trace-cost", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    recs = _load(tmp_path, "e2e")["records"]
    assert [r["method"] for r in recs] == ["vanilla", "vegas"]
    for r in recs:
        t = r["trace"]
        assert t["rounds"] == 2 and len(t["tokens_per_s"]) == len(t["tokens_per_s_traced"]) == 2
        assert t["tokens_per_s"][0] == r["tokens_per_s"] and min(t["tokens_per_s_traced"]) > 0
        assert r["trace_cost"] == pytest.approx(max(t["tokens_per_s"]) / max(t["tokens_per_s_traced"]) - 1)
        assert t["same_tokens"] is True and t["traced_iteration_ms"] > 0


def test_bandwidth_bound_is_the_designs_22k_at_batch_64_and_8k():
    """DESIGN.md: SmolLM2's 23,040 bf16 bytes of KV a token, batch 64 at 8K contexts, about
    4.2 TB/s: about 22,000 tokens/s for any non-speculative decoder."""
    from vegas_core.bench import e2e
    from vegas_core.config import ModelConfig

    cfg = ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                      max_position_embeddings=8192)
    # 64 prompts of 8,000 tokens and 385 generated: contexts average 8,000 + 192 = 8,192.
    workload = e2e.Workload("long-input", [[0] * 8000] * 64, gen_tokens=385, batch=64,
                            prompt_range=(8000, 8000))
    bound = e2e.bandwidth_bound(workload, cfg, weight_bytes=0, itemsize=2, copy_tbps=4.2)
    assert bound["kv_bytes_per_token"] == 23_040 and bound["mean_context"] == 8192
    assert bound["step_bytes"] == 64 * 8192 * 23_040
    assert 21_000 < bound["tokens_per_s"] < 23_000
    # The weights are read once a step, whatever the batch: they lower the bound by their share.
    with_weights = e2e.bandwidth_bound(workload, cfg, weight_bytes=270e6, itemsize=2, copy_tbps=4.2)
    assert with_weights["tokens_per_s"] == pytest.approx(
        bound["tokens_per_s"] * bound["step_bytes"] / (bound["step_bytes"] + 270e6))
    # A tied head is the embedding table and counts; an untied table is only looked up.
    tied = {"model.embed_tokens.weight": torch.zeros(10, 4), "w": torch.zeros(3)}
    assert e2e.read_weight_bytes(tied, 2) == 2 * 43
    assert e2e.read_weight_bytes({**tied, "lm_head.weight": torch.zeros(10, 4)}, 2) == 2 * 43


def test_bandwidth_bound_reads_a_sliding_layers_window_only():
    """Gemma-3-270M at 32K: the 15 sliding layers read 512 tokens each, the 3 global ones all."""
    from vegas_core.bench import e2e
    from vegas_core.config import ModelConfig

    types = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18))
    cfg = ModelConfig(arch="gemma3", vocab_size=262144, hidden_size=640, intermediate_size=2048,
                      num_layers=18, num_heads=4, num_kv_heads=1, head_dim=256,
                      max_position_embeddings=32768, sliding_window=512, layer_types=types)
    workload = e2e.Workload("long-input", [[0] * 32000] * 8, gen_tokens=1, batch=8, prompt_range=(32000, 32000))
    bound = e2e.bandwidth_bound(workload, cfg, weight_bytes=0, itemsize=2, copy_tbps=4.2)
    per_layer = 2 * 1 * 256 * 2
    assert bound["step_bytes"] == 8 * per_layer * (3 * 32000 + 15 * 512)


def test_base_model_prompts_are_plain_text_after_bos(gemma_model):
    from vegas_core.bench import e2e
    tok = gemma_model.tokenizer
    assert tok.chat_template is None
    assert e2e.prompt_ids(tok, "Explain this code:") == [tok.bos_token_id] + tok.encode("Explain this code:")


def test_prompt_tokens_override_the_workload_and_must_fit(tiny_model):
    import argparse

    from vegas_core.bench import e2e
    from vegas_core.loader import load_model

    p = argparse.ArgumentParser()
    e2e.add_arguments(p)
    loaded = load_model(tiny_model)
    base = ["--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "3", "--gen-tokens", "8"]
    args = p.parse_args(base + ["--prompt-tokens", "100", "140"])
    workload = e2e.build_workload(args, loaded.tokenizer, loaded.config, on_gpu=False)
    assert workload.prompt_range == (100, 140)
    default = e2e.build_workload(p.parse_args(base), loaded.tokenizer, loaded.config, on_gpu=False)
    template = len(default.prompts[0]) - 200             # the small workload's shortest text is 200
    lengths = [len(q) - template for q in workload.prompts]
    assert lengths == pytest.approx([100, 120, 140], abs=2)  # re-encoding may merge at the seams
    # 1,024 positions less 8 generated, the gamma slack and the template's room: 935 at most.
    with pytest.raises(SystemExit, match="at most 935"):
        e2e.build_workload(p.parse_args(base + ["--prompt-tokens", "100", "1000"]), loaded.tokenizer,
                           loaded.config, on_gpu=False)
    with pytest.raises(SystemExit, match="LO <= HI"):
        e2e.build_workload(p.parse_args(base + ["--prompt-tokens", "140", "100"]), loaded.tokenizer,
                           loaded.config, on_gpu=False)


def test_tune_follows_the_three_steps_and_e2e_uses_its_choice(tmp_path, tiny_model):
    argv = ["tune", "--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "2",
            "--gen-tokens", "8", "--methods", "vegas", "--sparsities", "0.05", "0.3", "--gammas", "2", "4",
            "--large-gamma", "6", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "tune")
    _check_header(doc, argv)
    assert doc["complete"] and set(doc["tuned"]) == {"vegas/layer"}
    steps = [r["step"] for r in doc["records"]]
    assert steps[:4] == [1, 1, 2, 2] and set(steps[4:]) == {3}
    assert [r["gamma"] for r in doc["records"][:2]] == [6, 6]
    choice = doc["tuned"]["vegas/layer"]
    assert choice["gamma"] in (2, 4) and 0 < choice["sparsity"] <= 1
    best = max((r for r in doc["records"] if r["gamma"] == choice["gamma"] and r["step"] in (2, 3)),
               key=lambda r: r["tokens_per_s"])
    assert best["sparsity"] == choice["sparsity"]

    e2e_argv = ["e2e", "--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "2",
                "--gen-tokens", "8", "--methods", "vanilla", "vegas", "stream", "--sampling", "greedy",
                "--out", str(tmp_path)]          # finds the tune file in --out by model and device
    assert main(e2e_argv) == 0
    e2e_doc = _load(tmp_path, "e2e")
    assert e2e_doc["tuned_from"].endswith(".json")
    vegas = next(r for r in e2e_doc["records"] if r["method"] == "vegas")
    assert (vegas["gamma"], vegas["sparsity"], vegas["tuned"]) == (choice["gamma"], choice["sparsity"], True)
    stream = next(r for r in e2e_doc["records"] if r["method"] == "stream")
    assert stream["tuned"] is False and stream["gamma"] == 6   # not tuned: the defaults, said so


@pytest.mark.parametrize("attention", ["reference", "triton"])
def test_collect_times_each_mode_per_verification_iteration_and_layer(tmp_path, attention):
    """Collect-2-Query's cost on a hybrid model (a tiny Gemma 3: layers sliding, sliding, global,
    sliding): a record per collection mode with its verification, selection, drafts and the
    overheads derived from them, and the attention of the global layer per mode and of a sliding
    layer. On the kernel path (Triton's interpreter) the selection is the engine's batched one."""
    from tests.vegas_core.conftest import TINY_GEMMA3, build_tiny_hf_model
    path, _ = build_tiny_hf_model(tmp_path / "gemma", "gemma3", **{**TINY_GEMMA3, "sliding_window": 16})
    argv = ["collect", "--model", path, "--device", "cpu", "--batch", "2", "--context", "40",
            "--gamma", "2", "--repeats", "1", "--attention", attention, "--eager", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "collect")
    _check_header(doc, argv)
    assert doc["attention"] == attention and doc["global_layers"] == [2] and doc["sliding_window"] == 16
    ver = [r for r in doc["records"] if r["kind"] == "verification"]
    assert [(r["mode"], r["method"]) for r in ver] == [("none", None), ("c2q", "vegas"), ("all", "vegas-all")]
    for r in ver:
        assert r["verify_ms"] > 0 and r["draft_ms"] > 0 and (r["select_ms"] > 0) == (r["mode"] != "none")
        assert r["iteration_ms"] == pytest.approx(r["draft_ms"] + r["verify_ms"] + r["select_ms"])
        assert r["collecting_layers"] == 1 and r["layers"] == 4 and r["budget"] == 16
    assert ver[0]["overhead_verification"] == 0 and ver[0]["overhead_iteration"] == 0
    layers = [(r["layer_kind"], r["layer"], r["mode"]) for r in doc["records"] if r["kind"] == "layer"]
    assert layers == [("global", 2, "none"), ("global", 2, "c2q"), ("global", 2, "all"), ("sliding", 0, "none")]
    assert all(r["us"] > 0 for r in doc["records"] if r["kind"] == "layer")


def test_tune_plateau_rule():
    from vegas_core.bench.tune import plateau_sparsity, refine_candidates
    trials = [dict(sparsity=s, accepted_per_iteration=a)
              for s, a in ((0.01, 1.0), (0.03, 3.0), (0.05, 3.9), (0.1, 4.0), (0.2, 3.95))]
    assert plateau_sparsity(trials, 0.95) == 0.05
    assert plateau_sparsity(trials, 0.5) == 0.03
    assert refine_candidates(0.6) == [0.3, 0.45, 0.6, 0.9, 1.0]


def test_tune_adds_the_last_gamma_of_each_verification_tile():
    from vegas_core.kernels.verify_attention import tile_rows
    from vegas_core.bench.tune import tile_gammas
    assert tile_gammas(3, 2, 12) == [4, 9]              # SmolLM2: 5 rows fill 15 of 16, 10 rows 30 of 32
    assert (tile_rows(10, 3), tile_rows(11, 3)) == (32, 64)
    assert tile_gammas(4, 2, 12) == [3, 7]              # the 8B-like shape
    assert tile_gammas(8, 1, 16) == [1, 3, 7, 15]
    assert tile_gammas(1, 2, 12) == []                  # 16 rows fit the smallest tile
    assert tile_rows(1, 3) == 16 and tile_rows(17, 8) == 256


def test_e2e_runs_the_default_and_deterministic_modes_side_by_side(tmp_path, tiny_model):
    """`--modes default deterministic` on the kernel path (the interpreter, its dot run row by row
    as tensor cores run it: tests/row_dot.py): each mode's records, the deterministic ones equal
    to their vanilla and, rerun alone, to themselves in the batch, and their rate over the
    default mode's. The deterministic mode runs a `bench invariant` result's launches
    (`--invariant-config`), and its records say which ran."""
    from tests.row_dot import row_by_row_dot
    from vegas_core.options import InvariantConfig
    tuned = InvariantConfig(split_keys=2048, fused_merge=True,
                            linear=(((128, 64, False), (16, 64, 64, 4, 3)),))
    result = tmp_path / "invariant-tuned.json"     # the tiny model: 4 / 2 heads of 16
    result.write_text(json.dumps({"best": {"tiny": {"shape": dict(heads=4, kv_heads=2, head_dim=16),
                                                    "config": tuned.to_dict()}}}))
    argv = ["e2e", "--model", tiny_model, "--device", "cpu", "--attention", "triton", "--workload", "small",
            "--batch", "2", "--prompt-tokens", "30", "40", "--gen-tokens", "5", "--methods", "vanilla", "vegas",
            "--sampling", "greedy", "model-card", "--gamma", "2", "--sparsity", "0.2",
            "--modes", "deterministic", "default", "--alone", "1", "--invariant-config", str(result),
            "--out", str(tmp_path)]
    with row_by_row_dot():
        assert main(argv) == 0
    doc = _load(tmp_path, "e2e")
    _check_header(doc, argv)
    assert doc["complete"] and doc["modes"] == ["default", "deterministic"] and doc["attention"] == "triton"
    assert doc["invariant_config_from"] == str(result)
    recs = doc["records"]
    assert [(r["mode"], r["sampling"], r["method"]) for r in recs] == [
        (mode, s, m) for mode in ("default", "deterministic") for s in ("greedy", "model-card")
        for m in ("vanilla", "vegas")]
    for r in recs:
        assert r["alone_requests"] == 1 and r["tokens_per_s"] > 0
        if r["mode"] == "default":
            assert r["vs_default"] is None and r["invariant_config"] is None
            continue
        assert r["vs_default"] > 0 and r["alone_match"] == 1.0 and r["alone_differs"] == []
        ran = r["invariant_config"]
        assert ran["config"]["source"] == f"{result}#tiny" and ran["config"]["linear"] == {"128x64": [16, 64, 64, 4, 3]}
        assert {k: ran["attention"][k] for k in ("block_m", "block_n", "split_keys", "fused_merge")} == \
            dict(block_m=64, block_n=128, split_keys=2048, fused_merge=True)
        assert set(ran["linear"]) == {"128x64", "64x64", "128x64 silu", "64x128"}   # interpreter's own
        if r["sampling"] == "greedy":
            assert r["exact_match_vs_vanilla"] == 1.0 and r["divergences"] == []


def test_invariant_times_checks_and_chooses_launches(tmp_path):
    """`bench invariant` on the CPU at the tiny shape (under the interpreter, its dot row by row as
    on tensor cores): the default mode's and the candidates' attention and products, each
    candidate's bit check, and a best configuration that `InvariantConfig.from_file` reads back."""
    from tests.row_dot import row_by_row_dot
    from vegas_core.options import InvariantConfig
    argv = ["invariant", "--device", "cpu", "--shapes", "tiny", "--batch", "2", "--context", "64",
            "--verify-rows", "2", "--candidates", '[{"split_keys": 2048, "fused_merge": true}]',
            "--out", str(tmp_path)]
    with row_by_row_dot():
        assert main(argv) == 0
    doc = _load(tmp_path, "invariant")
    _check_header(doc, argv[:-3] + ["'" + argv[-3] + "'"] + argv[-2:])   # the JSON, quoted
    assert doc["complete"] and doc["verify_rows"] == [2]
    att = [r for r in doc["records"] if r["kind"] == "attention"]
    assert [r["candidate"] for r in att] == ["default mode", "today's defaults",
                                             'listed 0: {"split_keys": 2048, "fused_merge": true}']
    for r in att:
        assert r["us_1"] > 0 and r["us_2"] > 0
        if r["mode"] == "deterministic":
            assert r["invariant"] is True and r["mismatches"] == [] and r["estimate_us"] > 0
    assert sum(bool(r.get("best")) for r in att) == 1
    lin = [r for r in doc["records"] if r["kind"] == "linear"]
    assert {r["product"] for r in lin} == {"qkv", "o_proj", "gate_up", "down_proj", "head"}
    assert all(r["us_16"] > 0 and r["us_32"] > 0 for r in lin)
    assert all(r["invariant"] for r in lin if r["mode"] == "deterministic")
    assert [s["mode"] for s in doc["summary"]] == ["default", "deterministic (today)", "deterministic (best)"]
    assert all(s["forward_ms_1"] > 0 and s["forward_ms_2"] > 0 for s in doc["summary"])
    [path] = glob.glob(os.path.join(tmp_path, "invariant-*-cpu.json"))
    cfg = InvariantConfig.from_file(path, 6, 2, 32)
    assert cfg.to_dict() == doc["best"]["tiny"]["config"] and len(cfg.linear) == 4 and cfg.head


def test_invariant_descent_tries_each_knob_at_the_best_so_far():
    from vegas_core.bench.invariant import attention_axes
    axes = dict(attention_axes(64, 3))
    assert axes["block_m"] == [64, 32, 16] and dict(attention_axes(64, 7))["block_m"] == [128, 64, 32, 16]
    assert sum(len(v) - 1 for v in axes.values()) + 1 <= 24      # trials a shape, today's included


def test_agreement_compares_the_kernel_and_reference_paths(tmp_path, tiny_model):
    """On the CPU the kernel path runs under Triton's interpreter (tests/conftest.py); in fp32 both
    paths must give the same tokens, and the record says so."""
    argv = ["agreement", "--model", tiny_model, "--device", "cpu", "--prompts", "2", "--gen-tokens", "6",
            "--methods", "vegas", "--gamma", "3", "--min-budget", "4", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "agreement")
    _check_header(doc, argv)
    assert doc["complete"] and doc["dtype"] == "float32" and doc["prompts"] == 2
    assert [(r["method"], r["granularity"]) for r in doc["records"]] == [("vanilla", None), ("vegas", "layer")]
    for r in doc["records"]:
        assert r["exact_match_rate"] == 1.0 and r["vs_vanilla_rate"] == 1.0 and r["divergences"] == []


def test_steps_that_compile_a_kernel_are_left_out_of_the_rate(tiny_model):
    """e2e and tune leave out a step during which Triton compiled a kernel, as they leave out graph
    captures, and the phase times leave out the step after (its chain was timed across the
    warm-up); `common.TritonCompiles` counts compiles through Triton's post-compile hook (and
    chains the hook it replaced)."""
    import argparse

    import triton

    from vegas_core.bench import common, e2e
    from vegas_core.loader import load_model
    from vegas_core.sampling import SamplingParams
    from vegas_core.spec import SpecParams

    p = argparse.ArgumentParser()
    e2e.add_arguments(p)
    args = p.parse_args(["--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "2",
                         "--replays", "1", "--gen-tokens", "8"])
    loaded = load_model(args.model)
    workload = e2e.build_workload(args, loaded.tokenizer, loaded.config, on_gpu=False)
    engine = e2e.engine_for(args, workload, loaded)
    parents = e2e.prefill_parents(engine, workload)
    sampling = SamplingParams(max_tokens=workload.gen_tokens, ignore_eos=True)
    spec = SpecParams(method="vegas", gamma=2, sparsity=0.2)
    base = e2e.run_workload(engine, workload, sampling, spec, parents=parents)

    seen = {"decode": 0, "compiles": 0}

    def progress(tokens):            # called after each step, before the rate's checks
        if tokens:
            seen["decode"] += 1
            seen["compiles"] += seen["decode"] == 2     # "a kernel compiled in the second step"
            if seen["decode"] == 3:  # its chain timed across that compile, as on a GPU
                engine.core.phase_totals["draft_ms"] += 1e6
    got = e2e.run_workload(engine, workload, sampling, spec, progress=progress, parents=parents,
                           compiles=lambda: seen["compiles"])
    assert got.warmup_steps == base.warmup_steps + 1
    assert got.decode_steps == base.decode_steps - 1 and got.outputs == base.outputs
    # The step after it counts for the rate, not for the phase times.
    assert got.draft_ms < 1e3 and got.phase_steps < base.phase_steps

    calls = []
    before = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append(kw)
    try:
        with common.TritonCompiles() as compiles:
            triton.knobs.runtime.jit_post_compile_hook(key="k", repr="r")
            triton.knobs.runtime.jit_post_compile_hook(key="k2", repr="r")
        assert compiles.count == 2 and len(calls) == 2              # counted, and chained
        assert triton.knobs.runtime.jit_post_compile_hook is not compiles._hook   # given back
    finally:
        triton.knobs.runtime.jit_post_compile_hook = before


def test_print_sweep_lists_each_group_with_its_fastest(capsys):
    from vegas_core.bench.kernels import print_sweep
    recs = [dict(kernel="verify_attention", collect="none", q_rows=8, config={"a": 1}, us=10.0),
            dict(kernel="verify_attention", collect="none", q_rows=8, config={"a": 2}, us=7.5),
            dict(kernel="verify_attention", collect="none", q_rows=1, config={"a": 3}, us=1.0),
            dict(kernel="verify_attention", collect="c2q", q_rows=8, config={"a": 4}),    # failed: no time
            dict(kernel="verify_attention", collect="c2q", q_rows=8, config={"a": 5}, us=9.0)]
    print_sweep("order_tune", "smollm2", recs, [("verify_attention", "none", 8), ("verify_attention", "c2q", None)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["order_tune smollm2 verify_attention none rows 8: {'a': 1} 10.0 us, {'a': 2} 7.5 us; best {'a': 2}",
                     "order_tune smollm2 verify_attention c2q: {'a': 5} 9.0 us; best {'a': 5}"]


def test_page_tables_place_each_request_as_named():
    from vegas_core.bench.kernels import PLACEMENTS, page_tables
    batch, per = 4, 6
    seen = {}
    for placement in PLACEMENTS:
        tables, pool = page_tables(batch, per, placement, spread=8)
        assert tables.shape == (batch, per) and tables.dtype == torch.int32
        flat = tables.flatten().tolist()
        assert len(set(flat)) == batch * per and 0 <= min(flat) and max(flat) < pool   # no page twice
        seen[placement] = (tables, pool)
    seq, _ = seen["sequential"]
    assert (seq[:, 1:] - seq[:, :-1] == 1).all()           # consecutive pages of a request adjoin
    inter, _ = seen["interleaved"]
    assert (inter[:, 1:] - inter[:, :-1] == batch).all() and inter[:, 0].tolist() == list(range(batch))
    assert seen["shuffled"][1] == batch * per and seen["scattered"][1] == 8 * batch * per
    assert not (seen["shuffled"][0][:, 1:] - seen["shuffled"][0][:, :-1] == 1).all()
    with pytest.raises(ValueError, match="placement"):
        page_tables(batch, per, "random")


def test_head_major_pages_are_a_strided_view_the_kernels_read():
    """`paged_case(layout="head-major")` stores one KV head's keys of a page contiguously but is
    indexed [block, offset, KV head, dim] like the engine's pool, so the kernels take it through
    their strides alone: verify_attention (interpreter, float32) matches the reference on it."""
    from vegas_core.kernels.verify_attention import verify_attention, verify_attention_reference
    from vegas_core.bench.kernels import paged_case
    k, v, tables, _ = paged_case(2, 200, 3, 16, 16, "cpu", dtype=torch.float32, layout="head-major")
    assert k.shape == (26, 16, 3, 16) and k.stride() == (768, 16, 256, 1)    # offset, then head
    ctx = torch.tensor([200, 77], dtype=torch.int32)
    loc = torch.tensor([0, 8, 9], dtype=torch.int32)
    q = torch.randn(9, 9, 16)
    want = verify_attention_reference(q, k, v, tables, ctx, loc, 0.25)[0]
    got = verify_attention(q, k, v, tables, ctx, loc, 0.25, num_splits=2)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="layout"):
        paged_case(1, 16, 1, 16, 16, "cpu", layout="slot-major")


def test_frozen_heap_hides_what_lives_and_gives_it_back():
    """Inside `frozen_heap` the objects alive at its start are out of the collector's
    generations (a full collection does not walk them); on exit they are back, so an object
    that dies later in a reference cycle is still collected."""
    import gc
    import weakref

    from vegas_core.bench.common import frozen_heap

    class Node:
        pass
    before = Node()
    before.self = before                  # a cycle: only the collector can free it
    with frozen_heap():
        assert gc.get_freeze_count() > 0 and not any(o is before for o in gc.get_objects())
    assert any(o is before for o in gc.get_objects())
    gone = weakref.ref(before)
    del before
    gc.collect()
    assert gone() is None
    # Inside a heap frozen already (the app's worker, whose live sweep measures through here), it
    # stays frozen on exit.
    gc.freeze()
    try:
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_tuned_settings_from_several_files_are_read_together(tmp_path):
    """One tune per group of methods (each within a device call's time): e2e reads them as one;
    a method tuned in two files, or a file for another model, is an error, not a silent pick."""
    from vegas_core.bench.e2e import find_tuned

    def tune_file(name, model, tuned):
        path = tmp_path / name
        path.write_text(json.dumps(dict(model_name=model, complete=True, tuned=tuned)))
        return str(path)

    a = tune_file("a.json", "m", {"stream/layer": {"gamma": 8, "sparsity": 0.05}})
    b = tune_file("b.json", "m", {"vegas/layer": {"gamma": 6, "sparsity": 0.07}})
    tuned, source = find_tuned([a, b], str(tmp_path), "m", None)
    assert tuned == {"stream/layer": {"gamma": 8, "sparsity": 0.05}, "vegas/layer": {"gamma": 6, "sparsity": 0.07}}
    assert source == f"{a}; {b}"
    with pytest.raises(SystemExit, match="stream/layer already tuned"):
        find_tuned([a, a], str(tmp_path), "m", None)
    with pytest.raises(SystemExit, match="tuned for other"):
        find_tuned([tune_file("c.json", "other", {})], str(tmp_path), "m", None)


def test_profile_writes_each_methods_operators_largest_first(tmp_path, tiny_model):
    argv = ["profile", "--model", tiny_model, "--device", "cpu", "--workload", "small", "--batch", "2",
            "--gen-tokens", "24", "--steps", "2", "--methods", "vanilla", "vegas", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = _load(tmp_path, "profile")
    assert [r["method"] for r in doc["records"]] == ["vanilla", "vegas"]
    for r in doc["records"]:
        assert r["steps"] == 2 and r["tokens"] >= 2 and r["wall_ms"] > 0
        assert r["busy_ms"] is None                       # a CPU: operators' own time, no GPU busy time
        ms = [k["ms"] for k in r["kernels"]]
        assert ms == sorted(ms, reverse=True) and ms[0] > 0
        assert abs(sum(k["share"] for k in r["kernels"]) - 1) < 1e-6
        assert any("mm" in k["name"] or "linear" in k["name"] for k in r["kernels"][:10])


def test_profile_busy_time_is_the_union_of_kernel_intervals():
    from vegas_core.bench.profile import _union_us
    assert _union_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert _union_us([]) == 0


def test_app_bench_reports_the_median_run_and_the_median_ratio():
    from vegas_core.bench.app import _median, _median_of
    mid = _median([dict(tokens_per_s=3.0), dict(tokens_per_s=1.0), dict(tokens_per_s=2.0)])
    assert mid["tokens_per_s"] == 2.0 and mid["runs_tokens_per_s"] == [1.0, 2.0, 3.0]
    assert _median_of([0.8, None, 1.1, 0.9]) == 0.9 and _median_of([None]) is None
    assert _median_of([0.8, 1.2]) == pytest.approx(1.0)


def test_app_bench_step_timeline_keeps_the_window_in_ms_or_says_it_lost_the_start():
    from vegas_core.bench.app import step_timeline
    log = [dict(start=9.0, end=9.5, kind="decode", rows=2, tokens=2),      # ended before the window
           dict(start=9.9, end=10.01, kind="prefill", rows=3, tokens=96),  # overlaps its start
           dict(start=10.02, end=10.03, kind="decode", rows=3, tokens=3),
           dict(start=11.5, end=11.6, kind="decode", rows=1, tokens=1)]    # after its end
    assert step_timeline(log, 10.0, 11.0) == [[-100.0, 10.0, "prefill", 3, 96], [20.0, 30.0, "decode", 3, 3]]
    assert step_timeline(log[2:], 10.0, 11.0) is None     # the log no longer reaches back to the start
    assert step_timeline([], 10.0, 11.0) is None


def test_app_bench_counts_a_process_s_processor_time():
    """`_cpu_s` (what each of the app's processes and the clients took in a phase) follows this
    process's own count, and a process that is gone counts nothing."""
    import os
    import time

    from vegas_core.bench.app import _cpu_s
    before, t0 = _cpu_s([os.getpid()]), time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    assert _cpu_s([os.getpid()]) - before == pytest.approx(time.process_time() - t0, abs=0.05)
    assert _cpu_s([2 ** 22 + 1]) == 0


def test_app_bench_stops_the_app_while_the_engine_alone_runs():
    """The engine alone's reference is measured with the app's processes and its clients stopped
    (an idle Gradio server polls its queue), and they run on afterwards."""
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from vegas_core.bench.app import AppServer, _cpu_s
    spin = [sys.executable, "-c", "while True: pass"]
    server, client = subprocess.Popen(spin), subprocess.Popen(spin)
    try:
        app = AppServer.__new__(AppServer)
        app.proc, app.clients = server, SimpleNamespace(procs=[client])
        time.sleep(0.3)
        with app.stopped() as pids:
            assert pids == [server.pid, client.pid]
            time.sleep(0.1)
            before = _cpu_s(pids)
            time.sleep(0.5)
            assert _cpu_s(pids) - before < 0.05
        before = _cpu_s(pids)
        time.sleep(0.5)
        assert _cpu_s([server.pid]) > 0 and _cpu_s(pids) - before > 0.3
    finally:
        server.kill()
        client.kill()


def test_app_bench_times_the_engine_alone_to_its_first_token(tiny_model):
    """The engine alone at batch n, the app's reference: its rate and when its first token came
    out (the start the app's clients pay too, so a shortfall can be placed at the start or after)."""
    import argparse

    from vegas_core.bench import app
    from vegas_core.loader import load_model
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    args = p.parse_args(["--model", tiny_model, "--device", "cpu", "--methods", "vanilla", "vegas",
                         "--clients", "2", "--max-tokens", "6", "--repeats", "1"])
    loaded = load_model(tiny_model)
    prompts = ["The first prompt", "A second, longer prompt to prefill"]
    with app.EngineAlone(args, loaded, prompts) as engine:
        for method in ("vanilla", "vegas"):
            engine.warm(method)
            n = engine.batch(method)
            assert n["tokens"] == 12 and n["tokens_per_s"] == pytest.approx(12 / n["wall_s"])
            assert 0 < n["ttft_s"] < n["wall_s"]
            # Its steps, in ms from the call: both prompts prefilled before the first decode, which
            # gives each its first token; every token from a decode step.
            kinds = [s[2] for s in n["steps"]]
            assert kinds[0] == "prefill" and "prefill" not in kinds[kinds.index("decode"):]
            assert sum(s[4] for s in n["steps"] if s[2] == "decode") == 12
            assert all(0 <= s[0] <= s[1] <= 1e3 * n["wall_s"] for s in n["steps"])
            assert engine.alone(method)["tokens_per_s"] > 0
    traced = app.EngineAlone(args, loaded, prompts, trace=True)
    assert traced.engine.core.options.trace
    assert traced.median_alone("vegas")["tokens_per_s"] > 0
    traced.close()


def test_linear_names_each_projection_of_the_layer_and_needs_a_gpu(capsys, tiny_model):
    from vegas_core.bench.linear import model_shapes
    from vegas_core.loader import load_model
    cfg = load_model(tiny_model).config
    shapes = {s["name"]: s for s in model_shapes(cfg)}
    assert shapes["qkv"]["n"] == (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    assert (shapes["gate_up"]["n"], shapes["gate_up"]["kind"]) == (cfg.intermediate_size, "silu")
    assert (shapes["down_proj"]["n"], shapes["down_proj"]["k"]) == (cfg.hidden_size, cfg.intermediate_size)
    assert main(["linear", "--model", tiny_model, "--device", "cpu"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_sampling_checks_both_top_k_paths_and_needs_a_gpu(capsys, monkeypatch):
    from vegas_core.bench import kernels, sampling
    monkeypatch.setattr(kernels, "_bench", lambda fn: 1.0)      # the interpreter is not timed
    recs = sampling.records_for("qwen-card", 3, 8192, list(sampling.PATHS), [4], [8], 3.0,
                                torch.device("cpu"))
    assert [r["topk_path"] for r in recs] == ["candidates", "search"]
    for r in recs:
        assert r["kept_set_mismatch_rows"] == r["token_mismatch_rows"] == 0 and r["max_prob_diff"] < 1e-6
        assert 1 <= r["mean_kept"] <= 20 and r["mean_kept"] <= r["mean_candidates"]
    assert recs[0]["mean_candidates"] >= 20                      # top-k's: at least k a row
    assert main(["sampling", "--device", "cpu"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_burst_counts_the_prefill_steps_a_budget_makes_and_the_first_token(tiny_model, tmp_path):
    """All at once, a budget that holds every prompt takes one prefill step and a small one several;
    spaced arrivals add each request as it comes due, so its steps follow the arrivals. Every
    request generates its tokens; the first token comes after the prefill, before the end."""
    import json
    assert main(["burst", "--model", tiny_model, "--device", "cpu", "--requests", "3", "--prompt-tokens", "40",
                 "--max-tokens", "5", "--budgets", "32", "4096", "--gaps-ms", "0", "20", "--repeats", "1",
                 "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("burst-*.json")).read_text())
    recs = {(r["budget"], r["gap_ms"]): r for r in doc["records"]}
    assert set(recs) == {(32, 0.0), (32, 20.0), (4096, 0.0), (4096, 20.0)}
    for r in recs.values():
        assert r["tokens"] == 15 and r["tokens_per_s"] == pytest.approx(15 / (r["wall_ms"] / 1e3))
        assert 0 < r["first_token_ms"] < r["wall_ms"]
        assert sum(s[4] for s in r["steps"] if s[2] == "decode") == 15
    assert recs[(4096, 0.0)]["prefill_steps"] == 1
    assert recs[(32, 0.0)]["prefill_steps"] >= 3 * 2          # every prompt is over 32 tokens
    # 20 ms apart, the later arrivals wait for a step already running (two may share the next)
    assert recs[(4096, 20.0)]["prefill_steps"] >= 2
    assert doc["requests"] == 3 and doc["prompt_tokens"] == 40
    assert main(["burst", "--model", tiny_model, "--device", "cpu", "--requests", "0", "--out", str(tmp_path)]) == 2
