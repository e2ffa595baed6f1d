from visualizations import (accepted_length_histogram, breakdown_figure, per_position_acceptance_figure,
                            running_mean_figure, step_breakdown)


def test_per_position_acceptance(trace, vanilla):
    fig = per_position_acceptance_figure({"vegas": trace, "vanilla": vanilla})
    assert len(fig.data) == 1 and fig.data[0].name == "vegas"     # vanilla has no speculative iterations
    assert list(fig.data[0].y) == [1.0, 1.0, 0.5]                  # 2 of 3, then 3 of 3 accepted


def test_histogram_counts_accepted_lengths(trace):
    fig = accepted_length_histogram({"vegas": trace})
    assert list(fig.data[0].customdata) == [0, 0, 1, 1] and list(fig.data[0].y) == [0, 0, 0.5, 0.5]


def test_running_mean(trace):
    fig = running_mean_figure({"vegas": trace})
    assert list(fig.data[0].y) == [3.0, 3.5]                       # 1 + 2/1, 1 + 5/2


def test_empty_runs_explain_themselves(vanilla):
    for builder in (per_position_acceptance_figure, accepted_length_histogram, running_mean_figure):
        assert builder({"vanilla": vanilla}).layout.meta["empty"]


def test_breakdown_per_step(trace, vanilla):
    bd = step_breakdown(trace)
    assert bd["steps"] == 3 and abs(bd["draft"] - 8 / 3) < 1e-9 and abs(bd["verify"] - 17 / 3) < 1e-9
    fig = breakdown_figure({"vegas": trace, "vanilla": vanilla})
    assert [t.name for t in fig.data] == ["draft", "select", "verify"]
    assert list(fig.data[2].y) == ["vegas", "vanilla"] and fig.data[2].x[1] == 5.0
