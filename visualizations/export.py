"""Figures to files: PNG and SVG through kaleido (which drives a local Chromium, e.g. Debian's
/usr/bin/chromium; nothing is downloaded), or self-contained HTML (plotly.js inlined, works offline)
when kaleido or a browser is missing. The returned note says which formats were written."""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import plotly.graph_objects as go

EXPORT_WIDTH, EXPORT_SCALE = 1200, 3
_CHROMIUMS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "figure"


def _point_kaleido_at_local_chromium() -> bool:
    if os.environ.get("BROWSER_PATH"):
        return True
    for path in _CHROMIUMS:
        if os.path.exists(path):
            os.environ["BROWSER_PATH"] = path
            return True
    return shutil.which("chromium") is not None


def write_figures(figures: Mapping[str, go.Figure], out_dir: str | os.PathLike,
                  formats: tuple[str, ...] = ("png", "svg")) -> tuple[list[str], str]:
    """Write every figure in each of `formats`; on failure fall back to HTML. Returns (paths, note)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = [(_safe(name), fig) for name, fig in figures.items()]
    if not items:
        return [], "no figures to export"
    try:
        import kaleido  # noqa: F401
        if not _point_kaleido_at_local_chromium():
            raise RuntimeError("no local Chromium for kaleido")
        import plotly.io as pio
        figs, files = [], []
        for fmt in formats:
            for name, fig in items:
                figs.append(fig)
                files.append(out / f"{name}.{fmt}")
        # 1200 CSS px wide at 3x: a 3600 px PNG, sharp on a slide or in a paper; SVG is vector.
        pio.write_images(figs, files, width=EXPORT_WIDTH, height=[f.layout.height or 500 for f in figs],
                         scale=EXPORT_SCALE)
        return [str(f) for f in files], (f"figures as {' and '.join(f.upper() for f in formats)} (kaleido; PNG "
                                         f"{EXPORT_WIDTH} px wide at {EXPORT_SCALE}×)")
    except Exception as e:  # kaleido missing, no browser, or a browser that would not start
        files = []
        for name, fig in items:
            path = out / f"{name}.html"
            fig.write_html(path, include_plotlyjs=True, full_html=True)
            files.append(str(path))
        return files, f"figures as self-contained HTML (PNG/SVG export unavailable: {type(e).__name__}: {e})"
