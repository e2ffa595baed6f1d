"""The app's model picker: the embedded default, the packaged models (saying how to install one
that is missing) and a --model path; switching starts a new engine worker and stops the old one."""
from __future__ import annotations

import gradio as gr

from vegas_core.loader import registry
from vegas_studio_app.models import DEFAULT, load_argument, model_choices, picker_value, wants_chat
from vegas_studio_app.studio import Studio


def test_choices_list_the_default_the_packaged_models_and_a_path():
    values = [v for _, v in model_choices("/models/x.gguf")]
    assert values == [DEFAULT, "qwen2.5-coder-0.5b", "gemma-3-270m", "/models/x.gguf"]
    assert [v for _, v in model_choices(None)] == values[:3]
    assert load_argument(DEFAULT) is None and picker_value(None) == DEFAULT
    assert wants_chat("qwen2.5-coder-0.5b") and not wants_chat("gemma-3-270m") and wants_chat(DEFAULT)


def test_a_missing_model_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else object())
    labels = dict((v, label) for label, v in model_choices(None))
    assert "not installed" in labels["gemma-3-270m"]
    assert registry.PACKAGED_MODELS["gemma-3-270m"].pip_install in labels["gemma-3-270m"]
    assert "not installed" not in labels["qwen2.5-coder-0.5b"]


class FakeWorker:
    def __init__(self, model):
        self.model, self.state, self.started, self.stopped = model, "loading", False, False

    def with_model(self, model):
        self.stopped = True   # the real worker stops its predecessor when it starts loading
        return FakeWorker(model)

    def start(self):
        self.started = True
        return self

    def shutdown(self):
        self.stopped = True

    def status_line(self):
        return f"Loading {self.model}"


def test_switching_replaces_the_worker():
    old = FakeWorker(None)
    studio = Studio(old)
    status, timer, chat = studio.switch_model("gemma-3-270m")
    assert old.stopped and studio.worker is not old and studio.worker.started
    assert studio.worker.model == "gemma-3-270m" and status == "Loading gemma-3-270m"
    assert isinstance(chat, gr.Checkbox) and chat.value is False   # a base model: no chat template
    same = studio.worker
    studio.switch_model("gemma-3-270m")                              # already loaded: nothing to do
    assert studio.worker is same and not same.stopped
    studio.switch_model(DEFAULT)
    assert studio.worker.model is None and same.stopped


def test_a_new_worker_frees_the_old_engine_before_loading(tmp_path):
    """Two models at once may not fit: the replacement joins the old engine thread and drops the
    engine before its own load starts."""
    from vegas_studio_app.worker import EngineWorker
    loads = []

    class Engine:   # enough of an engine for the worker's status line and warm-up check
        def __init__(self):
            self.config = type("C", (), {"name": "fake"})()
            self.source, self.device, self.dtype, self.mode = "fake", "cpu", "float32", "reference"
            self.core = type("Core", (), {"runner": type("R", (), {"kernels": False, "graphs": None})(),
                                          "options": type("O", (), {"deterministic": False})(),
                                          "has_work": False})()

    def factory():
        loads.append(old.engine)   # what the old worker held when this load began
        return Engine()

    old = EngineWorker(None, engine_factory=Engine).start()
    assert old.wait_ready(30)
    new = old.with_model("gemma-3-270m")
    new._factory = factory
    new.start()
    assert new.wait_ready(30) and loads == [None] and not old._thread.is_alive()
    new.release()
