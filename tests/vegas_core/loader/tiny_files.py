"""Tiny model files written without transformers (fast enough to write dozens per test): a Llama
GGUF whose metadata keys can be overridden one by one, and a Hugging Face directory whose
config.json, generation_config.json and index can be edited. Weights are random, of the shapes the
config implies; the tokenizer is the byte-level BPE of the test helpers."""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from tests.vegas_core.conftest import CHATML_TEMPLATE, TINY_VOCAB_SIZE, write_tiny_tokenizer

TINY = dict(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, max_position_embeddings=512)
DELETE = object()   # an override that leaves the key out


def tiny_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    h, inter, v = TINY["hidden_size"], TINY["intermediate_size"], TINY["vocab_size"]
    q, kv = TINY["num_heads"] * TINY["head_dim"], TINY["num_kv_heads"] * TINY["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(TINY["num_layers"]):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in {
            "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
            "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
            "mlp.down_proj.weight": (h, inter)}.items()})
    g = torch.Generator().manual_seed(seed)
    return {name: (1.0 + 0.1 * torch.randn(shape, generator=g)) if "norm" in name
            else 0.05 * torch.randn(shape, generator=g) for name, shape in sorted(shapes.items())}


def _tokenizer_parts(tmp_dir: str):
    write_tiny_tokenizer(tmp_dir)
    tok = json.load(open(os.path.join(tmp_dir, "tokenizer.json")))
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    tokens += [f"<unused{i}>" for i in range(TINY_VOCAB_SIZE - len(tokens))]
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, [3 if t in specials else 1 for t in tokens], merges


def gguf_metadata(tokens, types, merges) -> dict:
    """key -> (value, GGUFValueType name) of a tiny Llama GGUF."""
    return {
        "llama.block_count": (TINY["num_layers"], "UINT32"), "llama.context_length": (512, "UINT32"),
        "llama.embedding_length": (TINY["hidden_size"], "UINT32"),
        "llama.feed_forward_length": (TINY["intermediate_size"], "UINT32"),
        "llama.attention.head_count": (TINY["num_heads"], "UINT32"),
        "llama.attention.head_count_kv": (TINY["num_kv_heads"], "UINT32"),
        "llama.attention.layer_norm_rms_epsilon": (1e-6, "FLOAT32"), "llama.rope.freq_base": (10000.0, "FLOAT32"),
        "llama.attention.key_length": (TINY["head_dim"], "UINT32"),
        "llama.rope.dimension_count": (TINY["head_dim"], "UINT32"),
        "tokenizer.ggml.model": ("gpt2", "STRING"), "tokenizer.ggml.pre": ("gpt2", "STRING"),
        "tokenizer.ggml.tokens": (tokens, "ARRAY"), "tokenizer.ggml.token_type": (types, "ARRAY"),
        "tokenizer.ggml.merges": (merges, "ARRAY"), "tokenizer.ggml.bos_token_id": (256, "UINT32"),
        "tokenizer.ggml.eos_token_id": (258, "UINT32"), "tokenizer.chat_template": (CHATML_TEMPLATE, "STRING"),
    }


def write_tiny_gguf(path, scratch_dir, weights=None, **overrides) -> str:
    """`overrides`: metadata key (dots as "__") -> (value, type name), or DELETE."""
    import gguf

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    leaves = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    os.makedirs(scratch_dir, exist_ok=True)
    metadata = gguf_metadata(*_tokenizer_parts(str(scratch_dir)))
    for key, value in overrides.items():
        key = key.replace("__", ".")
        if value is DELETE:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, (value, vtype) in metadata.items():
        vt = gguf.GGUFValueType[vtype]
        sub = None
        if vt == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType.STRING if isinstance(value[0], str) else gguf.GGUFValueType.INT32
        writer.add_key_value(key, value, vt, sub_type=sub)
    for name, tensor in (weights or tiny_weights()).items():
        if name in names:
            gname = names[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            base, suffix = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{leaves[base]}.{suffix}"
        writer.add_tensor(gname, np.ascontiguousarray(tensor.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def hf_config_dict() -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": TINY["vocab_size"],
            "hidden_size": TINY["hidden_size"], "intermediate_size": TINY["intermediate_size"],
            "num_hidden_layers": TINY["num_layers"], "num_attention_heads": TINY["num_heads"],
            "num_key_value_heads": TINY["num_kv_heads"], "head_dim": TINY["head_dim"],
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "bos_token_id": 256, "eos_token_id": 258, "tie_word_embeddings": False}


def write_tiny_hf_dir(path, config: dict | None = None, weights=None, shards: int = 1,
                      generation_config: dict | None = None) -> str:
    """A Hugging Face directory; `shards` > 1 writes model.safetensors.index.json too."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config_dict() if config is None else config, f)
    if generation_config is not None:
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump(generation_config, f)
    weights = tiny_weights() if weights is None else weights
    names = sorted(weights)
    if shards == 1:
        save_file(weights, os.path.join(path, "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = names[i::shards]
            save_file({n: weights[n] for n in part}, os.path.join(path, file))
            weight_map.update({n: file for n in part})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    write_tiny_tokenizer(str(path))
    return str(path)
