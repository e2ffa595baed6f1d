"""`vegas_core.options`: the prefill budget a device gets when none is set."""
from __future__ import annotations

import pytest

from vegas_core.errors import InvalidRequestError
from vegas_core.options import PREFILL_TOKENS_CPU, PREFILL_TOKENS_GPU, EngineOptions, prefill_budget


def test_the_prefill_budget_follows_the_device_unless_set():
    """A GPU's prefill step costs mostly the host's launches, so it takes more tokens a step than a
    CPU's, whose steps cost their tokens; a budget that is set wins on either."""
    assert PREFILL_TOKENS_GPU > PREFILL_TOKENS_CPU
    assert prefill_budget(EngineOptions(), "cuda") == PREFILL_TOKENS_GPU
    assert prefill_budget(EngineOptions(), "cpu") == PREFILL_TOKENS_CPU
    for device in ("cuda", "cpu"):
        assert prefill_budget(EngineOptions(max_prefill_tokens=64), device) == 64


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_a_set_prefill_budget_must_be_a_positive_integer(bad):
    with pytest.raises(InvalidRequestError, match="max_prefill_tokens must be an integer >= 1"):
        EngineOptions(max_prefill_tokens=bad)


def test_the_engine_schedules_with_its_devices_budget(default_model):
    from vegas_core.engine import Engine
    engine = Engine(device="cpu", dtype="float32", loaded=default_model,
                    options=EngineOptions(max_num_seqs=2, kv_cache_bytes=1 << 24))
    assert engine.core.scheduler.max_prefill_tokens == PREFILL_TOKENS_CPU
