"""`vegas_studio_app.ui`: what the server does per event beyond the app's own work (the app in this
process, no model, so Gradio's queue can be looked at)."""
from __future__ import annotations

import pytest

pytest.importorskip("gradio")

from tests.vegas_studio_app.conftest import no_model_page  # noqa: E402

QUEUE_ANALYTICS = ("GRADIO_ANALYTICS_CACHE_FREQUENCY", "GRADIO_ANALYTICS_MAX_EVENTS")


def _unset(monkeypatch, *names):
    """Absent now and again after the test (what the test sets goes with it)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.mark.parametrize("quiet", [True, False])
def test_the_queue_rebuilds_no_analytics_table_per_event(monkeypatch, quiet):
    """Gradio's queue rebuilds a pandas table of its recorded events after every event (its monitoring
    summary; the server's memory grew with it under streaming load). The app's entry point turns
    that off before it builds its Blocks; without it (the control) Gradio still does it, so this
    test would notice a Gradio that changed how."""
    from gradio_client import Client

    from vegas_studio_app.ui import quiet_queue_analytics
    _unset(monkeypatch, *QUEUE_ANALYTICS)
    if quiet:
        quiet_queue_analytics()
    with no_model_page() as (demo, url):
        client = Client(url, verbose=False)
        for _ in range(3):
            assert client.predict(api_name="/pool")["state"] == "no-model"
        queue = demo._queue
        assert (queue.cached_event_analytics_summary == {"functions": {}}) == quiet
        assert (len(queue.event_analytics) <= 1) == quiet


def test_a_setting_in_the_environment_wins(monkeypatch):
    import os

    from vegas_studio_app.ui import quiet_queue_analytics
    _unset(monkeypatch, "GRADIO_ANALYTICS_CACHE_FREQUENCY")
    monkeypatch.setenv("GRADIO_ANALYTICS_MAX_EVENTS", "500")
    quiet_queue_analytics()
    assert os.environ["GRADIO_ANALYTICS_MAX_EVENTS"] == "500"
    assert int(os.environ["GRADIO_ANALYTICS_CACHE_FREQUENCY"]) > 10**9
