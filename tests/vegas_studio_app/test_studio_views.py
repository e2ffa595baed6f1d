"""The views a finished run opens on (`Studio.refresh_views`), driven through a replayed hand-made trace:
no model, no browser."""
from __future__ import annotations

from vegas_core.trace import Iteration
from vegas_core.trace.io import save_trace
from vegas_studio_app.studio import Studio
from tests.visualizations.conftest import spec_trace, vanilla_trace


def _refresh(tmp_path, trace):
    path = tmp_path / "run.trace.json"
    save_trace(trace, path)
    studio = Studio(None, results_dir=str(tmp_path), export_root=str(tmp_path / "exports"))
    status = studio.replay(str(path))[0]
    assert status.startswith("Replaying"), status
    return studio.refresh_views()


def test_a_run_whose_last_iteration_drafted_nothing_opens_on_its_last_selection(tmp_path):
    # A run that ends with one token left to emit ends on a plain decode step: no drafts, no selection.
    trace = spec_trace(output=[10, 11, 12, 14, 15, 16, 17, 18, 19])
    trace.requests[0].iterations.append(Iteration(
        index=3, step=5, position=13, drafts=[], num_accepted=0, emitted=[19], final_token=19,
        final_kind="decode", verify_ms=5.0, start_s=0.05))
    _, it_update, _, overview, zoom, *_ = _refresh(tmp_path, trace)
    assert it_update["value"] == 2 and it_update["maximum"] == 3
    assert overview.data and overview.data[0].type == "heatmap"     # a selection, not the "drafted nothing" note
    assert len(overview.data[0].z) == 4 * 2                        # 4 layers x 2 KV heads (kv-head granularity)
    assert zoom.data


def test_a_run_that_ends_on_a_selection_opens_on_its_last_iteration(tmp_path):
    _, it_update, *_ = _refresh(tmp_path, spec_trace())
    assert it_update["value"] == 2 and it_update["maximum"] == 2


def test_a_vanilla_run_opens_on_its_last_iteration_and_says_nothing_was_selected(tmp_path):
    _, it_update, _, overview, *_ = _refresh(tmp_path, vanilla_trace())
    assert it_update["value"] == 7
    assert not overview.data and "drafted nothing" in overview.layout.annotations[0].text
