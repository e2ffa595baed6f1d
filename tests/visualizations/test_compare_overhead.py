import json

from tests.visualizations.conftest import OUTPUT, spec_trace, vanilla_trace
from visualizations import (compare_rows, compare_table_html, first_divergence, load_kernel_results,
                            lossless_check, overhead_figure, pick_kernel_results)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_lossless_pass_and_table(trace, vanilla):
    runs = {"vanilla": vanilla, "vegas": trace}
    check = lossless_check(runs)
    assert check["applicable"] and check["passed"] and check["results"]["vegas"]["divergence"] is None
    html = compare_table_html(runs)
    assert "data-lossless='pass'" in html and "✔ identical" in html
    rows = compare_rows(runs)
    assert [r["method"] for r in rows] == ["vanilla", "vegas"] and rows[1]["mean_acceptance_length"] == 3.5


def test_lossless_failure_shows_where():
    bad = OUTPUT[:4] + [19] + OUTPUT[5:]
    runs = {"vanilla": vanilla_trace(), "vegas": spec_trace(output=bad)}
    check = lossless_check(runs)
    assert check["passed"] is False and check["results"]["vegas"]["divergence"] == 4
    assert check["results"]["vegas"]["token"] == "?" and check["results"]["vegas"]["ref_token"] == " It"
    html = compare_table_html(runs)
    assert "data-lossless='fail'" in html and "differs at token 4" in html


def test_lossless_not_applicable_when_sampling():
    runs = {"vanilla": vanilla_trace(), "vegas": spec_trace(temperature=0.8)}
    assert lossless_check(runs)["passed"] is None
    assert "data-lossless='n/a'" in compare_table_html(runs)


def test_overhead_without_results_says_so(tmp_path):
    assert load_kernel_results(tmp_path) == []
    fig = overhead_figure(None)
    assert fig.layout.meta["empty"] and "No kernel benchmark results yet" in fig.layout.meta["message"]


def test_overhead_from_results_file(tmp_path):
    recs = []
    for rows in (2, 8, 16):
        for collect, us in (("none", 100.0), ("first_last", 102.0), ("all", 100.0 + 5 * rows)):
            recs.append(dict(kernel="verify_attention", batch=64, context=8192, q_rows=rows, heads=9, kv_heads=3,
                             head_dim=64, collect=collect, us=us, read_TBps=3.5))
    # A tuning trial at the same shape (another tile size, slower) is not part of the curve.
    recs.append(dict(kernel="verify_attention", sweep="tune", batch=64, context=8192, q_rows=16, heads=9,
                     kv_heads=3, head_dim=64, collect="none", us=500.0))
    (tmp_path / "kernels-2026-01-02-H200.json").write_text(json.dumps({"device": "NVIDIA H200", "records": recs}))
    (tmp_path / "kernels-broken-x.json").write_text("{not json")
    [res] = load_kernel_results(tmp_path)
    assert res.device == "NVIDIA H200" and res.date == "2026-01-02"
    fig = overhead_figure(res)
    by_name = {t.name.split(" ")[0]: t for t in fig.data}
    assert list(by_name["Collect-2-Query"].x) == [2, 8, 16]
    assert [round(y, 6) for y in by_name["Collect-2-Query"].y] == [2.0, 2.0, 2.0]
    assert [round(y, 6) for y in by_name["all"].y] == [10.0, 40.0, 80.0]
    prov = fig.layout.meta["provenance"]
    assert "NVIDIA H200" in prov and "2026-01-02" in prov and prov in fig.layout.title.subtitle.text


def test_the_overhead_view_picks_the_newest_file_that_draws_the_curve(tmp_path):
    def recs(rows_list):
        return [dict(kernel="verify_attention", batch=64, context=8192, q_rows=rows, heads=9, kv_heads=3,
                     head_dim=64, collect=collect, us=us)
                for rows in rows_list for collect, us in (("none", 100.0), ("c2q", 110.0), ("all", 150.0))]
    for name, rows in (("kernels-2026-12-03-h200-run9.json", (1, 2, 8, 16)),
                       ("kernels-2026-12-03-h200-run10.json", (1, 2, 4, 8, 12, 16)),
                       ("kernels-2026-12-04-h200-run11-probe.json", (1, 8))):     # a probe: two row counts
        (tmp_path / name).write_text(json.dumps({"device": "cuda: NVIDIA H200", "records": recs(rows)}))
    results = load_kernel_results(tmp_path)
    assert results[0].path.endswith("run11-probe.json")
    assert pick_kernel_results(results).path.endswith("run10.json")
    assert pick_kernel_results(results[:1]).path.endswith("run11-probe.json")   # nothing better: the newest
    assert pick_kernel_results([]) is None


def test_verdict_waits_for_every_method(trace, vanilla):
    html = compare_table_html({"vanilla": vanilla, "vegas": trace}, expected=["vanilla", "stream", "vegas"])
    assert "data-lossless='pending'" in html and "waiting for stream" in html and "passed" not in html


def test_times_vanilla_columns(trace, vanilla):
    rows = {r["method"]: r for r in compare_rows({"vanilla": vanilla, "vegas": trace})}
    assert rows["vanilla"]["speedup"] == 1.0 and rows["vanilla"]["iteration_time_ratio"] == 1.0
    assert rows["vegas"]["speedup"] == trace.requests[0].decode_tokens_per_s / vanilla.requests[0].decode_tokens_per_s
    # vegas: (3+1+6, 5+1+6, 0+0+5) ms over 3 steps; vanilla: 5 ms a step
    assert abs(rows["vegas"]["iteration_time_ratio"] - (27 / 3) / 5) < 1e-9


def test_token_diff_when_outputs_differ():
    bad = OUTPUT[:4] + [19] + OUTPUT[5:]
    html = compare_table_html({"vanilla": vanilla_trace(), "vegas": spec_trace(output=bad)})
    assert "class='vs-diff' data-method='vegas'" in html
    assert "<del data-side='vanilla' style='background:#ffc9c9'> It</del>" in html
    assert "<ins data-side='vegas' style='background:#b2f2bb'>?</ins>" in html


def test_sampled_compare_says_what_lossless_means():
    html = compare_table_html({"vanilla": vanilla_trace(), "vegas": spec_trace(temperature=0.8)})
    assert "same distribution, not identical text" in html and "test_sampled_lossless.py" in html
