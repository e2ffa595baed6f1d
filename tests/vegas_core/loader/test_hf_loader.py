"""Hugging Face directory loader: tiny random Llama / Mistral / Qwen2 / Qwen3 checkpoints saved by
transformers, both config spellings, sharded and bf16 weights, and bad directories."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from vegas_core.errors import ModelLoadError, UnsupportedArchitectureError
from vegas_core.loader import load_model
from vegas_core.loader.hf_loader import hf_config

CASES = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama", {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 128}}),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {"head_dim": 32}),
    ("qwen3", {"attention_bias": True, "tie_word_embeddings": True}),
]


@pytest.mark.parametrize("arch,overrides", CASES)
def test_tiny_checkpoint_config_and_weights(tmp_path, make_tiny_hf_model, arch, overrides):
    path, hf_model = make_tiny_hf_model(tmp_path, arch, **overrides)
    model = load_model(path)
    c, hf = model.config, hf_model.config

    assert model.source == path
    assert c.arch == arch
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads  # Qwen2 has none
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (hf.num_attention_heads, hf.num_key_value_heads, head_dim)
    assert (c.max_position_embeddings, c.rms_norm_eps) == (hf.max_position_embeddings, hf.rms_norm_eps)
    assert c.rope_theta == hf.rope_parameters["rope_theta"]
    expected_scaling = {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"}
    assert c.rope_scaling == (None if expected_scaling["rope_type"] == "default" else expected_scaling)
    assert c.tie_word_embeddings == hf.tie_word_embeddings
    assert c.attention_bias == (arch == "qwen2" or bool(overrides.get("attention_bias")))
    assert c.qk_norm == (arch == "qwen3")
    assert (c.bos_token_id, c.eos_token_ids) == (256, (258,))

    reference = hf_model.state_dict()
    if c.tie_word_embeddings:
        reference.pop("lm_head.weight")
    assert model.weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert model.weights[name].dtype == torch.float32
        torch.testing.assert_close(model.weights[name], tensor, rtol=0, atol=0, msg=name)


def test_tiny_checkpoint_tokenizer(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "llama")
    tok = load_model(path).tokenizer
    text = "the theme of ünïcödé 😀"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(" the") == [tok.token_to_id("Ġthe")]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(prompt)[0] == 257  # <|im_start|> matched whole
    assert max(tok.encode(prompt)) < 272  # every id is a row of the tiny embedding


def test_sharded_bf16_checkpoint(tmp_path, make_tiny_hf_model):
    path, hf_model = make_tiny_hf_model(tmp_path / "base", "qwen2")
    sharded = str(tmp_path / "sharded")
    hf_model.to(torch.bfloat16).save_pretrained(sharded, max_shard_size="40KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(path, name), sharded)
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))

    model = load_model(sharded)
    for name, tensor in hf_model.state_dict().items():
        assert model.weights[name].dtype == torch.float32
        assert torch.equal(model.weights[name], tensor.float()), name


def test_transformers4_config_spelling():
    cfg = {"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 5e5,
           "rope_scaling": {"type": "linear", "factor": 4.0}, "eos_token_id": [7, 9], "rms_norm_eps": 1e-5}
    c = hf_config(cfg)
    assert (c.rope_theta, c.rope_scaling, c.eos_token_ids) == (5e5, {"rope_type": "linear", "factor": 4.0}, (7, 9))
    assert (c.head_dim, c.max_position_embeddings, c.tie_word_embeddings) == (16, 2048, False)
    assert hf_config({**cfg, "rope_scaling": {"rope_type": "default"}}).rope_scaling is None


def test_eos_ids_merge_config_generation_config_and_tokenizer(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "qwen2", eos_token_id=256)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [256, 257]}, f)
    # config, generation_config, then the tokenizer's eos (<|im_end|>), duplicates dropped
    assert load_model(path).config.eos_token_ids == (256, 257, 258)


# --- bad directories ----------------------------------------------------------------------------

def _rewrite_config(path, **changes):
    file = os.path.join(path, "config.json")
    cfg = json.load(open(file))
    cfg.update(changes)
    json.dump(cfg, open(file, "w"))


def test_unsupported_model_type(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "llama")
    _rewrite_config(path, model_type="gpt_neox")
    with pytest.raises(UnsupportedArchitectureError, match="'gpt_neox'.*supported: llama, mistral, qwen2, qwen3"):
        load_model(path)


def test_directory_without_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="directory without config.json; supported: a .gguf file"):
        load_model(str(tmp_path))


def test_directory_without_weights(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "llama")
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
        load_model(path)


def test_corrupt_weights_file(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "llama")
    with open(os.path.join(path, "model.safetensors"), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelLoadError, match="cannot read weights file"):
        load_model(path)


def test_directory_without_tokenizer(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "qwen3")
    os.remove(os.path.join(path, "tokenizer.json"))
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        load_model(path)


def test_config_missing_a_field(tmp_path, make_tiny_hf_model):
    path, _ = make_tiny_hf_model(tmp_path, "llama")
    cfg = json.load(open(os.path.join(path, "config.json")))
    del cfg["hidden_size"]
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(ModelLoadError, match="hidden_size"):
        load_model(path)


def test_missing_weight_is_reported(tmp_path, make_tiny_hf_model):
    from safetensors.torch import load_file, save_file

    path, _ = make_tiny_hf_model(tmp_path, "llama")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, file)
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.up_proj.weight"):
        load_model(path)
