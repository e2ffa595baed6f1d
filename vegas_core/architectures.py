"""Which forward implements a config's architecture, and which attention paths it can run on.

`build_causal_lm(config)`: `CausalLM` for the Llama family, `gemma.GemmaCausalLM` for Gemma 3.
`attention_for(config, asked, resolved)`: the Triton kernel path (`attention/kernel_backend.py`,
fused ops, CUDA graphs) implements SwiGLU, plain RMSNorm and full attention only, so a model with
sliding-window layers or Gemma's layer (GeGLU, (1 + w) norms, post-norms) stays on the PyTorch
reference: "auto" falls back to it, an explicit "triton" is refused with the reason.
"""
from __future__ import annotations

from .config import ModelConfig
from .errors import InvalidRequestError
from .model import CausalLM


def build_causal_lm(config: ModelConfig, backend=None, kernels=None) -> CausalLM:
    """The forward for `config`'s architecture (`CausalLM`'s arguments)."""
    if config.arch == "gemma3":
        from .gemma import GemmaCausalLM
        return GemmaCausalLM(config, backend, kernels)
    return CausalLM(config, backend, kernels)


def kernel_path_unsupported(config: ModelConfig) -> str | None:
    """Why the Triton path cannot run `config` (None: it can)."""
    if config.arch == "gemma3":
        return ("the fused kernels implement SwiGLU and plain RMSNorm, not Gemma's GeGLU and "
                "(1 + w) pre/post norms, and the attention kernels have no sliding window")
    if any(w is not None for w in config.layer_windows):
        return "the attention kernels have no sliding window"
    return None


def attention_for(config: ModelConfig, asked: str, resolved: str) -> str:
    """`resolved` (from `model_runner.resolve_attention`), unless the kernel path cannot run it."""
    reason = kernel_path_unsupported(config)
    if resolved != "triton" or reason is None:
        return resolved
    if asked == "auto":
        return "reference"
    raise InvalidRequestError(f"attention='triton' cannot run {config.name or config.arch}: {reason}; "
                              "use attention='reference' (or 'auto')")
