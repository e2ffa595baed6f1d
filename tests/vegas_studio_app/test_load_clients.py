"""Clients in processes of their own against `python app.py` (default model, CPU): they connect, then
submit together, and report each stream's timings; a failing client is named, not hidden."""
from __future__ import annotations

import pytest

pytest.importorskip("gradio_client")

from vegas_studio_app.client import stream_tokens_fn_index  # noqa: E402
from vegas_studio_app.load_clients import ClientProcesses, decode_rate  # noqa: E402

APP_ARGS = ("--concurrency", "4")
MAX_TOKENS = 6
PROMPTS = ["Name a colour.", "Name a fruit."]


@pytest.fixture(scope="module")
def clients(app_server):
    with ClientProcesses(app_server.url, len(PROMPTS), MAX_TOKENS, stream_tokens_fn_index(app_server.url)) as c:
        yield c


@pytest.mark.parametrize("page", [False, True], ids=["gradio_client", "page-protocol"])
def test_clients_stream_together_from_their_own_processes(clients, app_server, page):
    import os
    results = clients.together(PROMPTS, "vanilla", page=page)
    assert len(results) == 2
    for r in results:
        assert 1 <= r["tokens"] <= MAX_TOKENS and r["events"] >= 1
        assert r["ttft_s"] > 0 and r["t_last"] >= r["t_submit"]
        assert r["api_s"] is not None and r["accept_s"] is not None     # the server's own stamps came back
    # connected first, then released together: the submits are close, not one stream after the other
    assert abs(results[0]["t_submit"] - results[1]["t_submit"]) < 0.5
    assert all(p.pid != os.getpid() and p.is_alive() for p in clients.procs)


def test_a_failing_client_is_named_and_the_others_still_work(clients):
    with pytest.raises(RuntimeError, match=r"client 1: RuntimeError: no-such-method"):
        clients.together(PROMPTS, "no-such-method")
    assert len(clients.together(PROMPTS, "vanilla")) == 2          # the processes go on serving
    with pytest.raises(ValueError, match="3 prompts for 2 clients"):
        clients.together(PROMPTS + ["one more"], "vanilla")


def test_a_client_process_that_dies_is_reported(app_server):
    c = ClientProcesses(app_server.url, 1, MAX_TOKENS, stream_tokens_fn_index(app_server.url))
    try:
        c.procs[0].kill()
        c.procs[0].join(10)
        with pytest.raises(RuntimeError, match="client 0's process exited"):
            c.together(PROMPTS[:1], "vanilla")
        with pytest.raises(RuntimeError, match="out of step: client 0's process exited"):
            c.together(PROMPTS[:1], "vanilla")
    finally:
        c.close()


def test_clients_that_cannot_connect_are_named():
    from tests.vegas_studio_app.conftest import free_port
    url = f"http://127.0.0.1:{free_port()}/"                 # nothing serves there
    with ClientProcesses(url, 2, MAX_TOKENS, fn_index=0) as c:
        with pytest.raises(RuntimeError) as e:
            c.together(PROMPTS, "vanilla")
    assert "client 0: " in str(e.value) and "client 1: " in str(e.value)


def test_decode_rate_counts_the_tokens_after_the_first_event():
    # 16 tokens in the first event (a chain), then 3 events of 16 over 0.3 s: 48 tokens / 0.3 s
    assert decode_rate([16, 16, 16, 16], [1.0, 1.1, 1.2, 1.3]) == pytest.approx(160.0)
    assert decode_rate([5], [1.0]) is None
