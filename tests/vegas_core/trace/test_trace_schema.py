import numpy as np
import pytest
from pydantic import ValidationError

from vegas_core.trace import DraftToken, Iteration, RunConfig, Selection, Trace


def _iteration_kwargs(**overrides):
    kw = dict(index=0, step=0, position=10,
              drafts=[DraftToken(token_id=5, draft_prob=0.9, target_prob=0.8, accepted=True),
                      DraftToken(token_id=6, draft_prob=0.7, target_prob=0.1, accepted=False)],
              num_accepted=1, emitted=[5, 7], final_token=7, final_kind="correction")
    kw.update(overrides)
    return kw


def test_valid_iteration_builds():
    it = Iteration(**_iteration_kwargs())
    assert it.emitted == [5, 7] and it.selection is None


@pytest.mark.parametrize("overrides,message", [
    (dict(num_accepted=3), "num_accepted 3 exceeds the 2 drafts"),
    (dict(num_accepted=0, emitted=[7]), "not the first num_accepted=0"),
    (dict(emitted=[5, 6, 7]), "emitted"),
    (dict(emitted=[]), "non-empty prefix"),
    (dict(emitted=[7]), "non-empty prefix"),
    (dict(final_kind="bonus"), 'should be "correction"'),
    (dict(drafts=[], num_accepted=0, emitted=[7], final_kind="correction"), 'should be "decode"'),
    (dict(draft_ms=float("nan")), "finite"),
    (dict(verify_ms=float("inf")), "finite"),
    (dict(verify_ms=-1.0), "greater than or equal to 0"),
    (dict(surprise=1), "Extra inputs are not permitted"),
    (dict(selection=Selection(granularity="layer", base=11, budget=1, layers=[""])), "past the verified"),
])
def test_inconsistent_iterations_are_rejected(overrides, message):
    with pytest.raises(ValidationError, match=message):
        Iteration(**_iteration_kwargs(**overrides))


def test_a_run_ending_inside_an_iteration_emits_a_prefix():
    # max_tokens (or a stop token) reached after the accepted draft: the correction 7 was never output,
    # yet the verifier accepted one draft (the drafter's count) and chose 7.
    it = Iteration(**_iteration_kwargs(emitted=[5]))
    assert it.emitted == [5] and it.num_accepted == 1 and it.final_token == 7


def test_nan_probability_is_rejected():
    with pytest.raises(ValidationError, match="finite"):
        DraftToken(token_id=1, draft_prob=float("nan"), target_prob=0.5, accepted=True)


def test_selection_layouts_and_positions():
    layer = Selection.from_positions("layer", base=100, budget=3, sets=[[1, 5, 9], [0, 2, 4]])
    np.testing.assert_array_equal(layer.positions(1), [0, 2, 4])
    np.testing.assert_array_equal(layer.positions(1, head=2), [0, 2, 4])     # heads share the set
    heads = Selection.from_positions("kv-head", base=100, budget=2, sets=[[[3, 1], [7, 8]], [[], [99]]])
    np.testing.assert_array_equal(heads.positions(0, 0), [1, 3])
    np.testing.assert_array_equal(heads.positions(1, 1), [99])
    assert heads.positions(1, 0).size == 0 and heads.num_layers == 2
    with pytest.raises(ValueError, match="needs a head index"):
        heads.positions(0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(granularity="layer", heads=[["AA=="]]), '"layer" needs `layers`'),
    (dict(granularity="layer", layers=["AA=="], heads=[["AA=="]]), '"layer" needs `layers` and no `heads`'),
    (dict(granularity="kv-head", layers=["AA=="]), '"kv-head" needs `heads`'),
    (dict(granularity="kv-head", heads=[["AA==", "AA=="], ["AA=="]]), "same number of KV heads"),
    (dict(granularity="layer", layers=["not base64!"]), "not base64"),
])
def test_bad_selections_are_rejected(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        Selection(base=0, budget=1, **kwargs)


@pytest.mark.parametrize("field,value", [("gamma", 0), ("gamma", 17), ("sparsity", 0.0), ("sparsity", 1.5),
                                         ("method", "medusa"), ("granularity", "token"), ("top_p", 0.0)])
def test_run_config_ranges(field, value):
    kw = dict(method="vegas", gamma=4, sparsity=0.07, max_tokens=16)
    kw[field] = value
    with pytest.raises(ValidationError):
        RunConfig(**kw)


def test_trace_checks_shapes_against_model_and_gamma(trace_dict):
    def mutated(fn):
        d = {**trace_dict, "requests": [dict(r) for r in trace_dict["requests"]]}
        fn(d)
        return d

    it = trace_dict["requests"][0]["iterations"][0]
    cases = [
        ({**it, "recall": [0.5]}, "recall has 1 layers, the model 30"),
        ({**it, "selection": {**it["selection"], "layers": it["selection"]["layers"][:2]}},
         "selection has 2 layers, the model 30"),
    ]
    for bad, message in cases:
        d = mutated(lambda d: d["requests"][0].__setitem__("iterations", [bad]))
        with pytest.raises(ValidationError, match=message):
            Trace.model_validate(d)
    heads = trace_dict["requests"][1]["iterations"][1]
    bad = {**heads, "selection": {**heads["selection"], "heads": [h[:2] for h in heads["selection"]["heads"]]}}
    first = trace_dict["requests"][1]["iterations"][:1]
    d = mutated(lambda d: d["requests"][1].__setitem__("iterations", first + [bad]))
    with pytest.raises(ValidationError, match="2 KV heads per layer, the model 3"):
        Trace.model_validate(d)
    d = mutated(lambda d: d.__setitem__("config", {**d["config"], "gamma": 2}))
    with pytest.raises(ValidationError, match="4 drafts exceed gamma 2"):
        Trace.model_validate(d)
    d = mutated(lambda d: d["requests"][0].__setitem__("iterations", trace_dict["requests"][0]["iterations"][1:]))
    with pytest.raises(ValidationError, match="iterations must be listed in order"):
        Trace.model_validate(d)
    with pytest.raises(ValidationError, match="ISO 8601"):
        Trace.model_validate({**trace_dict, "created": "yesterday"})
