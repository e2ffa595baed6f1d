"""The newcomer check's steps, run by the bare venv's Python from the repository root
(scripts/newcomer_check.sh makes the venv): every product module imports, the CLI generates on the
embedded model, `python app.py` serves one streamed request through its API, and
`python -m vegas_core.bench e2e --workload small` runs. Each step prints one line; the first
failure ends the check with its output."""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
import socket
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
    from gradio_client import Client
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "app.py", "--device", "cpu", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False"))
    try:
        client = _connect(Client, f"http://127.0.0.1:{port}/", proc, log)
        job = client.submit("Name a colour.", "vegas", 8, True, 0.0, api_name="/stream_tokens")
        events = [out for out in job]
        final = job.result(timeout=300)
        if not final.get("finished") or final.get("error"):
            raise RuntimeError(f"the streamed request did not finish: {final}")
        return f"{len(events)} stream events, {len(final['all_token_ids'])} tokens: {final['all_text']!r}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _connect(Client, url: str, proc, log, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log.read()[-4000:]}")
        try:
            client = Client(url, verbose=False)
            status = client.predict(api_name="/pool")
            if status.get("state") == "ready":
                return client
        except Exception:   # not serving yet, or still loading the model
            pass
        time.sleep(1)
    log.seek(0)
    raise RuntimeError(f"app.py did not serve within {timeout:.0f} s:\n{log.read()[-4000:]}")


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
