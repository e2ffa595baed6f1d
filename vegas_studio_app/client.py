"""Streaming from a running Vegas Studio with gradio_client, event by event as the server sends them.

    from gradio_client import Client
    from vegas_studio_app.client import stream_tokens
    for event in stream_tokens(Client("http://127.0.0.1:7860/"), "Hello", "vegas", max_tokens=64):
        print(event.get("text", ""), end="", flush=True)

`page_stream` speaks the page's own protocol instead (POST the queue join, read the session's event
stream), without gradio_client's per-job threads: what a browser tab costs the server, and nothing
on the client's side (eight gradio_client jobs submitted at once from one process took 0.1-0.35 s
longer to reach the app than eight page-protocol ones; bench/NOTES.md version 66).

Read a job through `stream_job`, not `for out in job`: gradio_client's `Job.__next__` sleeps while it
holds the lock that its reader thread needs to hand over each event, and on a many-core host that
starved the reader for seconds, so a whole answer arrived at once (docs/RESULTS.md, "The app").
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator


def stream_job(job, poll_s: float = 0.002) -> Iterator:
    """Yield a gradio_client `Job`'s outputs as they arrive, then raise the job's error if it failed."""
    seen = 0
    while True:
        done = job.done()                 # before reading: outputs that came with the end are not missed
        outputs = job.outputs()
        yield from outputs[seen:]
        seen = len(outputs)
        if done:
            job.result()                  # raises the job's error (queue full, server stopped, ...)
            return
        time.sleep(poll_s)


def stream_tokens(client, prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                  temperature: float = 0.0) -> Iterator[dict]:
    """The app's `stream_tokens` endpoint: a dict per message ({seq, token_ids, text, events: the
    engine events it carries; server wall times t_api, t_accepted, t_engine, t_sent}), then the
    final dict ({finished, finish_reason, all_token_ids, all_text} or {error}). Leaving the loop
    early cancels the request, which frees its place in the engine."""
    job = client.submit(prompt, method, max_tokens, chat, temperature, api_name="/stream_tokens")
    try:
        yield from stream_job(job)
    finally:
        if not job.done():
            job.cancel()


def stream_tokens_fn_index(url: str) -> int:
    """The function index the page joins the queue with for `stream_tokens` (from the app's config)."""
    import httpx
    config = httpx.get(url.rstrip("/") + "/config", timeout=60).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "stream_tokens")


def open_page_session(url: str, client) -> str:
    """A new session of the page's protocol, opened as a page load opens it: its first call makes
    Gradio build the session's state (a copy of every component's config: ~17 ms for this page on
    one CPU core, on the server's event loop), so a tab pays that once, when it loads, not when its
    user presses Generate. `client`: an httpx.Client. Returns the session hash for `page_stream`."""
    session = uuid.uuid4().hex[:11]
    client.post(url.rstrip("/") + "/gradio_api/run/pool",
                json={"data": [], "session_hash": session}).raise_for_status()
    return session


def page_stream(url: str, prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                temperature: float = 0.0, fn_index: int | None = None, client=None,
                session: str | None = None) -> Iterator[dict]:
    """`stream_tokens` as the page calls it: POST `queue/join`, then read the session's
    `queue/data` event stream, applying each message's diff to the one before. Yields the same
    dicts as `stream_tokens`, ending with the final one; raises RuntimeError if the server reports
    an error or closes the stream without a final message. Leaving the loop early closes the event
    stream; the app stops a request nobody reads (`--abandon-after`). `fn_index`: from
    `stream_tokens_fn_index` (fetched when not given); `client`: an httpx.Client to reuse;
    `session`: a session from `open_page_session` (a tab's; else a new one, whose state the
    server builds as the request joins)."""
    import httpx
    from gradio_client.utils import apply_diff
    base = url.rstrip("/") + "/gradio_api/"
    fn = stream_tokens_fn_index(url) if fn_index is None else fn_index
    http = client or httpx.Client(timeout=300)
    try:
        session = session or uuid.uuid4().hex[:11]
        http.post(base + "queue/join", json={"data": [prompt, method, max_tokens, chat, temperature],
                                             "fn_index": fn, "session_hash": session, "event_data": None,
                                             "trigger_id": None}).raise_for_status()
        out = None
        with http.stream("GET", base + "queue/data", params={"session_hash": session}) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg["msg"] == "process_generating":
                    data = msg["output"]["data"][0]
                    out = data if out is None else apply_diff(out, data)
                    yield dict(out)
                    if out.get("finished"):
                        return
                elif msg["msg"] == "process_completed":
                    if not msg.get("success", True):
                        raise RuntimeError(f"the app reported an error: {msg.get('output')}")
                    return
                elif msg["msg"] == "close_stream":
                    break
        raise RuntimeError("the app closed the event stream before the request finished")
    finally:
        if client is None:
            http.close()
