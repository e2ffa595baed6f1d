"""Shared fixtures: the embedded model is loaded once per test session.

Triton reads TRITON_INTERPRET when a kernel is decorated (`triton.knobs.runtime.interpret`), i.e.
when a `kernels.*` module is first imported, which any engine import does; so it is set here,
before every test module. setdefault: a GPU run overrides it with TRITON_INTERPRET=0."""
import inspect
import os
import textwrap

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from tests import interpreter_speedup

if os.environ["TRITON_INTERPRET"] == "1":
    # Test-only shortcuts through Triton's interpreter; what a kernel computes is unchanged (see
    # the module): nested helpers skip a redundant re-patch, shapes are built once per shape, and
    # overflow checks whose result is discarded are not computed.
    interpreter_speedup.install()
    interpreter_speedup.install_shape_cache()
    interpreter_speedup.install_no_dead_checks()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One of several test processes (scripts/test.sh): one torch thread each, so the processes
    # share the cores instead of oversubscribing them. Paths compared within a test run in the
    # same process, hence with the same thread count.
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """For tests of many tiny ops: on a busy 2-core machine, waking a second intra-op thread costs
    more than it saves. Restores the count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _threads_unchanged():
    """A test that changes torch's intra-op thread count and leaves it changed makes every later
    test run, and round, differently (float32 reduction order depends on the thread count): fail it."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"the test left torch's thread count at {after} (was {before}); use the one_thread fixture")


@pytest.fixture(scope="session")
def default_model():
    from vegas_core.loader import load_model
    return load_model(None)


@pytest.fixture(scope="session")
def engine(default_model):
    """A CPU fp32 engine on the embedded model (tests must leave it idle)."""
    from vegas_core.engine import Engine
    from vegas_core.options import EngineOptions
    return Engine(device="cpu", dtype="float32", loaded=default_model,
                  options=EngineOptions(max_prefill_tokens=2048, max_num_seqs=128, trace=True,
                                        kv_cache_bytes=3 << 30))


@pytest.fixture(scope="session")
def long_text_ids(default_model):
    """About 2,100 tokens of real text that Python ships: the source of `textwrap`."""
    return default_model.tokenizer.encode(inspect.getsource(textwrap))[:2100]


SHORT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Translate 'good morning' into Spanish and German.",
]


@pytest.fixture(scope="session")
def six_prompts(default_model, long_text_ids):
    """Five short chat prompts and one long input (>= 2,000 tokens of real text), as token ids."""
    tok = default_model.tokenizer
    chats = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))
             for p in SHORT_PROMPTS]
    return chats + [long_text_ids]

