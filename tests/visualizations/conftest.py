"""Hand-made traces with known contents: 4 layers, 2 KV heads, gamma 3.

`spec_trace()` (method vegas): a 6-token prompt, then
  it 0  decode                       emits 10                 (no selection: first iteration)
  it 1  drafts 11 12 13, 2 accepted  emits 11 12 + correction 14, selection base 6, layer sets below
  it 2  drafts 15 16 17, 3 accepted  emits 15 16 17 + bonus 18, kv-head granularity
output = [10, 11, 12, 14, 15, 16, 17, 18]
`vanilla_trace(out)`: the same prompt decoded one token per iteration into `out`.
"""
import pytest

from vegas_core.trace import (DraftToken, Iteration, ModelInfo, RequestTrace, RunConfig, Selection,
                              Trace)

LAYERS, KV_HEADS, GAMMA = 4, 2, 3
PROMPT = [1, 2, 3, 4, 5, 6]
OUTPUT = [10, 11, 12, 14, 15, 16, 17, 18]
TEXTS = {1: "The", 2: " quick", 3: " brown", 4: " fox", 5: " jumps", 6: " over", 10: " the", 11: " lazy",
         12: " dog", 13: " cat", 14: ".", 15: " It", 16: " was", 17: " fun", 18: "!", 19: "?"}
# Layer l of iteration 1 selects these prefix positions (base 6: positions 0..5).
LAYER_SETS = [[0, 1], [0, 5], [2, 3, 4], [0]]
HEAD_SETS = [[[0, 1], [2]], [[0], [0]], [[3, 4, 5], []], [[1], [1, 2]]]


def _drafts(ids, accepted):
    return [DraftToken(token_id=t, draft_prob=0.9, target_prob=0.8 if i < accepted else 0.1, accepted=i < accepted)
            for i, t in enumerate(ids)]


def model():
    return ModelInfo(name="tiny", arch="llama", num_layers=LAYERS, num_heads=4, num_kv_heads=KV_HEADS,
                     head_dim=8, vocab_size=64, dtype="float32", device="cpu")


def config(method="vegas", temperature=0.0):
    return RunConfig(method=method, gamma=GAMMA, sparsity=0.5, min_budget=1, max_tokens=8, temperature=temperature)


def spec_trace(method="vegas", output=None, temperature=0.0) -> Trace:
    its = [
        Iteration(index=0, step=2, position=5, drafts=[], num_accepted=0, emitted=[10], final_token=10,
                  final_kind="decode", verify_ms=5.0, start_s=0.0),
        Iteration(index=1, step=3, position=6, drafts=_drafts([11, 12, 13], 2), num_accepted=2, emitted=[11, 12, 14],
                  final_token=14, final_kind="correction",
                  selection=Selection.from_positions("layer", base=6, budget=2, sets=LAYER_SETS),
                  recall=[0.9, 0.8, 0.7, 0.6], draft_ms=3.0, select_ms=1.0, verify_ms=6.0, start_s=0.01),
        Iteration(index=2, step=4, position=9, drafts=_drafts([15, 16, 17], 3), num_accepted=3,
                  emitted=[15, 16, 17, 18], final_token=18, final_kind="bonus",
                  selection=Selection.from_positions("kv-head", base=8, budget=2, sets=HEAD_SETS),
                  draft_ms=5.0, select_ms=1.0, verify_ms=6.0, start_s=0.03),
    ]
    req = RequestTrace(request_id="r0", prompt_token_ids=PROMPT, prompt_text="The quick brown fox jumps over",
                       output_token_ids=output or OUTPUT, output_text=" the lazy dog. It was fun!",
                       finish_reason="length", iterations=its, decode_time_s=0.04)
    return Trace(model=model(), config=config(method, temperature), requests=[req], token_texts=TEXTS)


def vanilla_trace(output=None) -> Trace:
    output = output or OUTPUT
    its = [Iteration(index=i, step=2 + i, position=5 + i, drafts=[], num_accepted=0, emitted=[t], final_token=t,
                     final_kind="decode", verify_ms=5.0, start_s=0.01 * i) for i, t in enumerate(output)]
    req = RequestTrace(request_id="v0", prompt_token_ids=PROMPT, output_token_ids=output,
                       output_text="".join(TEXTS.get(t, "?") for t in output), finish_reason="length",
                       iterations=its, decode_time_s=0.08)
    return Trace(model=model(), config=config("vanilla"), requests=[req], token_texts=TEXTS)


@pytest.fixture
def trace():
    return spec_trace()


@pytest.fixture
def vanilla():
    return vanilla_trace()
