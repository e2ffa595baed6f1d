"""The live sweep's figure: tokens/s against batch, a panel per context, vanilla / stream / vegas and
the bandwidth bound in each panel, refused cells named, labelled with the device and the time."""
from visualizations.sweep import live_label, sweep_figure

BOUND = {(1, 1024): 3000.0, (64, 1024): 60000.0, (1, 8192): 2900.0, (64, 8192): 22000.0}
RATES = {(1, 1024): (950, 900, 905), (64, 1024): (40000, 52000, 50000),
         (1, 8192): (800, 590, 800), (64, 8192): (15800, 28000, 31000)}


def _record(batch, context, refused=None):
    if refused:
        return dict(batch=batch, context=context, prompt_tokens=context - 128, refused=refused, bound=None,
                    methods={})
    bound = dict(tokens_per_s=BOUND[batch, context], copy_TBps=4.2, mean_context=context - 64.0)
    rates = dict(zip(("vanilla", "stream", "vegas"), RATES[batch, context]))
    return dict(batch=batch, context=context, prompt_tokens=context - 128, refused=None, bound=bound,
                methods={m: dict(tokens_per_s=r, of_bound=r / bound["tokens_per_s"],
                                 speedup_vs_vanilla=r / rates["vanilla"], mean_acceptance_length=None
                                 if m == "vanilla" else 4.5) for m, r in rates.items()})


def _doc(records, **extra):
    return dict(date="2026-12-07T10:31:52+01:00", device="cuda: NVIDIA H100 80GB HBM3",
                model="SmolLM2-135M-Instruct", dtype="bfloat16", mode="deterministic", traced=True,
                grid=dict(batches=[1, 16, 64], contexts=[1024, 8192], gen_tokens=128),
                methods=["vanilla", "stream", "vegas"],
                settings=dict(gamma=4, sparsity=0.07, min_budget=16, granularity="layer"),
                records=records, **{"complete": True, "stopped": False, **extra})


def test_each_panel_draws_every_method_and_the_bandwidth_bound():
    refused = "batch 16 × 8,192 tokens needs 9,000 KV pages; the pool has 8,000 free"
    doc = _doc([_record(1, 1024), _record(64, 1024), _record(1, 8192), _record(16, 8192, refused),
                _record(64, 8192)])
    fig = sweep_figure(doc)
    assert [a.text for a in fig.layout.annotations[:2]] == ["context 1K", "context 8K"]
    for axis, context in (("x", 1024), ("x2", 8192)):
        traces = {t.name: t for t in fig.data if t.xaxis == axis}
        assert list(traces) == ["bandwidth bound", "vanilla", "stream", "vegas"]
        assert list(traces["bandwidth bound"].x) == [1, 64]
        assert list(traces["bandwidth bound"].y) == [BOUND[1, context], BOUND[64, context]]
        assert list(traces["vegas"].y) == [RATES[1, context][2], RATES[64, context][2]]
    # The point of the view: at 64 x 8K vegas is above the bound, at batch 1 nothing speculative wins.
    panel = {t.name: t for t in fig.data if t.xaxis == "x2"}
    assert panel["vegas"].y[-1] > panel["bandwidth bound"].y[-1] > panel["vanilla"].y[-1]
    assert [t.showlegend for t in fig.data].count(True) == 4       # one legend entry per line
    assert fig.layout.xaxis.type == fig.layout.yaxis2.type == "log"
    assert "batch 16 × 8K (" + refused + ")" in fig.layout.annotations[-1].text.replace("<br>", " ")
    sub = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "measured live on cuda: NVIDIA H100 80GB HBM3 at 2026-12-07 10:31 +01:00" in sub
    assert "SmolLM2-135M-Instruct · bfloat16 · batch-invariant kernels · trace recorded · γ 4" in sub
    assert fig.layout.meta["refused"] == 1 and fig.layout.meta["provenance"].startswith("measured live on")


def test_a_running_or_stopped_sweep_says_so_and_an_empty_panel_says_why():
    running = _doc([_record(1, 1024)], complete=False)
    fig = sweep_figure(running)
    assert "(running)" in fig.layout.meta["provenance"]
    assert any(a.text == "not reached" for a in fig.layout.annotations)     # the 8K panel
    stopped = _doc([_record(1, 1024)], complete=False, stopped=True)
    assert "(stopped" in live_label(stopped)
    assert live_label(_doc([]), cached=True).endswith("cached, Run sweep measures again")


def test_without_a_sweep_the_figure_says_how_to_get_one():
    fig = sweep_figure(None)
    assert fig.layout.meta["empty"] and "Run sweep" in fig.layout.meta["message"]
    assert sweep_figure(_doc([]), "x").layout.meta["message"] == "The sweep has not measured a cell yet."
