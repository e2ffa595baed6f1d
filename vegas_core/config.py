"""Model configuration: one small dataclass, validated at construction, filled from a GGUF file's
metadata or a Hugging Face config.json by the loaders."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    arch: str                       # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF-style rope_scaling dict ({"rope_type": "linear"|"dynamic"|"yarn"|"llama3", "factor": ..., ...}) or None
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False    # qwen2: bias on q/k/v projections
    qk_norm: bool = False           # qwen3: per-head RMSNorm on q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = ""

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHITECTURES:
            from .errors import UnsupportedArchitectureError
            raise UnsupportedArchitectureError(
                f"architecture {self.arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of one token's K and V over all layers, at `itemsize` bytes an element (the unit
        of KV bandwidth and of the pool's size)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * itemsize
