"""Model files with impossible or non-finite numbers fail the load with one line naming the field,
instead of a traceback or a model that decodes token 0; a fuzz over tiny GGUF metadata and HF
configs (written here) sees a clean error or a model that generates, never anything else."""
from __future__ import annotations

import json
import math
import os
import random
import time

import pytest
import torch

from tests.vegas_core.loader.tiny_files import (DELETE, hf_config_dict, tiny_weights, write_tiny_gguf,
                                                write_tiny_hf_dir)
from vegas_core.engine import Engine
from vegas_core.options import EngineOptions
from vegas_core.errors import ModelLoadError, VegasError
from vegas_core.loader import load_model
from vegas_core.sampling import SamplingParams

NAN, INF = float("nan"), float("inf")
CASE_SECONDS = 5.0


def _refused(path, *fragments):
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    message = str(e.value)
    assert "\n" not in message and all(f in message for f in fragments), message
    return message


@pytest.mark.parametrize("key,value,fragments", [
    ("llama__attention__layer_norm_rms_epsilon", (NAN, "FLOAT32"), ["rms_norm_eps", "nan"]),
    ("llama__attention__layer_norm_rms_epsilon", (-1.0, "FLOAT32"), ["rms_norm_eps", "-1.0"]),
    ("llama__rope__freq_base", (0.0, "FLOAT32"), ["rope_theta", "0.0"]),
    ("llama__rope__freq_base", (NAN, "FLOAT32"), ["rope_theta", "nan"]),
    ("llama__feed_forward_length", (100, "UINT32"), ["mlp.", "(64, 100)", "intermediate_size"]),
    ("llama__attention__key_length", (8, "UINT32"), ["_proj.weight has shape", "heads * head_dim"]),
    ("llama__attention__key_length", (7, "UINT32"), ["head_dim must be even"]),
    ("llama__context_length", (1 << 40, "UINT64"), ["max_position_embeddings"]),
    ("llama__block_count", (INF, "FLOAT32"), ["inconsistent GGUF metadata"]),
])
def test_gguf_with_impossible_numbers_is_refused(tmp_path, key, value, fragments):
    path = write_tiny_gguf(tmp_path / "m.gguf", tmp_path / "tok", **{key: value})
    _refused(path, *fragments)


def _hf_dir(tmp_path, **changes):
    config = hf_config_dict()
    config.update(changes)
    return write_tiny_hf_dir(tmp_path / "hf", config)


@pytest.mark.parametrize("changes,fragments", [
    (dict(num_attention_heads=4.0), ["num_attention_heads must be a positive integer, got 4.0"]),
    (dict(hidden_size="64"), ["hidden_size must be a positive integer, got '64'"]),
    (dict(rms_norm_eps=NAN), ["rms_norm_eps", "nan"]),
    (dict(rope_theta=0), ["rope_theta must be a finite number > 0"]),
    (dict(rope_scaling={"rope_type": "linear"}), ["rope_scaling", "incomplete"]),
    (dict(rope_scaling={"rope_type": "linear", "factor": INF}), ["rope_scaling.factor", "inf"]),
    (dict(rope_scaling=[1, 2]), ["rope_scaling must be an object"]),
    (dict(num_key_value_heads=3), ["num_heads 4 is not a multiple of num_kv_heads 3"]),
    (dict(eos_token_id="two"), ["config.json: token ids must be integers", "'two'"]),
])
def test_hf_config_with_impossible_numbers_is_refused(tmp_path, changes, fragments):
    _refused(_hf_dir(tmp_path, **changes), *fragments)


def test_hf_generation_config_index_and_weights_are_checked(tmp_path):
    path = write_tiny_hf_dir(tmp_path / "gen", generation_config={"eos_token_id": "two"})
    _refused(path, "generation_config.json: token ids must be integers", "'two'")
    path = write_tiny_hf_dir(tmp_path / "index", shards=2)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}}, f)
    _refused(path, "has no weight_map")
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"model.norm.weight": "../../elsewhere.safetensors"}}, f)
    _refused(path, "is not a file name in the model directory")
    weights = tiny_weights()
    weights["model.layers.1.mlp.up_proj.weight"][3, 5] = NAN
    _refused(write_tiny_hf_dir(tmp_path / "nan", weights=weights), "model.layers.1.mlp.up_proj.weight",
             "NaN or infinite")


# --- fuzz ---------------------------------------------------------------------------------------

HF_VALUES = [0, -1, 1, 3, 7, 4.0, 2.5, 1e308, NAN, INF, "two", None, [], {}, True, 1 << 40, [258, "x"]]
GGUF_VALUES = [(0, "UINT32"), (1, "UINT32"), (3, "UINT32"), (1 << 31, "UINT32"), (NAN, "FLOAT32"),
               (-1.0, "FLOAT32"), (4.5, "FLOAT32"), (INF, "FLOAT32"), (1e-30, "FLOAT32"), ("x", "STRING"),
               (-7, "INT32"), DELETE]


def _generates_or_refuses_cleanly(load):
    """Load, then generate a few tokens: a one-line VegasError or token ids within the vocabulary."""
    start = time.monotonic()
    try:
        loaded = load()
        engine = Engine(device="cpu", dtype="float32", loaded=loaded, options=EngineOptions(kv_cache_bytes=1 << 22))
        [res] = engine.generate(["the theme"], SamplingParams(max_tokens=3, ignore_eos=True), chat=True)
        logits = engine.core.next_token_logits(res.prompt_ids + res.token_ids)
        assert len(res.token_ids) == 3 and all(0 <= t < loaded.config.vocab_size for t in res.token_ids)
        assert bool(torch.isfinite(logits).all())
        outcome = "generated"
    except VegasError as e:
        assert "\n" not in str(e)
        outcome = type(e).__name__
    assert time.monotonic() - start < CASE_SECONDS
    return outcome


def test_fuzzed_gguf_metadata_gives_a_clean_error_or_a_working_model(tmp_path):
    from tests.vegas_core.loader.tiny_files import gguf_metadata
    rng = random.Random(37)
    keys = [k for k, (v, t) in gguf_metadata([""], [1], []).items() if t != "ARRAY"]
    outcomes = []
    for i in range(24):
        changes = {k.replace(".", "__"): rng.choice(GGUF_VALUES) for k in rng.sample(keys, rng.randint(1, 2))}
        try:
            path = write_tiny_gguf(tmp_path / f"m{i}.gguf", tmp_path / "tok", **changes)
        except Exception:   # noqa: BLE001 -- the writer refused this value itself: nothing to load
            continue
        outcomes.append(_generates_or_refuses_cleanly(lambda: load_model(path)))
    assert "generated" in outcomes and "ModelLoadError" in outcomes, outcomes


def test_fuzzed_hf_configs_give_a_clean_error_or_a_working_model(tmp_path):
    rng = random.Random(37)
    base = hf_config_dict()
    keys = list(base) + ["rope_scaling", "rope_parameters", "num_key_value_heads"]
    path = write_tiny_hf_dir(tmp_path / "hf")
    outcomes = []
    for _ in range(40):
        config = dict(base)
        for key in rng.sample(keys, rng.randint(1, 2)):
            config[key] = rng.choice(HF_VALUES + [{"rope_type": "yarn", "factor": rng.choice(HF_VALUES)}])
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
        outcomes.append(_generates_or_refuses_cleanly(lambda: load_model(path)))
    assert "generated" in outcomes and "ModelLoadError" in outcomes, outcomes
    assert not any(isinstance(v, float) and math.isnan(v) for v in base.values())
