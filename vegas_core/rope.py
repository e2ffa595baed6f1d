"""Rotary position embeddings, with the scaling types a Hugging Face config can declare.

Contract: `RotaryEmbedding(config).cos_sin(positions, seq_lens)` returns cos and sin of shape
[T, head_dim] for flat token positions; `apply_rotary(x, cos, sin)` rotates [T, heads, head_dim]
in the "rotate half" layout that Hugging Face checkpoints (and our GGUF loader, which undoes
llama.cpp's permutation) use. Supported `rope_type`s: default, linear, dynamic (NTK), yarn, llama3.
"""
from __future__ import annotations

import math

import torch

from .config import ModelConfig
from .errors import UnsupportedArchitectureError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _yarn_inv_freq(base: float, dim: int, params: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = params.get("factor") or max_pos / params["original_max_position_embeddings"]
    orig_max = params.get("original_max_position_embeddings") or max_pos

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = params.get("attention_factor")
    if attn is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(orig_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp  # high-frequency dims keep their original frequency
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attn)


def _llama3_inv_freq(inv: torch.Tensor, params: dict) -> torch.Tensor:
    factor, low_f, high_f = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low_f, inv / factor, inv)
    smooth = (old_len / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high_f) & ~(wavelen > old_len / low_f)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    def __init__(self, config: ModelConfig):
        self.dim = config.head_dim
        self.base = config.rope_theta
        self.max_pos = config.max_position_embeddings
        params = dict(config.rope_scaling or {})
        self.rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"rope scaling type {self.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        self.params = params
        self.attention_scaling = 1.0
        inv = _base_inv_freq(self.base, self.dim)
        if self.rope_type == "linear":
            inv = inv / params["factor"]
        elif self.rope_type == "yarn":
            inv, self.attention_scaling = _yarn_inv_freq(self.base, self.dim, params, self.max_pos)
        elif self.rope_type == "llama3":
            inv = _llama3_inv_freq(inv, params)
        self.inv_freq = inv  # float32, CPU; moved to the device on first use
        self._cache: dict[torch.device, torch.Tensor] = {}

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        if device not in self._cache:
            self._cache[device] = self.inv_freq.to(device)
        return self._cache[device]

    def _dynamic_inv_freq(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """NTK-aware base per token, from the length of the request it belongs to (as Hugging Face
        does per forward call: the largest position in the call plus one, never below max_pos)."""
        factor = self.params["factor"]
        seq = torch.clamp(seq_lens.float(), min=self.max_pos)
        base = self.base * ((factor * seq / self.max_pos) - (factor - 1)) ** (self.dim / (self.dim - 2))
        exponents = torch.arange(0, self.dim, 2, device=seq.device).float() / self.dim
        return 1.0 / (base[:, None] ** exponents[None, :])

    def cos_sin(self, positions: torch.Tensor, seq_lens: torch.Tensor | None = None):
        """cos, sin [T, head_dim] float32. `seq_lens` [T] (dynamic only): per token, the largest
        position of its request in this call plus one."""
        pos = positions.float()
        if self.rope_type == "dynamic":
            if seq_lens is None:
                seq_lens = positions + 1
            freqs = pos[:, None] * self._dynamic_inv_freq(seq_lens)
        else:
            freqs = pos[:, None] * self._inv_freq_on(positions.device)[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, head_dim] or already [T, 1, head_dim] in x's dtype."""
    if cos.dim() == 2:
        cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
