"""Gemma 3 in our own forward: the Llama-family modules of `model.py` with Gemma's differences.

- RMSNorm scales by `(1 + w)` and rounds after the multiply (weights stored as Hugging Face stores
  them; llama.cpp's GGUF stores `1 + w`, which the loader turns back);
- four norms a layer: the attention output and the MLP output are normalised again before their
  residual adds (post_attention_layernorm, post_feedforward_layernorm), and the MLP input has its
  own (pre_feedforward_layernorm); per-head q/k norms of the same kind;
- GeGLU (tanh-approximated GELU of the gate times up) instead of SwiGLU;
- embeddings scaled by sqrt(hidden_size), in the activation dtype, as transformers does;
- hybrid attention: sliding layers (`config.layer_types`) see a window of keys and rotate with the
  local RoPE base, global layers see everything with the global base; the window itself is the
  attention backend's job (`ReferenceBackend` or `KernelBackend`, `windows=config.layer_windows`);
- attention scale `query_pre_attn_scalar ** -0.5`, optional final-logit soft-capping.

Contract as `CausalLM`'s. On the GPU path attention runs through the Triton backend (and the
forwards through CUDA graphs) but the layer's other ops stay PyTorch's: the fused layer kernels
(`KernelOptions`, `model.FusedOps`) implement SwiGLU and plain RMSNorm, not GeGLU and Gemma's
four (1 + w) norms. In a captured graph those extra launches cost no host time; fusing them is
left until a measurement says the layer, not attention, bounds a step.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .model import MLP, Attention, CausalLM
from .rope import RotaryEmbedding


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(Attention):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)


class GemmaMLP(MLP):
    def forward(self, x):
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.sliding = cfg.layer_window(layer) is not None
        self.self_attn = GemmaAttention(cfg, layer)
        self.mlp = GemmaMLP(cfg)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, x, cos, sin, backend, pool, meta):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, backend, pool, meta)
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GemmaCausalLM(CausalLM):
    backbone_class = GemmaBackbone

    def __init__(self, cfg: ModelConfig, backend=None, kernels=None):
        super().__init__(cfg, backend)   # no fused layer kernels (the module docstring says why)
        # Sliding layers rotate with the local base and no scaling (transformers' Gemma3 default).
        local = replace(cfg, rope_theta=cfg.rope_local_theta or cfg.rope_theta, rope_scaling=None)
        self.local_rope = RotaryEmbedding(local)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        super().load_weights(weights)
        if self.config.tie_word_embeddings:
            # One tensor for both: a 262K-row vocabulary makes a second copy cost 168M parameters.
            self.lm_head.weight = self.model.embed_tokens.weight

    def rotary_in_qkv(self) -> bool:
        return False

    def _logits(self, input_ids, positions, pool, meta, logit_rows, seq_lens) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        tables = {}
        for sliding, rope in ((False, self.rope), (True, self.local_rope)):
            cos, sin = rope.cos_sin(positions, seq_lens)
            tables[sliding] = (cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype))
        for layer in self.model.layers:
            x = layer(x, *tables[layer.sliding], self.backend, pool, meta)
        if logit_rows is not None:
            x = x[logit_rows]
        logits = self.lm_head(self.model.norm(x))
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
