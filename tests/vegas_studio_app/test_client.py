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
