"""The views a run opens on (`Studio.refresh_views`), the run selector, the KV controls, provenance and
the feedback for wrong input, driven through replayed hand-made traces: no model, no browser."""
from __future__ import annotations

import json

from vegas_core.trace import Iteration
from vegas_core.trace.io import save_trace
from vegas_studio_app.studio import Studio
from tests.visualizations.conftest import spec_trace, vanilla_trace


def _studio(tmp_path):
    return Studio(None, results_dir=str(tmp_path), export_root=str(tmp_path / "exports"))


def _replay(studio, tmp_path, trace, name="run.trace.json"):
    path = tmp_path / name
    save_trace(trace, path)
    status = studio.replay(str(path))[0]
    assert status.startswith("Replaying"), status
    return studio.refresh_views()


def _refresh(tmp_path, trace):
    return _replay(_studio(tmp_path), tmp_path, trace)


def test_a_run_whose_last_iteration_drafted_nothing_opens_on_its_last_selection(tmp_path):
    # A run that ends with one token left to emit ends on a plain decode step: no drafts, no selection.
    trace = spec_trace(output=[10, 11, 12, 14, 15, 16, 17, 18, 19])
    trace.requests[0].iterations.append(Iteration(
        index=3, step=5, position=13, drafts=[], num_accepted=0, emitted=[19], final_token=19,
        final_kind="decode", verify_ms=5.0, start_s=0.05))
    _, _, it_update, _, overview, zoom, *_ = _refresh(tmp_path, trace)
    assert it_update["value"] == 3 and it_update["maximum"] == 4 and it_update["minimum"] == 1   # from 1
    assert overview.data and overview.data[0].type == "heatmap"     # a selection, not the "drafted nothing" note
    assert len(overview.data[0].z) == 4 * 2                        # 4 layers x 2 KV heads (kv-head granularity)
    assert zoom.data


def test_a_run_that_ends_on_a_selection_opens_on_its_last_iteration(tmp_path):
    _, _, it_update, *_ = _refresh(tmp_path, spec_trace())
    assert it_update["value"] == 3 and it_update["maximum"] == 3


def test_a_vanilla_run_opens_on_its_last_iteration_and_says_nothing_was_selected(tmp_path):
    _, _, it_update, _, overview, *_ = _refresh(tmp_path, vanilla_trace())
    assert it_update["value"] == 8
    assert not overview.data and "drafted nothing" in overview.layout.annotations[0].text


def test_every_figure_names_its_settings_and_source(tmp_path):
    out = _refresh(tmp_path, spec_trace())
    overview, zoom, acc_pos, breakdown = out[4], out[5], out[8], out[11]
    for fig in (overview, zoom, acc_pos, breakdown):
        assert fig.layout.meta["provenance"] == "from run.trace.json, " + spec_trace().created[:10] + ", cpu"
        assert "tiny · vegas · γ 3 · sparsity 0.5 · prompt 6 tokens · cpu" in fig.layout.title.subtitle.text


def test_run_selector_keeps_prompts_apart_and_the_kv_view_resets_only_with_the_run(tmp_path):
    studio = _studio(tmp_path)
    _replay(studio, tmp_path, spec_trace(), "a.trace.json")
    other = spec_trace(method="stream")
    other.requests[0].prompt_token_ids = [1, 2, 3, 4, 5, 9]          # another prompt
    views = _replay(studio, tmp_path, other, "b.trace.json")
    run_u = views[0]
    assert [v for _, v in run_u["choices"]] == ["2", "1"] and run_u["value"] == "2"
    assert [t.name for t in views[8].data] == ["stream (#2)"]        # not the other prompt's run
    # Move the KV controls, refresh (as after a compare): kept; pick the other run: reset to its last.
    views = studio.refresh_views("r0", 2, 1, 4)
    assert views[2]["value"] == 2 and views[3]["value"] == 1
    studio.select_run("1")
    views = studio.refresh_views("r0", 2, 1, 4)
    assert views[0]["value"] == "1" and views[2]["value"] == 3 and views[3]["value"] == 5   # 9 - 4


def test_zoom_start_from_a_longer_run_is_clamped_to_a_full_window(tmp_path):
    studio = _studio(tmp_path)
    _replay(studio, tmp_path, spec_trace())
    overview, zoom, *_ = studio.render_kv("r0", 3, 500, 4)
    assert zoom.layout.meta["start"] == 5 and zoom.layout.meta["stop"] == 9      # iteration 3: 9 positions


def test_pause_and_step_with_nothing_loaded_say_so(tmp_path):
    studio = _studio(tmp_path)
    for out in (studio.step(), studio.pause("Pause")):
        assert "Nothing to" in out[2] and "press Generate" in out[2]
        assert "paused at iteration 0" not in out[2]


def test_wrong_files_are_named(tmp_path):
    studio = _studio(tmp_path)
    png = tmp_path / "figure.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    assert "figure.png is a PNG image, not a trace" in studio.replay(str(png))[0]
    perfetto = tmp_path / "run.perfetto.json"
    perfetto.write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms"}))
    msg = studio.replay(str(perfetto))[0]
    assert "Perfetto / Chrome timeline" in msg and "schema_version is None" not in msg


def test_download_all_zips_traces_tables_and_figures(tmp_path, monkeypatch):
    import zipfile

    import plotly.io as pio

    def no_browser(*a, **k):
        raise RuntimeError("no browser in this test")
    monkeypatch.setattr(pio, "write_images", no_browser)      # figures as HTML here; PNG 3x in test_export.py
    studio = _studio(tmp_path)
    _replay(studio, tmp_path, spec_trace())
    [path], note = studio.download_all("r0", 3, 0, 128)
    names = zipfile.ZipFile(path).namelist()
    assert "vegas-run1-replay-vegas.trace.json" in names and "vegas-run1-replay-vegas.iterations.csv" in names
    assert "figures/kv-selection-overview.html" in names and "manifest.json" in names
