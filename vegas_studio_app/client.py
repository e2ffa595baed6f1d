"""Streaming from a running Vegas Studio with gradio_client, event by event as the server sends them.

    from gradio_client import Client
    from vegas_studio_app.client import stream_tokens
    for event in stream_tokens(Client("http://127.0.0.1:7860/"), "Hello", "vegas", max_tokens=64):
        print(event.get("text", ""), end="", flush=True)

`stream_tokens` takes the address, headers and configuration from the gradio_client `Client` and
reads the app's event stream itself, by the page's protocol (`page_stream`: POST the queue join,
read the session's event stream). Not through a gradio_client job: the thread behind a job looks
for the messages its reader has received every 50 ms, so a job's events came in bursts, a mean
33 ms after the server sent them, and the end of each answer up to 50 ms late (gradio_client 2.7,
`utils.stream_sse_v1plus`; bench/NOTES.md version 73).
"""
from __future__ import annotations

import json
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

# How long a stream left early waits for the app to confirm that the request is cancelled.
CANCEL_WAIT_S = 30.0


class _ClientStreams:
    """What `stream_tokens` keeps per gradio_client `Client`: an httpx client with the Client's
    headers, the endpoint's function index, and the Client's idle page sessions (one stream per
    session at a time: a session's event stream carries every request on it)."""

    def __init__(self, client):
        import httpx
        self.url = client.src
        # The Client's own httpx settings (a timeout, a proxy) win over these defaults.
        self.http = httpx.Client(**{"headers": client.headers, "verify": client.ssl_verify, "timeout": 300,
                                    **client.httpx_kwargs})
        self.fn_index = _stream_tokens_id(client.config)
        self.idle: list[str] = []
        self.lock = threading.Lock()
        weakref.finalize(client, self.http.close)

    def take(self) -> str:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return open_page_session(self.url, self.http)

    def give_back(self, session: str) -> None:
        with self.lock:
            self.idle.append(session)


_streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_streams_lock = threading.Lock()


def _client_streams(client) -> _ClientStreams:
    """The `Client`'s stream state, made at its first stream."""
    with _streams_lock:
        if client not in _streams:
            _streams[client] = _ClientStreams(client)
        return _streams[client]


def open_stream_session(client) -> None:
    """Open a session for `client`'s next `stream_tokens`, as a page load does (`open_page_session`),
    so that its first request does not pay for it."""
    streams = _client_streams(client)
    streams.give_back(streams.take())


def stream_tokens(client, prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                  temperature: float = 0.0) -> Iterator[dict]:
    """The app's `stream_tokens` endpoint, for a gradio_client `Client`: a dict per message ({seq,
    token_ids, text, events: the engine events it carries; server wall times t_api, t_accepted,
    t_engine, t_sent}), then the final dict ({finished, finish_reason, all_token_ids, all_text} or
    {error}). Leaving the loop early cancels the request, which frees its place in the engine.
    Several threads may stream on one Client at once (each on a session of its own)."""
    streams = _client_streams(client)
    session, state = streams.take(), {}
    try:
        yield from _page_stream(streams.url, prompt, method, max_tokens, chat, temperature, streams.fn_index,
                                streams.http, session, state)
    finally:
        if state.get("clean"):
            streams.give_back(session)


def stream_tokens_fn_index(url: str) -> int:
    """The function index the page joins the queue with for `stream_tokens` (from the app's config)."""
    import httpx
    return _stream_tokens_id(httpx.get(url.rstrip("/") + "/config", timeout=60).json())


def _stream_tokens_id(config: dict) -> int:
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
    an error or closes the stream without a final message. Leaving the loop early cancels the
    request (POST `cancel`, as the page's Stop does) and reads on until the app confirms it.
    `fn_index`: from `stream_tokens_fn_index` (fetched when not given); `client`: an httpx.Client
    to reuse; `session`: a session from `open_page_session` (a tab's; else a new one, whose state
    the server builds as the request joins)."""
    yield from _page_stream(url, prompt, method, max_tokens, chat, temperature, fn_index, client, session, {})


def _page_stream(url, prompt, method, max_tokens, chat, temperature, fn_index, client, session,
                 state: dict) -> Iterator[dict]:
    """`page_stream`; sets state["clean"] once the request's last message has been read, so that
    its session carries nothing more and can take another request."""
    import httpx
    from gradio_client.utils import apply_diff
    base = url.rstrip("/") + "/gradio_api/"
    fn = stream_tokens_fn_index(url) if fn_index is None else fn_index
    http = client or httpx.Client(timeout=300)
    try:
        session = session or uuid.uuid4().hex[:11]
        joined = http.post(base + "queue/join", json={"data": [prompt, method, max_tokens, chat, temperature],
                                                      "fn_index": fn, "session_hash": session,
                                                      "event_data": None, "trigger_id": None})
        joined.raise_for_status()
        event_id = joined.json()["event_id"]
        with http.stream("GET", base + "queue/data", params={"session_hash": session}) as r:
            messages = _event_messages(r, event_id, state)
            out = None
            try:
                for msg in messages:
                    if msg["msg"] == "process_generating":
                        data = msg["output"]["data"][0]
                        out = data if out is None else apply_diff(out, data)
                        yield dict(out)
                    elif msg["msg"] == "process_completed":
                        if not msg.get("success", True):
                            raise RuntimeError(f"the app reported an error: {msg.get('output')}")
                        return
                    elif msg["msg"] == "unexpected_error":
                        raise RuntimeError(f"the app's queue reported: {msg.get('message')}")
                raise RuntimeError("the app closed the event stream before the request finished")
            finally:
                if not state.get("clean"):
                    _cancel(http, base, dict(session_hash=session, fn_index=fn, event_id=event_id),
                            messages, finished=bool((out or {}).get("finished")))
    finally:
        if client is None:
            http.close()


def _event_messages(response, event_id: str, state: dict) -> Iterator[dict]:
    """The messages of one request (`event_id`) on a session's event stream, up to its
    `process_completed` (then state["clean"] is set) or the stream's end."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        msg = json.loads(line[5:])
        if msg["msg"] == "close_stream":
            return
        if msg.get("event_id") not in (None, event_id):
            continue
        if msg["msg"] == "process_completed":
            state["clean"] = True
        yield msg
        if state.get("clean"):
            return


def _cancel(http, base: str, event: dict, messages: Iterator[dict], finished: bool) -> None:
    """A request left before its last message: cancel it unless it finished (POST `cancel`, as the
    page's Stop does), then read its remaining messages until the app completes it, for at most
    CANCEL_WAIT_S (the app's heartbeats keep the stream from going silent meanwhile). Runs while
    the stream is being left, so a server already gone is not an error here: the session is simply
    not reused."""
    import httpx
    deadline = time.monotonic() + CANCEL_WAIT_S
    try:
        if not finished:
            http.post(base + "cancel", json=event)
        for _ in messages:
            if time.monotonic() > deadline:
                return
    except httpx.HTTPError:
        return
