"""Files out of the app (traces, timelines, tables, figures, one zip of them all) and the first look at
a file coming in for replay, which names what a wrong file is (a picture, a Perfetto timeline) before
the trace loader's own checks run."""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from vegas_core.trace import save_trace
from vegas_core.trace.export import write_chrome_trace, write_csv, write_parquet
from visualizations.export import write_figures

# Leading bytes of files people upload by mistake.
_MAGIC = {b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image", b"%PDF": "a PDF",
          b"PK\x03\x04": "a zip archive", b"PAR1": "a Parquet table"}


def wrong_file(path: str) -> str | None:
    """Why the file is not a trace JSON when that is recognisable from its start, else None."""
    with open(path, "rb") as f:
        head = f.read(4096)
    name = os.path.basename(path)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            return f"{name} is {what}, not a trace: upload a .trace.json file exported by this app or the CLI"
    text = head.lstrip()
    if text.startswith(b"{") and b'"traceEvents"' in head and b'"schema_version"' not in head[:200]:
        return (f"{name} is a Perfetto / Chrome timeline (traceEvents), which holds only timings: upload the "
                ".trace.json file exported beside it")
    if text.startswith(b"request_id,") or text.startswith(b"request_id\t"):
        return f"{name} is the per-iteration CSV table: upload the .trace.json file exported beside it"
    return None


def write_run_files(runs, out: Path) -> list[Path]:
    """Per run: trace JSON (re-importable), Perfetto timeline, iterations CSV and Parquet."""
    files = []
    for run in runs:
        stem = f"vegas-run{run.run_id}-{run.kind}-{run.method}"
        t = run.trace
        save_trace(t, out / f"{stem}.trace.json")
        write_chrome_trace(t, out / f"{stem}.perfetto.json")
        write_csv(t, out / f"{stem}.iterations.csv")
        files += [out / f"{stem}.trace.json", out / f"{stem}.perfetto.json", out / f"{stem}.iterations.csv"]
        try:
            write_parquet(t, out / f"{stem}.iterations.parquet")
            files.append(out / f"{stem}.iterations.parquet")
        except ImportError:
            pass
    return files


def write_bundle(runs, figures: dict, compare_html: str | None, out: Path) -> tuple[Path, str]:
    """One zip holding every file of `runs`, the figures (PNG at 3×, SVG) and the compare table."""
    out.mkdir(parents=True, exist_ok=True)
    files = write_run_files(runs, out)
    fig_files, note = write_figures(figures, out / "figures")
    files += [Path(f) for f in fig_files]
    if compare_html:
        page = out / "compare-table.html"
        page.write_text(f"<!doctype html><meta charset='utf-8'><title>Vegas compare</title>{compare_html}",
                        encoding="utf-8")
        files.append(page)
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"runs": [{"run": r.run_id, "kind": r.kind, "method": r.method,
                                              "provenance": r.provenance} for r in runs],
                                    "figures": note}, indent=1), encoding="utf-8")
    files.append(manifest)
    zip_path = out / f"vegas-run{runs[0].run_id}-all.zip"
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(f, f.relative_to(out))
    return zip_path, note
