import numpy as np

from tests.visualizations.conftest import HEAD_SETS, LAYER_SETS, LAYERS
from visualizations import prompt_selection_html, recall_figure, selection_heatmaps, selection_matrix


def test_matrix_marks_selected_and_recent_positions(trace):
    it = trace.requests[0].iterations[1]          # base 6, position 6
    mat, labels = selection_matrix(it, LAYERS, 2)
    assert mat.shape == (LAYERS, 6) and labels == ["L0", "L1", "L2", "L3"]
    for layer, sel in enumerate(LAYER_SETS):
        assert sorted(np.flatnonzero(mat[layer] == 1).tolist()) == sel
    it2 = trace.requests[0].iterations[2]         # kv-head, base 8, position 9
    mat2, labels2 = selection_matrix(it2, LAYERS, 2)
    assert mat2.shape == (LAYERS * 2, 9) and labels2[:2] == ["L0·h0", "L0·h1"]
    assert (mat2[:, 8] == 2).all()                # recent
    assert np.flatnonzero(mat2[4] == 1).tolist() == HEAD_SETS[2][0]
    assert not (mat2[5] == 1).any()               # an empty head set


def test_heatmaps_hold_the_selection_and_token_text(trace):
    overview, zoom = selection_heatmaps(trace, 0, 1, max_cols=3, window=4)
    z = np.array(overview.data[0].z)
    assert z.shape == (LAYERS, 3)                 # 6 positions binned to 3 columns
    assert np.allclose(z[0], [1.0, 0.0, 0.0])     # layer 0 selected 0 and 1
    assert np.allclose(z[1], [0.5, 0.0, 0.5])
    zz = np.array(zoom.data[0].z)
    assert list(zoom.data[0].x) == [2, 3, 4, 5] and zz[2].tolist() == [1, 1, 1, 0]
    assert list(zoom.data[0].customdata[0]) == [" brown", " fox", " jumps", " over"]
    assert "quick" in overview.data[0].customdata[0][0]


def test_heatmap_explains_iterations_without_selection(trace):
    overview, zoom = selection_heatmaps(trace, 0, 0)
    assert overview.layout.meta["empty"] and "drafted nothing" in overview.layout.meta["message"]


def test_prompt_coloured_by_layer_count(trace):
    html = prompt_selection_html(trace, 0, 1)
    # Position 0 is selected by layers 0, 1 and 3; position 5 by layer 1 only.
    assert 'data-pos="0" data-layers="3"' in html and 'data-pos="5" data-layers="1"' in html
    assert 'data-pos="2" data-layers="1"' in html and "The" in html
    kv = prompt_selection_html(trace, 0, 2)          # kv-head: heads averaged per layer
    assert 'data-pos="0" data-layers="1.5"' in kv and 'data-pos="8" data-recent="1"' in kv


def test_recall_per_layer(trace):
    fig = recall_figure(trace, 0, 1)
    assert list(fig.data[0].y) == [0.9, 0.8, 0.7, 0.6]
    assert recall_figure(trace, 0, 2).layout.meta["empty"]
