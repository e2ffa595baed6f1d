"""The page's prompt limit is the model's context in tokens, not a character count: a long prompt
that fits is served, one that does not is refused with the engine's message in tokens."""
from __future__ import annotations

import pytest

from tests.vegas_core.conftest import build_tiny_hf_model
from vegas_studio_app.studio import MAX_PROMPT_CHARS, Studio
from vegas_studio_app.worker import EngineWorker


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    path, _ = build_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")   # 512 positions
    worker = EngineWorker(path, "cpu", max_num_seqs=4).start()
    assert worker.wait_ready(120), worker.error
    yield Studio(worker)
    worker.release()


def _final(studio, prompt: str, max_tokens: int) -> dict:
    return list(studio.api_stream(prompt, "vanilla", max_tokens, False, 0.0))[-1]


def test_the_prompt_limit_is_the_models_context_in_tokens(studio):
    assert MAX_PROMPT_CHARS > 20_000          # the old character cap would refuse a fitting prompt
    tok = studio.worker.engine.tokenizer
    fits = "ab " * 120                        # a few hundred tokens of the tiny model's 512
    n = len(tok.encode(fits))
    assert n + 4 <= 512
    done = _final(studio, fits, 4)
    assert done["finished"] and not done.get("error") and done["all_token_ids"]
    too_long = "ab " * 400
    refused = _final(studio, too_long, 4)
    assert refused["error"].startswith(f"prompt of {len(tok.encode(too_long)):,} tokens plus max_tokens 4")
    assert "beyond the model's context of 512 tokens: shorten the prompt or lower max_tokens" in refused["error"]
