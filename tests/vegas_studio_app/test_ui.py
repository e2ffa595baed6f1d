"""`vegas_studio_app.ui`: what the server does per event beyond the app's own work (the app in this
process, no model, so Gradio's queue can be looked at)."""
from __future__ import annotations

import time

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


@pytest.mark.parametrize("on_cpu", [True, False])
def test_an_idle_queue_polls_every_10_ms_beside_a_cpu_engine(on_cpu):
    """Gradio's idle queue wakes every millisecond; beside an engine on the CPU the app makes it
    10 ms (a Gradio without the setting would fail here, not slow the engine unnoticed). The
    page still answers at once; on a GPU Gradio's own interval stays."""
    from gradio_client import Client

    from vegas_studio_app.ui import IDLE_POLL_CPU_S, slow_idle_queue_poll
    with no_model_page() as (demo, url):
        default = demo._queue.sleep_when_free
        slow_idle_queue_poll(demo, engine_on_cpu=on_cpu)
        assert demo._queue.sleep_when_free == (IDLE_POLL_CPU_S if on_cpu else default)
        client = Client(url, verbose=False)
        for _ in range(3):
            t = time.perf_counter()
            assert client.predict(api_name="/pool")["state"] == "no-model"
            assert time.perf_counter() - t < 2.0


def test_a_setting_in_the_environment_wins(monkeypatch):
    import os

    from vegas_studio_app.ui import quiet_queue_analytics
    _unset(monkeypatch, "GRADIO_ANALYTICS_CACHE_FREQUENCY")
    monkeypatch.setenv("GRADIO_ANALYTICS_MAX_EVENTS", "500")
    quiet_queue_analytics()
    assert os.environ["GRADIO_ANALYTICS_MAX_EVENTS"] == "500"
    assert int(os.environ["GRADIO_ANALYTICS_CACHE_FREQUENCY"]) > 10**9


def _path_searches(monkeypatch) -> list[str]:
    """The module names the import system looks for on sys.path from now on."""
    import importlib.machinery
    searched, find_spec = [], importlib.machinery.PathFinder.find_spec

    def counting(name, *args, **kwargs):
        searched.append(name)
        return find_spec(name, *args, **kwargs)
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", counting)
    return searched


def _absent_until_the_end(monkeypatch) -> None:
    """No "matplotlib" entry in sys.modules now, and sys.modules as it was after the test."""
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "matplotlib")


@pytest.mark.parametrize("marked", [True, False])
def test_gradio_looks_for_an_absent_matplotlib_once(monkeypatch, marked):
    """Gradio tries `import matplotlib` around every call and streamed message; where it is not installed
    each try searches sys.path. Marked absent by the app's entry point, a try searches nothing and still
    fails as Gradio expects; unmarked (the control), each try searches again."""
    import importlib.util
    import sys

    from gradio.utils import MatplotlibBackendMananger

    from vegas_studio_app.ui import skip_absent_matplotlib
    _absent_until_the_end(monkeypatch)
    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed here: Gradio's imports of it are cheap")
    if marked:
        skip_absent_matplotlib()
    searched = _path_searches(monkeypatch)
    for _ in range(3):
        with MatplotlibBackendMananger():
            pass
    assert searched.count("matplotlib") == (0 if marked else 6)
    with pytest.raises(ImportError):
        import matplotlib  # noqa: F401


def test_an_installed_matplotlib_is_left_alone(monkeypatch):
    import importlib.util
    import sys

    from vegas_studio_app.ui import skip_absent_matplotlib
    _absent_until_the_end(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "matplotlib" else None)
    skip_absent_matplotlib()
    assert "matplotlib" not in sys.modules
