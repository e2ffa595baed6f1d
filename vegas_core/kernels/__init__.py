"""Triton kernels, each beside a plain PyTorch reference with the same signature; the KV layout they
read is `vegas_core.kv_cache.KVPool`'s, and `vegas_core.attention.kernel_backend` is the engine's
GPU path through them (the CPU path keeps `vegas_core.attention.ReferenceBackend`).

- `verify_attention`: paged, grouped-query verification attention for 1-17 rows per request,
  split-K with a merge (flash-decoding), log-sum-exp, and bf16 logits of chosen rows
  (Collect-2-Query, all rows, or any list) without changing the output;
- `sparse_attention`: a draft row per request over a token list (per layer or per KV head) plus
  the entries written since the last verification, split over the list with a merge;
- `select`: softmax re-materialisation + mean (in log space) + top-k for a whole model step
  (`select_layers`), and Quest's page bounds beside the pool, page scores and page -> position
  expansion (`quest_positions`);
- `fused`: the decoder layer's element-wise work in three launches (residual add + RMSNorm,
  rotary + K/V pool write, SiLU * up), for the GPU path's CUDA graphs;
- `fused_linear`: a layer's projections with the RMSNorm as prologue and SiLU * up or the
  residual add as epilogue (four launches for a layer's non-attention work), for decode and draft
  steps;
- `pdl`: programmatic dependent launch (Hopper) for the kernels above: each may start while the
  previous one finishes and waits for its memory first;
- `sampling`: a batch's temperature / top-k / top-p / min-p filter and the exponential race over
  each request's counter-based stream in one program per row, by threshold search (no sort);
- `argmax`: each row's first largest logit in two launches over the head's own dtype (a greedy
  chain step's token, without a float32 copy of the logits);
- `split_merge`: flash-decoding's split merge done by the last split to finish (arrival
  counters), and the merge arithmetic verify_attention's two merges share.

CI runs each against its reference under TRITON_INTERPRET=1 (tests/kernels); on a GPU the same
tests run compiled with TRITON_INTERPRET=0. `python -m vegas_core.bench kernels` times them.
"""
