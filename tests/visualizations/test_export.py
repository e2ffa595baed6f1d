import plotly.graph_objects as go
import plotly.io as pio

from visualizations.export import write_figures


def test_falls_back_to_self_contained_html_and_says_so(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no browser")

    monkeypatch.setattr(pio, "write_images", broken)
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    files, note = write_figures({"my figure/1": fig}, tmp_path)
    assert [p.rsplit("/", 1)[-1] for p in files] == ["my-figure-1.html"]
    assert "HTML" in note and "no browser" in note
    text = open(files[0]).read()
    assert "plotly" in text.lower() and len(text) > 100_000     # plotly.js inlined: works offline


def test_nothing_to_export(tmp_path):
    assert write_figures({}, tmp_path) == ([], "no figures to export")


def test_png_at_three_times_and_svg(tmp_path):
    import os
    import struct

    import pytest
    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("kaleido needs a local Chromium (apt-get install -y chromium)")
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    fig.update_layout(height=300)
    files, note = write_figures({"bars": fig}, tmp_path)
    assert "(kaleido" in note and sorted(p.rsplit(".", 1)[-1] for p in files) == ["png", "svg"]
    png = open(next(p for p in files if p.endswith(".png")), "rb").read(24)
    assert struct.unpack(">II", png[16:24]) == (3600, 900)       # 1200 x 300 CSS px at 3x
