"""The end-to-end throughput view: reads e2e result files, picks the engine's device kind, draws
one bar per method and sampling labelled with the speed-up over vanilla."""
import json

from visualizations.throughput import load_e2e_results, method_label, pick_results, throughput_figure


def _write(path, device, date, records):
    path.write_text(json.dumps({"date": date, "device": device, "workload": {"name": "small"}, "records": records}))


def _rec(method, gran, sampling, tps, speed):
    return dict(method=method, granularity=gran, sampling=sampling, tokens_per_s=tps, speedup_vs_vanilla=speed,
                mean_acceptance_length=None if method == "vanilla" else 3.0, gamma=6, sparsity=0.07,
                batch=2, context=445)


def test_reads_picks_and_draws(tmp_path):
    recs = [_rec("vanilla", None, "greedy", 40.0, 1.0), _rec("vegas", "layer", "greedy", 20.0, 0.5),
            _rec("vegas", "kv-head", "greedy", 10.0, 0.25), _rec("vanilla", None, "model-card", 38.0, 1.0)]
    _write(tmp_path / "e2e-2026-11-30-cpu.json", "cpu: Xeon, 2 threads", "2026-11-30", recs)
    _write(tmp_path / "e2e-2026-12-01-h200.json", "cuda: NVIDIA H200", "2026-12-01", recs[:1])
    (tmp_path / "e2e-broken-x.json").write_text("{nope")
    results = load_e2e_results(tmp_path)
    assert [r.date for r in results] == ["2026-12-01", "2026-11-30"]
    assert pick_results(results, "cpu").device.startswith("cpu")
    assert pick_results(results, "cuda").device.startswith("cuda")
    assert pick_results(results, None).date == "2026-12-01"
    fig = throughput_figure(pick_results(results, "cpu"))
    greedy, card = fig.data
    assert (greedy.name, card.name) == ("greedy", "model-card")
    assert list(greedy.x) == ["vanilla", "vegas", "vegas (kv-head)"] and list(greedy.y) == [40.0, 20.0, 10.0]
    assert list(greedy.text) == ["1.00×", "0.50×", "0.25×"]
    sub = fig.layout.title.subtitle.text
    assert "2026-11-30" in sub and "small workload" in sub and "cpu: Xeon" in sub
    assert fig.layout.meta["provenance"].startswith("from bench/results/e2e-")


def test_without_results_says_so(tmp_path):
    assert load_e2e_results(tmp_path) == []
    fig = throughput_figure(None)
    assert fig.layout.meta["empty"] and "bench e2e" in fig.layout.meta["message"]
    assert method_label({"method": "quest", "granularity": "layer"}) == "quest"


def test_picks_the_newest_full_comparison_over_a_later_ab_file(tmp_path):
    full = [_rec(m, "layer", "greedy", 10.0, 1.0) for m in ("vanilla", "stream", "quest", "specextend", "vegas",
                                                              "vegas-all")]
    ab = [_rec(m, "layer", "greedy", 10.0, 1.0) for m in ("vanilla", "stream", "vegas")]
    h200 = "cuda: NVIDIA H200"
    _write(tmp_path / "e2e-2026-12-04-h200-run9-8k.json", h200, "2026-12-04", full)
    _write(tmp_path / "e2e-2026-12-04-h200-run10-8k.json", h200, "2026-12-04", full)
    _write(tmp_path / "e2e-2026-12-04-h200-run10-paab-off-2.json", h200, "2026-12-04", ab)   # named last
    results = load_e2e_results(tmp_path)
    # Digit runs sort as numbers: run10 is newer than run9.
    assert [r.path.rsplit("/", 1)[-1] for r in results][:2] == ["e2e-2026-12-04-h200-run10-paab-off-2.json",
                                                                "e2e-2026-12-04-h200-run10-8k.json"]
    assert pick_results(results, "cuda").path.endswith("run10-8k.json")
    assert pick_results(results, "cpu").path.endswith("run10-8k.json")     # no CPU file: the same choice
    # Only A/B files: the newest of them.
    only_ab = [r for r in results if "paab" in r.path]
    assert pick_results(only_ab, "cuda").path.endswith("paab-off-2.json")
    assert pick_results([], "cuda") is None
    # A subset measured on a later day does not replace a full comparison either.
    _write(tmp_path / "e2e-2026-12-05-a100.json", "cuda: NVIDIA A100", "2026-12-05",
           [_rec(m, "layer", "greedy", 10.0, 1.0) for m in ("vanilla", "vegas")])
    assert pick_results(load_e2e_results(tmp_path), "cuda").path.endswith("run10-8k.json")


def test_the_headline_is_the_largest_full_comparison_not_a_later_small_one(tmp_path):
    """A later full comparison on a small workload (a trace-cost check at batch 2) is not the headline."""
    def full(batch, context):
        return [dict(_rec(m, "layer", "greedy", 10.0, 1.0), batch=batch, context=context)
                for m in ("vanilla", "stream", "quest", "specextend", "vegas", "vegas-all")]
    h200 = "cuda: NVIDIA H200"
    _write(tmp_path / "e2e-2026-12-04-h200-run50-8k.json", h200, "2026-12-04", full(64, 7979))
    _write(tmp_path / "e2e-2026-12-05-h200-run52-8k.json", h200, "2026-12-05", full(64, 7979))
    _write(tmp_path / "e2e-2026-12-06-h200-small-trace-cost.json", h200, "2026-12-06", full(2, 469))
    _write(tmp_path / "e2e-2026-12-06-cpu.json", "cpu: Xeon", "2026-12-06", full(2, 469))
    pick = pick_results(load_e2e_results(tmp_path), "cuda")
    assert pick.path.endswith("run52-8k.json")
    assert pick.choice == "the largest full comparison (batch 64 × 7979 tokens), newest of 2 such"
    assert pick.choice in throughput_figure(pick).layout.title.subtitle.text.replace("<br>", " ")
    assert pick_results(load_e2e_results(tmp_path), "cpu").path.endswith("e2e-2026-12-06-cpu.json")
