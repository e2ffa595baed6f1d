"""Which forward a config gets, and the kernel path refused for Gemma 3 (the fused kernels are
SwiGLU / plain RMSNorm and the attention kernels have no sliding window): "auto" falls back to
the reference, an explicit "triton" is refused with the reason in one line."""
import dataclasses

import pytest
import torch

from vegas_core.options import EngineOptions

from vegas_core.architectures import attention_for, build_causal_lm, kernel_path_unsupported
from vegas_core.config import ModelConfig
from vegas_core.errors import InvalidRequestError
from vegas_core.gemma import GemmaCausalLM
from vegas_core.model import CausalLM

LLAMA = ModelConfig(arch="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
GEMMA = dataclasses.replace(LLAMA, arch="gemma3", qk_norm=True, sliding_window=4,
                            layer_types=("sliding_attention", "full_attention"), rope_local_theta=100.0)


def test_each_architecture_gets_its_forward():
    assert type(build_causal_lm(LLAMA)) is CausalLM
    assert isinstance(build_causal_lm(GEMMA), GemmaCausalLM)


def test_gemma_stays_on_the_reference_path():
    assert kernel_path_unsupported(LLAMA) is None
    assert attention_for(LLAMA, "auto", "triton") == "triton"
    assert attention_for(GEMMA, "auto", "triton") == "reference"
    assert attention_for(GEMMA, "reference", "reference") == "reference"
    with pytest.raises(InvalidRequestError, match="cannot run gemma3: .*sliding window; use attention='reference'") as e:
        attention_for(GEMMA, "triton", "triton")
    assert "\n" not in str(e.value)


def test_a_model_runner_asked_for_kernels_refuses_gemma():
    from vegas_core.model_runner import ModelRunner
    weights = {k: v.clone() for k, v in build_causal_lm(GEMMA).state_dict().items()}
    with pytest.raises(InvalidRequestError, match="attention='triton' cannot run gemma3"):
        ModelRunner(GEMMA, weights, torch.device("cpu"), torch.float32, num_blocks=4,
                    options=EngineOptions(block_size=4, attention="triton"))


def test_layer_windows_and_kv_reads():
    assert GEMMA.layer_windows == (4, None) and GEMMA.global_layers == (1,)
    assert LLAMA.layer_windows == (None, None) and LLAMA.global_layers == (0, 1)
    per_layer = 2 * 1 * 8 * 2
    assert GEMMA.kv_bytes_read(100, 2) == per_layer * (4 + 100)
    assert LLAMA.kv_bytes_read(100, 2) == LLAMA.kv_bytes_per_token(2) * 100
    with pytest.raises(ValueError, match="layer_types"):
        dataclasses.replace(GEMMA, layer_types=("sliding_attention",))
