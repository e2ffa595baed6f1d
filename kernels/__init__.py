"""Triton kernels, each beside a plain PyTorch reference with the same signature (issue 4:
verification attention with Collect-2-Query logit output, token-gather sparse attention, Quest page
scoring, selection). Until they land, the engine runs `vegas_core.attention.ReferenceBackend`, whose
maths the kernels must reproduce; the KV layout they read is `vegas_core.kv_cache.KVPool`'s.

Landed: `verify_attention.verify_attention` (single pass; the split-K merge is still to come).
"""
