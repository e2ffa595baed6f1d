"""A hand-built, realistic trace shared by the trace tests: SmolLM2-135M shapes (30 layers, 3 KV
heads), gamma 4, two requests decoded in the same batched steps 0-2 (so they share timings), one with
layer selections and one with kv-head selections, covering correction, bonus and plain decode."""
import numpy as np
import pytest

from vegas_core.trace import (DraftToken, Iteration, ModelInfo, RequestTrace, RunConfig, Selection,
                              Trace)

LAYERS, KV_HEADS = 30, 3
STEP_START_S = [0.0, 0.01, 0.02]
DRAFT_MS, SELECT_MS, VERIFY_MS = 4.0, 1.0, 5.0


def _iteration(index, position, drafts, num_accepted, final_token, selection=None, recall=None):
    """drafts: token ids; the first num_accepted are accepted."""
    toks = [DraftToken(token_id=t, draft_prob=0.5 + 0.01 * i, target_prob=0.4 + 0.1 * (i < num_accepted),
                       accepted=i < num_accepted) for i, t in enumerate(drafts)]
    kind = "decode" if not drafts else ("bonus" if num_accepted == len(drafts) else "correction")
    return Iteration(index=index, step=index, position=position, drafts=toks, num_accepted=num_accepted,
                     emitted=list(drafts[:num_accepted]) + [final_token], final_token=final_token,
                     final_kind=kind, selection=selection, recall=recall,
                     draft_ms=DRAFT_MS if drafts else 0.0, select_ms=SELECT_MS if drafts else 0.0,
                     verify_ms=VERIFY_MS, start_s=STEP_START_S[index])


def _layer_selection(base, rng):
    sets = [np.sort(rng.choice(base, size=min(base, 6), replace=False)) for _ in range(LAYERS)]
    return Selection.from_positions("layer", base=base, budget=6, sets=sets)


def _head_selection(base, rng):
    sets = [[rng.choice(base, size=min(base, 6), replace=False) for _ in range(KV_HEADS)]
            for _ in range(LAYERS)]
    return Selection.from_positions("kv-head", base=base, budget=6, sets=sets)


def build_trace(decode_time_s=None) -> Trace:
    rng = np.random.default_rng(7)
    recall = [float(x) for x in np.round(rng.uniform(0.8, 1.0, LAYERS), 4)]
    r0 = RequestTrace(
        request_id="req-0", prompt_token_ids=[1, 9, 8, 7, 6, 5, 4, 3, 2, 10], prompt_text="Hello there",
        output_token_ids=[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110],
        output_text="eleven tokens", finish_reason="length", decode_time_s=0.5, prefill_time_s=0.02,
        iterations=[
            _iteration(0, 11, [101, 102, 900, 901], 2, 103, _layer_selection(11, rng), recall),
            _iteration(1, 14, [104, 105, 106, 107], 4, 108, _layer_selection(14, rng), recall),
            _iteration(2, 19, [109, 902, 903, 904], 1, 110, _layer_selection(19, rng), recall),
        ])
    r1 = RequestTrace(
        request_id="req-1", prompt_token_ids=[1, 20, 21], output_token_ids=[200, 201, 202, 203, 204, 205, 206],
        output_text="seven tokens", finish_reason="stop", decode_time_s=0.25, prefill_time_s=0.01,
        iterations=[
            _iteration(0, 4, [], 0, 201),
            _iteration(1, 5, [950, 951, 952, 953], 0, 202, _head_selection(5, rng)),
            _iteration(2, 6, [203, 204, 205], 3, 206, _head_selection(6, rng), recall),
        ])
    return Trace(
        created="2025-01-02T03:04:05+00:00",
        model=ModelInfo(name="SmolLM2-135M-Instruct", arch="llama", num_layers=LAYERS, num_heads=9,
                        num_kv_heads=KV_HEADS, head_dim=64, vocab_size=49152, dtype="bfloat16",
                        device="cuda:0"),
        config=RunConfig(method="vegas", granularity="layer", gamma=4, sparsity=0.07, min_budget=256,
                         sink=4, page_size=16, temperature=0.7, top_p=0.9, top_k=50, min_p=0.0, seed=1234,
                         max_tokens=11),
        requests=[r0, r1],
        token_texts={100: "Hi", 101: " there", 900: "<0x0A>", 206: "."},
        decode_time_s=decode_time_s,
    )


@pytest.fixture
def make_trace():
    """The builder itself, for tests that need a variant (e.g. a run-level decode_time_s)."""
    return build_trace


@pytest.fixture
def trace() -> Trace:
    return build_trace()


@pytest.fixture
def trace_dict(trace) -> dict:
    """The trace as the JSON object a file holds."""
    return trace.model_dump(mode="json")
