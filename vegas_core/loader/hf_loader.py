"""Load a local Hugging Face model directory: config.json, *.safetensors and tokenizer.json.

Contract: `load_hf_dir(path) -> (ModelConfig, weights, Tokenizer)`; weights keep their HF names and
are converted to float32. Reads both config spellings: transformers < 5 (`rope_theta`,
`rope_scaling` with "type" or "rope_type") and transformers >= 5 (`rope_parameters`). Sliding-window
attention (Mistral, Qwen `use_sliding_window`) is ignored: the engine attends over the full cache;
Gemma 3's (`model_type` gemma3_text) is not: its sliding layers are part of the architecture.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import replace

import torch

from ..config import FULL, SLIDING, SUPPORTED_ARCHITECTURES, ModelConfig
from ..errors import ModelLoadError, UnsupportedArchitectureError
from ..tokenizer import Tokenizer

# model_type -> (our arch, default max_position_embeddings when config.json omits it)
# (the transformers config-class defaults)
_HF_ARCHS = {"llama": ("llama", 2048), "mistral": ("mistral", 131072), "qwen2": ("qwen2", 32768),
             "qwen3": ("qwen3", 32768), "gemma3_text": ("gemma3", 131072)}


def load_hf_dir(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """eos ids: config.json's, then generation_config.json's, then the tokenizer's eos token."""
    cfg = _read_json(os.path.join(path, "config.json"))
    gen = _read_json(os.path.join(path, "generation_config.json"), missing_ok=True) or {}
    eos = _ids(cfg.get("eos_token_id"), "config.json") + _ids(gen.get("eos_token_id"), "generation_config.json")
    config = hf_config(cfg)  # before the tokenizer: an unsupported model_type is the first thing to say
    tokenizer = Tokenizer.from_hf_dir(path, eos_token_ids=eos)
    config = replace(config, eos_token_ids=tokenizer.eos_token_ids,
                      bos_token_id=config.bos_token_id if config.bos_token_id is not None else tokenizer.bos_token_id)
    weights = _load_safetensors(path)
    # Old checkpoints carry the rope table as a buffer; tied models may still store lm_head.
    weights = {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    return config, weights, tokenizer


def hf_config(cfg: dict) -> ModelConfig:
    model_type = cfg.get("model_type")
    if model_type not in _HF_ARCHS:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    if cfg.get("mlp_bias"):
        raise UnsupportedArchitectureError(f"{model_type} with mlp_bias=true is not supported")
    arch, default_context = _HF_ARCHS[model_type]
    by_type = _dict_or_none(cfg, "rope_parameters") or {}
    # Gemma 3 keeps one set per layer type: the global layers' are the model's rope
    rope = (by_type.get(FULL) or {}) if FULL in by_type else by_type
    scaling = _dict_or_none(cfg, "rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling:  # old spelling: {"type": "linear", ...}
        scaling = {("rope_type" if k == "type" else k): v for k, v in scaling.items()}
        if scaling.get("rope_type") in (None, "default"):
            scaling = None
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    try:
        return ModelConfig(
            arch=arch,
            vocab_size=_int(cfg, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_int(cfg, "intermediate_size"),
            num_layers=_int(cfg, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=_int(cfg, "num_key_value_heads", heads),
            head_dim=_int(cfg, "head_dim", hidden // heads),
            max_position_embeddings=_int(cfg, "max_position_embeddings", default_context),
            rms_norm_eps=_float(cfg, "rms_norm_eps", 1e-6),
            rope_theta=_float(cfg, "rope_theta", None) if cfg.get("rope_theta") is not None
            else _float(rope, "rope_theta", 1_000_000.0 if arch == "gemma3" else 10000.0),
            rope_scaling=scaling or None,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama/Qwen3 have q/k/v *and* o_proj biases when set
            attention_bias=True if arch == "qwen2" else bool(cfg.get("attention_bias", False)),
            qk_norm=arch in ("qwen3", "gemma3"),
            bos_token_id=(_ids(cfg.get("bos_token_id"), "config.json") or [None])[0],
            eos_token_ids=tuple(_ids(cfg.get("eos_token_id"), "config.json")),
            name=str(cfg.get("_name_or_path", "")),
            **(_gemma3_fields(cfg, by_type) if arch == "gemma3" else {}),
        )
    except ValueError as exc:   # ModelConfig's own checks (heads not a multiple of KV heads)
        raise ModelLoadError(f"config.json: {exc}") from None


def _int(cfg: dict, key: str, default: int | None = None) -> int:
    """A positive whole number (null or absent: `default`). 4.0 is refused, not truncated:
    a checkpoint that writes sizes as floats is not one we know how to read."""
    v = cfg.get(key)
    if v is None and default is not None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ModelLoadError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _float(cfg: dict, key: str, default: float | None) -> float | None:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ModelLoadError(f"config.json: {key} must be a number, got {v!r}")
    return float(v)


def _dict_or_none(cfg: dict, key: str) -> dict | None:
    v = cfg.get(key)
    if v is not None and not isinstance(v, dict):
        raise ModelLoadError(f"config.json: {key} must be an object or null, got {v!r}")
    return v


def _gemma3_fields(cfg: dict, rope: dict) -> dict:
    """Gemma 3's extras; both config spellings: per-layer-type `rope_parameters` (transformers >= 5)
    or `rope_theta` + `rope_local_base_freq`, and `layer_types` or a `sliding_window_pattern`."""
    if cfg.get("attn_logit_softcapping"):
        raise UnsupportedArchitectureError("Gemma attention-logit soft-capping is not supported")
    if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise UnsupportedArchitectureError(f"gemma3 with hidden_activation {cfg['hidden_activation']!r} is not supported")
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if not types:
        pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    local = (rope.get(SLIDING) or {}).get("rope_theta") or cfg.get("rope_local_base_freq") or 10000.0
    return dict(sliding_window=cfg.get("sliding_window"), layer_types=tuple(types),
                rope_local_theta=float(local), query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256),
                final_logit_softcapping=cfg.get("final_logit_softcapping"))


def _load_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):  # sharded: the index names the shards
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no weight_map (an object naming each weight's shard)")
        shards = sorted(set(weight_map.values()))
        bad = next((s for s in shards if not isinstance(s, str) or os.path.basename(s) != s), None)
        if bad is not None:
            raise ModelLoadError(f"{index}: shard {bad!r} is not a file name in the model directory")
        files = [os.path.join(path, s) for s in shards]
    else:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        found = ", ".join(sorted(os.listdir(path))) or "nothing"
        raise ModelLoadError(f"{path} has no *.safetensors weights (found: {found}); "
                             "PyTorch .bin checkpoints are not supported")
    weights = {}
    for f in files:
        try:
            weights.update({k: v.to(torch.float32) for k, v in load_file(f).items()})
        except Exception as exc:  # safetensors raises its own error types and OSError
            raise ModelLoadError(f"cannot read weights file {f}: {exc}") from None
    return weights


def _read_json(path: str, missing_ok: bool = False) -> dict | None:
    if not os.path.isfile(path):
        if missing_ok:
            return None
        raise ModelLoadError(f"{path} not found")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data


def _ids(value, where: str) -> list[int]:
    """A token id is spelled as an int, a list of ints, or null."""
    values = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    bad = next((v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 0), None)
    if bad is not None:
        raise ModelLoadError(f"{where}: token ids must be integers >= 0 (or a list of them), got {value!r}")
    return values
