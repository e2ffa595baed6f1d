"""`vegas_studio_app.client` against the app's own page (no model, in this process, so the server's
session states can be looked at)."""
from __future__ import annotations

import pytest

pytest.importorskip("gradio")

from tests.vegas_studio_app.conftest import no_model_page  # noqa: E402


@pytest.fixture(scope="module")
def page_app():
    with no_model_page() as app:
        yield app


def test_a_page_session_is_opened_before_its_first_request(page_app):
    """Gradio builds a session's state at its first call (every component's config): a client that
    opens its session first, as a page load does, leaves that out of its first request."""
    import httpx
    from vegas_studio_app.client import open_page_session
    demo, url = page_app
    with httpx.Client(timeout=60) as http:
        a, b = open_page_session(url, http), open_page_session(url, http)
    assert a != b
    assert {a, b} <= set(demo.state_holder.session_data)


def test_a_stream_on_an_opened_session_reports_the_app_s_answer(page_app):
    """The session is the one the request joins with: the no-model app's refusal comes back on it."""
    import httpx
    from vegas_studio_app.client import open_page_session, page_stream
    demo, url = page_app
    sessions = demo.state_holder.session_data
    with httpx.Client(timeout=60) as http:
        session = open_page_session(url, http)
        before = set(sessions)
        outs = list(page_stream(url, "Hello", "vanilla", 4, client=http, session=session))
        assert outs[-1]["finished"] and "no-model" in outs[-1]["error"]
        assert set(sessions) == before                    # no new session: it joined the opened one
        list(page_stream(url, "Hello", "vanilla", 4, client=http))
        assert len(set(sessions) - before) == 1           # without one, the request makes its own


TICK_S = 0.01


@pytest.fixture(scope="module")
def ticking_app():
    """A page with the app's `stream_tokens` signature that sends a token event every TICK_S, each
    stamped with the time it was sent; records which requests were stopped early."""
    import threading
    import time

    import gradio as gr
    from tests.vegas_studio_app.conftest import served
    stopped, lock = [], threading.Lock()

    def stream(prompt, method, max_tokens, chat, temperature):
        done = False
        try:
            for i in range(int(max_tokens)):
                time.sleep(TICK_S)
                yield dict(seq=i, token_ids=[i], text=f"{prompt}{i} ", t_sent=time.time())
            done = True
            yield dict(finished=True, finish_reason="length", all_token_ids=list(range(int(max_tokens))))
        finally:
            if not done:
                with lock:
                    stopped.append(prompt)

    with gr.Blocks() as demo:
        args = [gr.Textbox(), gr.Textbox(), gr.Number(), gr.Checkbox(), gr.Number()]
        out = gr.JSON()
        gr.Button().click(stream, args, out, api_name="stream_tokens")
        gr.Button().click(lambda: {}, None, out, api_name="pool")
    demo.queue(default_concurrency_limit=8)
    with served(demo) as url:
        yield demo, url, stopped


def _delays(events):
    """How long after the server sent it each token event reached the reader, sorted."""
    return sorted(arrived - e["t_sent"] for arrived, e in events if not e.get("finished"))


def test_stream_tokens_hands_over_each_event_as_it_arrives(ticking_app):
    """`stream_tokens` reads the event stream itself; gradio_client's own job (the control) hands
    its reader's messages over every 50 ms, so its events come in bursts, tens of ms late: if a
    gradio_client release stops doing that, the control fails and the workaround can go."""
    import statistics
    import time

    from gradio_client import Client
    from vegas_studio_app.client import stream_tokens
    _, url, _ = ticking_app
    client = Client(url, verbose=False)
    ours = [(time.time(), e) for e in stream_tokens(client, "a", "vanilla", 60)]
    assert ours[-1][1]["finished"] and [e["seq"] for _, e in ours[:-1]] == list(range(60))
    job = client.submit("b", "vanilla", 60, True, 0.0, api_name="/stream_tokens")
    seen, theirs = 0, []
    while not job.done() or seen < len(job.outputs()):
        outs = job.outputs()
        theirs += [(time.time(), e) for e in outs[seen:]]
        seen = len(outs)
        time.sleep(0.001)
    ours_median, theirs_median = statistics.median(_delays(ours)), statistics.median(_delays(theirs))
    assert theirs_median > 0.015, f"gradio_client's job now hands events over {1e3 * theirs_median:.1f} ms late"
    assert ours_median < 0.01, f"median {1e3 * ours_median:.1f} ms from sent to read"


def test_leaving_a_stream_early_cancels_the_request_and_keeps_the_session(ticking_app):
    """The request is stopped at once (not left to the app's unread-stream timeout), and the
    Client's next stream runs on the same session."""
    import time

    from gradio_client import Client
    from vegas_studio_app.client import stream_tokens
    demo, url, stopped = ticking_app
    client = Client(url, verbose=False)
    list(stream_tokens(client, "warm", "vanilla", 2))
    sessions = set(demo.state_holder.session_data)
    for i, _ in enumerate(stream_tokens(client, "left", "vanilla", 1000)):
        if i == 3:
            break
    deadline = time.monotonic() + 5
    while "left" not in stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "left" in stopped
    outs = list(stream_tokens(client, "after", "vanilla", 5))
    assert outs[-1]["finished"] and [e["text"] for e in outs[:-1]] == [f"after{i} " for i in range(5)]
    assert set(demo.state_holder.session_data) == sessions


def test_threads_stream_on_one_client_at_once(ticking_app):
    """Each stream gets its own events, none of another's."""
    from concurrent.futures import ThreadPoolExecutor

    from gradio_client import Client
    from vegas_studio_app.client import stream_tokens
    _, url, _ = ticking_app
    client = Client(url, verbose=False)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: list(stream_tokens(client, p, "vanilla", 20)), "wxyz"))
    for prompt, outs in zip("wxyz", results):
        assert [e["text"] for e in outs[:-1]] == [f"{prompt}{i} " for i in range(20)]


def test_a_client_s_own_httpx_settings_are_kept(ticking_app):
    """A Client made with its own httpx settings (here a timeout) streams with them."""
    from gradio_client import Client
    from vegas_studio_app.client import _client_streams, stream_tokens
    _, url, _ = ticking_app
    client = Client(url, verbose=False, httpx_kwargs={"timeout": 7.0})
    outs = list(stream_tokens(client, "t", "vanilla", 3))
    assert outs[-1]["finished"] and len(outs) == 4
    assert _client_streams(client).http.timeout.read == 7.0
