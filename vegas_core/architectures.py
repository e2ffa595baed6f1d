"""Which forward implements a config's architecture.

`build_causal_lm(config)`: `CausalLM` for the Llama family, `gemma.GemmaCausalLM` for Gemma 3.
Both run on either attention path: the kernels take a sliding window per layer
(`attention/kernel_backend.py`), and Gemma's layer keeps PyTorch ops around them (the fused
layer kernels are SwiGLU and plain RMSNorm; `gemma.py` says why that is acceptable).
"""
from __future__ import annotations

from .config import ModelConfig
from .model import CausalLM


def build_causal_lm(config: ModelConfig, backend=None, kernels=None) -> CausalLM:
    """The forward for `config`'s architecture (`CausalLM`'s arguments)."""
    if config.arch == "gemma3":
        from .gemma import GemmaCausalLM
        return GemmaCausalLM(config, backend, kernels)
    return CausalLM(config, backend, kernels)
