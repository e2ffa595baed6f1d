"""Start `python app.py` as a subprocess on a free localhost port (default model, CPU) and wait until
the engine is ready; shared by the browser and load tests. Also the worker tests' helpers."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(demo):
    """Blocks (queued already) served from this process on a free localhost port, so the server's
    Gradio state can be looked at: yields the url; closed after."""
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@contextmanager
def no_model_page():
    """The app's page with no model, served from this process (`served`): yields (Blocks, url)."""
    from vegas_studio_app.studio import Studio
    from vegas_studio_app.ui import build_ui
    demo = build_ui(Studio(None, results_dir="bench/results", abandon_after_s=30), 4, None)
    demo.queue()
    with served(demo) as url:
        yield demo, url


def drain(handle, timeout=120) -> list:
    """A worker handle's events up to and including the final one."""
    events = []
    while True:
        ev = handle.get(timeout=timeout)
        assert ev is not None, "no event in time"
        events.append(ev)
        if ev.finished:
            return events


def advance_numbers_its_iteration(worker, rounds: int = 20) -> None:
    """Pause, then advance, `rounds` times from a request's start: each `advance()` returns the
    number of iteration events sent before it, so the one it lets run is numbered by it, and no
    other follows (the count read in the caller's thread after the engine had already run that
    iteration was one too many, about one round in eight)."""
    from vegas_core.sampling import SamplingParams
    from vegas_core.spec import SpecParams
    for _ in range(rounds):
        h = worker.submit("hold me the the", SamplingParams(max_tokens=200, ignore_eos=True),
                          SpecParams(method="vegas", gamma=3), chat=False)
        h.pause()
        before = h.advance()
        deadline = time.monotonic() + 30
        while h.iterations_sent < before + 1 and time.monotonic() < deadline:
            h.get(timeout=0.05)
        time.sleep(0.05)
        h.ready()
        assert h.iterations_sent == before + 1
        h.abort()
        drain(h)


def pool_is_free(worker) -> bool:
    p = worker.pool()
    return p["num_free"] == p["num_blocks"] and p["active_requests"] == 0


class AppServer:
    def __init__(self, *args: str, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = log_path
        env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py", "--device", "cpu", "--port", str(self.port), *args],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def client(self):
        from gradio_client import Client
        return Client(self.url, verbose=False)

    def wait_ready(self, timeout: float = 300.0):
        """Until the page is served and the engine reports ready; returns a gradio_client Client."""
        deadline = time.monotonic() + timeout
        client = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}:\n{self.log()}")
            try:
                client = client or self.client()
                if client.predict(api_name="/pool")["state"] == "ready":
                    return client
            except Exception:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"app not ready after {timeout} s:\n{self.log()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def app_server(tmp_path_factory, request):
    args = getattr(request.module, "APP_ARGS", ())
    server = AppServer(*args, log_path=tmp_path_factory.mktemp("app") / "app.log")
    try:
        server.ready_client = server.wait_ready()
        yield server
    finally:
        server.stop()
