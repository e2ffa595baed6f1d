"""The app's engine warmed up before its first request, on a GPU.

CUDA graphs are captured, and Triton kernels compiled, the first time a forward of a new shape
runs: per method and batch-size bucket. Without a warm-up the first requests of each method, and
the first time several users stream at once, wait for that (seconds), and a client measuring the
app saw runs vary several-fold. So the worker runs each method at the app's own speculation
settings on every batch bucket up to `--concurrency` once, before it says it is ready.
"""
from __future__ import annotations

from collections.abc import Callable

from vegas_core.graphs import BATCH_BUCKETS
from vegas_core.sampling import SamplingParams
from vegas_core.spec import METHODS, SpecParams

# The Generate tab's and the API's defaults (gamma 4, sparsity 0.07, budget 16): graphs are keyed by
# the verification's rows, so these are the shapes the first users run.
APP_SPEC = dict(gamma=4, sparsity=0.07, min_budget=16)
PROMPT = "Say hello."


def warm_up_plan(concurrency: int, methods: tuple[str, ...] = METHODS) -> list[tuple[str, int]]:
    """(method, batch) pairs: every method at every batch bucket up to `concurrency` requests."""
    batches = sorted({b for b in BATCH_BUCKETS if b < concurrency} | {concurrency})
    return [(m, b) for m in methods for b in batches]


def warm_up(engine, concurrency: int, progress: Callable[[int, int, str, int], None] | None = None,
            methods: tuple[str, ...] = METHODS, settings: dict | None = None) -> bool:
    """Run the plan on `engine` (greedy, a few iterations each) with the app's speculation settings
    (or `settings`). False, with nothing run, where the engine captures no graphs (a CPU, `--eager`)."""
    if engine.core.runner.graphs is None:
        return False
    plan = warm_up_plan(concurrency, methods)
    # a base model (Gemma-3-270M) has no chat template: a plain prompt
    ids = engine.encode_prompt(PROMPT, chat=engine.tokenizer.chat_template is not None)
    for i, (method, batch) in enumerate(plan):
        if progress is not None:
            progress(i, len(plan), method, batch)
        spec = SpecParams(method=method, **({} if method == "vanilla" else settings or APP_SPEC))
        engine.warm_up(ids, SamplingParams(), spec, batch=batch)
    return True
