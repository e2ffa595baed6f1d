"""The newcomer check's steps, run by the bare venv's Python from the repository root
(scripts/newcomer_check.sh makes the venv): every product module imports, the CLI generates on the
embedded model, `python app.py` serves one streamed request through its API, and
`python -m vegas_core.bench e2e --workload small` runs. Each step prints one line; the first
failure ends the check with its output."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time

PACKAGES = ("vegas_core", "vegas_studio_app", "visualizations")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # the clone, as `python app.py` and `python -m vegas_core` see it from there


def step(name: str, fn) -> None:
    t = time.perf_counter()
    try:
        detail = fn()
    except Exception as e:   # the check reports every failure the same way
        print(f"FAIL  {name}: {e}", flush=True)
        sys.exit(1)
    print(f"ok    {name} ({time.perf_counter() - t:.0f} s){': ' + detail if detail else ''}", flush=True)


def run(*argv: str, timeout: float) -> str:
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def imports() -> str:
    bad = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as e:
                bad.append(f"{info.name}: {type(e).__name__}: {e}")
    if bad:
        raise RuntimeError("modules that do not import with the run command's packages:\n" + "\n".join(bad))
    triton = importlib.util.find_spec("triton") is not None
    return f"Triton {'installed' if triton else 'not installed (the CPU path needs none)'}"


def cli() -> str:
    res = {m: json.loads(run("-m", "vegas_core", "generate", "--prompt", "The capital of France is",
                             "--max-tokens", "8", "--method", m, "--min-budget", "4", "--json", timeout=600))
           for m in ("vanilla", "vegas")}
    for m, r in res.items():
        if r["generated_tokens"] != 8:
            raise RuntimeError(f"{m}: expected 8 tokens, got {r}")
    if res["vegas"]["token_ids"] != res["vanilla"]["token_ids"]:    # greedy, fp32: lossless
        raise RuntimeError(f"greedy vegas differs from vanilla: {res}")
    return f"vanilla and vegas: {res['vanilla']['text']!r}"


def app() -> str:
    """`python app.py` started the way the app benchmark starts it (`bench.app.AppServer`)."""
    from vegas_core.bench.app import AppServer
    args = argparse.Namespace(model=None, device="cpu", dtype=None, eager=False, clients=1, max_tokens=8)
    with AppServer(args) as server:
        got = server.stream("Name a colour.", "vegas")
    if not got["tokens"]:
        raise RuntimeError(f"the streamed request gave no tokens: {got}")
    return f"{got['events']} stream events, {got['tokens']} tokens"


def bench() -> str:
    with tempfile.TemporaryDirectory() as out:
        run("-m", "vegas_core.bench", "e2e", "--workload", "small", "--out", out, timeout=1800)
        [name] = os.listdir(out)
        with open(os.path.join(out, name), encoding="utf-8") as f:
            doc = json.load(f)
    return f"{name}: {len(doc['records'])} records"


if __name__ == "__main__":
    step("every module imports", imports)
    step("CLI generates on the embedded model", cli)
    step("app.py serves a streamed request through its API", app)
    step("bench e2e --workload small runs", bench)
