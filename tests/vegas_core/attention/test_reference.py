"""The reference attention's SDPA helper: the GPU variant (never cuDNN; a masked grouped call with
its KV heads repeated) computes what the plain grouped call computes."""
import pytest
import torch

from vegas_core.attention.reference import GPU_SDPA_BACKENDS, attend, attend_gpu, causal_mask
from torch.nn.attention import SDPBackend


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 1), (2, 2)])
@pytest.mark.parametrize("masked", [True, False])
def test_the_gpu_variant_equals_the_grouped_call(heads, kv_heads, masked):
    torch.manual_seed(0)
    rows, ctx, d = 7, 40, 16
    q = torch.randn(1, heads, rows, d)
    k, v = torch.randn(1, kv_heads, ctx, d), torch.randn(1, kv_heads, ctx, d)
    mask = ~causal_mask(rows, ctx, "cpu") if masked else None
    want = attend(q, k, v, mask, 0.25)
    got = attend_gpu(q, k, v, mask, 0.25)
    assert got.shape == want.shape == (1, heads, rows, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Row r sees keys up to ctx - rows + r: the last row sees them all, the first all but rows - 1.
    if masked:
        full = attend(q[:, :, :1], k[:, :, : ctx - rows + 1], v[:, :, : ctx - rows + 1], None, 0.25)
        torch.testing.assert_close(got[:, :, :1], full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 1)])
def test_a_prompt_start_takes_the_unmasked_causal_call(heads, kv_heads):
    """A chunk whose rows are all its keys (`_sdpa`'s GPU case): is_causal equals the explicit mask."""
    torch.manual_seed(1)
    n, d = 12, 16
    q, k, v = torch.randn(1, heads, n, d), torch.randn(1, kv_heads, n, d), torch.randn(1, kv_heads, n, d)
    want = attend(q, k, v, ~causal_mask(n, n, "cpu"), 0.25)
    torch.testing.assert_close(attend_gpu(q, k, v, None, 0.25, causal=True), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attend(q, k, v, None, 0.25, causal=True), want, rtol=1e-5, atol=1e-5)


def test_the_gpu_backends_leave_cudnn_out():
    assert SDPBackend.CUDNN_ATTENTION not in GPU_SDPA_BACKENDS
    assert SDPBackend.EFFICIENT_ATTENTION in GPU_SDPA_BACKENDS   # the masked calls' kernel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_masked_grouped_prefill_call_runs_without_cudnn():
    q = torch.randn(1, 9, 300, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 3, 700, 64, device="cuda", dtype=torch.bfloat16)
    mask = ~causal_mask(300, 700, "cuda")
    out = attend(q, k, k, mask, 0.125)
    torch.testing.assert_close(out.float(), attend_gpu(q.float(), k.float(), k.float(), mask, 0.125),
                               rtol=2e-2, atol=2e-2)
    square = attend(q, k[:, :, :300], k[:, :, :300], None, 0.125, causal=True)
    torch.testing.assert_close(square.float(), attend_gpu(q.float(), k[:, :, :300].float(), k[:, :, :300].float(),
                                                          ~causal_mask(300, 300, "cuda"), 0.125), rtol=2e-2, atol=2e-2)
