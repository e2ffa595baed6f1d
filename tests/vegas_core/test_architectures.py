"""Which forward a config gets, and Gemma 3 on the kernel path: its attention backend takes each
layer's sliding window (the kernels' window tests: tests/vegas_core/kernels/; the engine on it:
tests/vegas_core/test_kernel_backend.py)."""
import dataclasses

import pytest
import torch

from vegas_core.options import EngineOptions

from vegas_core.architectures import build_causal_lm
from vegas_core.config import ModelConfig
from vegas_core.gemma import GemmaCausalLM
from vegas_core.model import CausalLM

LLAMA = ModelConfig(arch="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
GEMMA = dataclasses.replace(LLAMA, arch="gemma3", qk_norm=True, sliding_window=4,
                            layer_types=("sliding_attention", "full_attention"), rope_local_theta=100.0)


def test_each_architecture_gets_its_forward():
    assert type(build_causal_lm(LLAMA)) is CausalLM
    assert isinstance(build_causal_lm(GEMMA), GemmaCausalLM)


@pytest.mark.parametrize("attention", ["auto", "triton"])
def test_gemma_runs_on_the_kernel_path(attention):
    """Nothing refuses Gemma on the kernel path ("auto" takes it on a GPU; "triton" here runs
    under the interpreter): its backend knows the windows, and only the global layer has a row
    in the collected buffers."""
    from vegas_core.model_runner import ModelRunner, resolve_attention
    device = torch.device("cpu")
    weights = {k: v.clone() for k, v in build_causal_lm(GEMMA).state_dict().items()}
    runner = ModelRunner(GEMMA, weights, device, torch.float32, num_blocks=4,
                         options=EngineOptions(block_size=4, attention=attention))
    assert runner.attention == resolve_attention(attention, device)
    if attention == "triton":
        backend = runner.model.backend
        assert runner.kernels and backend.windows == (4, None)
        assert backend.collect_slot(0) is None and backend.collect_slot(1) == 0


def test_layer_windows_and_kv_reads():
    assert GEMMA.layer_windows == (4, None) and GEMMA.global_layers == (1,)
    assert LLAMA.layer_windows == (None, None) and LLAMA.global_layers == (0, 1)
    per_layer = 2 * 1 * 8 * 2
    assert GEMMA.kv_bytes_read(100, 2) == per_layer * (4 + 100)
    assert LLAMA.kv_bytes_read(100, 2) == LLAMA.kv_bytes_per_token(2) * 100
    with pytest.raises(ValueError, match="layer_types"):
        dataclasses.replace(GEMMA, layer_types=("sliding_attention",))
