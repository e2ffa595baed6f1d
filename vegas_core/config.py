"""Model configuration: one small dataclass, validated at construction, filled from a GGUF file's
metadata or a Hugging Face config.json by the loaders."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
SLIDING, FULL = "sliding_attention", "full_attention"   # layer types, as transformers names them


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
    # Gemma 3 (`gemma.py`): hybrid attention and its extras. `layer_types` per layer (SLIDING or
    # FULL; empty: every layer full); a sliding layer's query at position p sees keys in
    # (p - sliding_window, p] and rotates with `rope_local_theta` instead of `rope_theta`.
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None   # attention scale = its ** -0.5 (else head_dim's)
    final_logit_softcapping: float | None = None

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHITECTURES:
            from .errors import UnsupportedArchitectureError
            raise UnsupportedArchitectureError(
                f"architecture {self.arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or not set(self.layer_types) <= {SLIDING, FULL}):
            raise ValueError(f"layer_types must give {SLIDING!r} or {FULL!r} for each of the "
                             f"{self.num_layers} layers, got {self.layer_types!r}")
        if SLIDING in self.layer_types and not (self.sliding_window or 0) > 0:
            raise ValueError(f"sliding layers need a sliding_window > 0, got {self.sliding_window!r}")

    def kv_bytes_read(self, context: int, itemsize: int) -> float:
        """Bytes of K and V one decode step of a request at `context` tokens reads: every layer's
        whole context, but a sliding layer's window only (what its attention touches)."""
        per_layer = 2 * self.num_kv_heads * self.head_dim * itemsize
        return sum(per_layer * (context if w is None else min(context, w)) for w in self.layer_windows)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_window(self, layer: int) -> int | None:
        """Keys a query of `layer` sees, counting itself (None: the whole context)."""
        return self.sliding_window if self.layer_types and self.layer_types[layer] == SLIDING else None

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.layer_window(i) for i in range(self.num_layers))

    @property
    def global_layers(self) -> tuple[int, ...]:
        """Layers that attend to the whole context: the only ones drafting selects for."""
        return tuple(i for i in range(self.num_layers) if self.layer_window(i) is None)

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of one token's K and V over all layers, at `itemsize` bytes an element (the unit
        of KV bandwidth and of the pool's size)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * itemsize
