"""Many clients at once against `python app.py` (default model, CPU), through gradio_client and the
app's `/stream_tokens` endpoint, which shares the Generate button's concurrency group ("engine").

The app runs with 8 concurrent streams and a queue of 2: eight clients stream together in one engine
batch; four more arrive while they run, so two wait in the queue and the rest are told the queue is
full. Every stream that finishes must hold each generated token exactly once (event token ids and text,
concatenated, equal the final output), and the KV pool must be all free afterwards.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError  # noqa: E402
from gradio_client.utils import QueueError, Status  # noqa: E402

APP_ARGS = ("--concurrency", "8", "--queue-size", "2", "--abandon-after", "3")
METHODS = ["vanilla", "vegas", "stream", "quest", "specextend", "vegas-all", "vanilla", "vegas"]
MAX_TOKENS = 8
LONG_TOKENS = 32
RUNNING = (Status.PROCESSING, Status.ITERATING, Status.FINISHED)


def _run(client, i: int, method: str, max_tokens: int, started=None):
    """Stream one request; returns ('ok', outputs) or ('busy', message). `started(i)` is called once
    the server is processing the job (its request is in the engine) or the job ended."""
    job = client.submit(f"Give me fact number {i} about the ocean.", method, max_tokens, True, 0.0,
                        api_name="/stream_tokens")
    try:
        if started is not None:
            while job.status().code not in RUNNING and not job.done():
                time.sleep(0.05)
            started(i)
        job.result(timeout=600)
        return "ok", job.outputs()
    except (QueueError, AppError, ValueError) as e:
        if "queue is full" in str(e).lower():
            return "busy", str(e)
        raise
    finally:
        if started is not None:
            started(i)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _check_stream(outputs: list[dict], max_tokens: int):
    *events, final = outputs
    assert final["finished"] and not final.get("error"), final
    assert [e["seq"] for e in events] == list(range(len(events))), "an event was lost or repeated"
    ids = [t for e in events for t in e["token_ids"]]
    assert ids == final["all_token_ids"], "streamed token ids differ from the final output"
    assert "".join(e["text"] for e in events) == final["all_text"]
    assert 1 <= len(ids) <= max_tokens


def test_many_clients_stream_at_once(app_server):
    pool0 = app_server.ready_client.predict(api_name="/pool")
    assert pool0["num_free"] == pool0["num_blocks"]
    clients = [app_server.client() for _ in range(12)]
    started = set()
    t0 = time.monotonic()
    with ThreadPoolExecutor(12) as ex:
        # Eight streams, each joining the running batch (a queue of 2 cannot take a burst of eight).
        first = []
        for i in range(8):
            first.append(ex.submit(_run, clients[i], i, METHODS[i], LONG_TOKENS, started.add))
            _wait(lambda: i in started, 300, f"stream {i} to start")
            print(f"stream {i} started at {time.monotonic() - t0:.1f} s; done: {[f.done() for f in first]}")
        assert all(not f.done() for f in first), ("a stream ended before all eight were running",
                                                  [f.result() for f in first if f.done()])
        # Four more while they run: two wait in the queue, the rest are told it is full.
        extra = [ex.submit(_run, clients[i], i, "vanilla", MAX_TOKENS) for i in range(8, 12)]
        results = [f.result() for f in first]
        extra_results = [f.result() for f in extra]
    elapsed = time.monotonic() - t0

    for status, outputs in results:
        assert status == "ok", outputs
        _check_stream(outputs, LONG_TOKENS)
    busy = [r for r in extra_results if r[0] == "busy"]
    assert busy, "with 8 streaming and a queue of 2, a 12th client must be told the queue is full"
    assert all("queue is full" in msg.lower() for _, msg in busy)
    for status, outputs in extra_results:
        if status == "ok":
            _check_stream(outputs, MAX_TOKENS)
    assert len(busy) <= 2, extra_results  # two fit in the queue

    pool = app_server.ready_client.predict(api_name="/pool")
    assert pool["peak_active"] >= 8, pool        # the eight really were in the engine together
    assert pool["active_requests"] == 0 and pool["num_free"] == pool["num_blocks"], pool
    # The engine's step log over the API: the eight shared decode steps.
    steps = app_server.ready_client.predict(3, api_name="/engine_steps")
    assert len(steps) == 3 and all(s["start"] <= s["end"] and s["kind"] in ("prefill", "decode") for s in steps)
    assert max(s["rows"] for s in app_server.ready_client.predict(512, api_name="/engine_steps")) >= 8
    with pytest.raises(Exception, match="1 to 512 steps"):
        app_server.ready_client.predict(0, api_name="/engine_steps")
    print(f"12 clients, {len(busy)} told busy, {elapsed:.1f} s")


def test_a_client_that_cancels_frees_its_request(app_server):
    client = app_server.client()
    job = client.submit("Count from one to a thousand.", "vanilla", 400, True, 0.0, api_name="/stream_tokens")
    deadline = time.monotonic() + 120
    while len(job.outputs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(job.outputs()) >= 2
    job.cancel()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pool = app_server.ready_client.predict(api_name="/pool")
        if pool["active_requests"] == 0:
            break
        time.sleep(0.5)
    assert pool["active_requests"] == 0 and pool["num_free"] == pool["num_blocks"], pool


def _page_protocol_events(app_server, prompt: str, max_tokens: int) -> list[tuple[float, dict]]:
    """What the page does (`client.page_stream`: POST /queue/join, then the session's event stream,
    each message a diff against the one before). Returns (arrival wall time, event) per token event."""
    from vegas_studio_app.client import page_stream
    return [(time.time(), out) for out in page_stream(app_server.url, prompt, "vanilla", max_tokens)
            if not out.get("finished")]


def _client_events(app_server, prompt: str, max_tokens: int) -> list[tuple[float, dict]]:
    from vegas_studio_app.client import stream_tokens
    return [(time.time(), out) for out in stream_tokens(app_server.client(), prompt, "vanilla", max_tokens)
            if not out.get("finished")]


@pytest.mark.parametrize("read", [_page_protocol_events, _client_events], ids=["page-protocol", "gradio_client"])
def test_events_arrive_as_the_engine_makes_them_not_in_a_burst(app_server, read):
    """Each token event reaches the client soon after the server sent it (`t_sent`), so the arrivals
    spread over the generation; a stream held back and delivered at the end fails both checks."""
    events = read(app_server, "Write a long story about a lighthouse keeper.", 48)
    assert len(events) >= 16, events
    sent = [e["t_sent"] for _, e in events]
    arrived = [t for t, _ in events]
    span = sent[-1] - sent[0]
    assert span >= 1.0, f"the generation took {span:.2f} s: too short to tell streaming from a burst"
    delays = [a - s for a, s in zip(arrived, sent)]
    assert max(delays) <= 0.75, f"an event arrived {max(delays):.2f} s after the server sent it"
    assert arrived[-1] - arrived[0] >= 0.6 * span, "the events arrived bunched together"
    # Each message places its request on the server's clock: handed to the app's handler, taken in
    # by the engine, emitted, sent.
    assert all(e["t_api"] <= e["t_accepted"] <= e["t_engine"] <= e["t_sent"] for _, e in events)
    assert len({(e["t_api"], e["t_accepted"]) for _, e in events}) == 1


def test_an_api_stream_nobody_reads_is_stopped(app_server):
    """POST /call/stream_tokens and never GET its events: the app stops the request once its events
    have gone unread for --abandon-after seconds (3 here) instead of decoding to max_tokens."""
    import httpx
    r = httpx.post(app_server.url + "gradio_api/call/stream_tokens",
                   json={"data": ["Write a long story about a lighthouse keeper.", "vanilla", 4000, True, 0.0]})
    r.raise_for_status()
    client = app_server.ready_client
    _wait(lambda: client.predict(api_name="/pool")["active_requests"] == 1, 60, "the request to start")
    started = time.monotonic()
    _wait(lambda: client.predict(api_name="/pool")["active_requests"] == 0, 60, "the unread request to stop")
    assert time.monotonic() - started < 15
    assert "no client read its stream for 3 s" in app_server.log()
    pool = client.predict(api_name="/pool")
    assert pool["num_free"] == pool["num_blocks"], pool
