"""Is a draft step's sparse attention bound by its random gather? (on the device, after stage.sh:
`python3 scripts/device/probe_sparse_gather.py`). At SmolLM2's shape, batch 64, times
`sparse_attention` over
- random selections (what vegas drafts read: 128-byte rows scattered over a request's pages);
- the same number of positions taken contiguously from the start of each request (the rows a
  compacted copy of the selection would stream);
each at the automatic split count and at 1, 2, 4 and 8 splits; beside them `verify_attention` with
one row over a dense context of the selection's length (a dense kernel over a compacted copy) and
the cost of compacting: one layer's selected K and V gathered into contiguous buffers by torch.
The gap between the first two says what compacting the selection once per iteration (instead of
gathering it in each of gamma draft steps) could save. Writes
$OUT/results/kernels-sparse-gather.json."""
import math

import torch

from kernels.sparse_attention import sparse_attention
from kernels.verify_attention import verify_attention
from probe_setup import setup, write
from vegas_core.bench.kernels import SHAPES, paged_case

probe = setup()
DRY, dev, copy, _bench = probe.dry, probe.dev, probe.copy_TBps, probe.bench
heads, kvh, dim, _ = SHAPES["smollm2"]
batch, tail, block_size = (2 if DRY else 64), 8, 16
records = []
for context, sparsity in (((96, 0.1),) if DRY else ((6144, 0.05), (8192, 0.07))):
    k, v, tables, ctx = paged_case(batch, context, kvh, dim, block_size, dev)
    base = context - tail
    budget = max(1, math.ceil(sparsity * base))
    score = torch.rand(batch, kvh, base, device=dev)
    selections = {
        "random": torch.topk(score, budget, dim=-1).indices.sort(dim=-1).values.to(torch.int32),
        "contiguous": torch.arange(budget, device=dev, dtype=torch.int32).expand(batch, kvh, budget)
                      .contiguous(),
    }
    counts = torch.full((batch,), budget, dtype=torch.int32, device=dev)
    tail_start = torch.full((batch,), base, dtype=torch.int32, device=dev)
    q = torch.randn(batch, heads, dim, device=dev, dtype=torch.bfloat16)
    gathered = 2 * batch * (budget + tail) * kvh * dim * k.element_size()
    common = dict(batch=batch, context=context, sparsity=sparsity, budget=budget, tail=tail,
                  heads=heads, kv_heads=kvh, head_dim=dim, copy_TBps=copy, gathered_bytes=gathered)
    for name, idx in selections.items():
        for splits in (None, 1, 2, 4, 8):
            us = _bench(lambda: sparse_attention(q, k, v, tables, ctx, idx, counts, tail_start,
                                                 dim ** -0.5, num_splits=splits))
            rec = dict(kernel="sparse_attention", selection=name, num_splits=splits, us=us,
                       copy_fraction=gathered / (us * 1e-6) / 1e12 / copy, **common)
            records.append(rec)
            print(context, name, splits, f"{us:.2f} us", f"{rec['copy_fraction']:.0%}")
    # A dense kernel over a compacted copy: one query row over budget + tail keys, fresh pages.
    kc, vc, tc, cc = paged_case(batch, budget + tail, kvh, dim, block_size, dev, placement="sequential")
    loc = torch.arange(0, batch + 1, dtype=torch.int32, device=dev)
    us = _bench(lambda: verify_attention(q, kc, vc, tc, cc, loc, dim ** -0.5, max_ctx=budget + tail,
                                         max_q=1))
    records.append(dict(kernel="verify_attention_dense_compact", us=us,
                        copy_fraction=gathered / (us * 1e-6) / 1e12 / copy, **common))
    print(context, "dense verify over compact", f"{us:.2f} us")
    # Compacting one layer's selection: torch gathers of K and V rows into [B, KVH, budget, d].
    idx = selections["random"].long()
    slots = tables.long().gather(1, idx.view(batch, -1) // block_size).view_as(idx) * block_size \
        + idx % block_size
    rows = (slots * kvh + torch.arange(kvh, device=dev).view(1, kvh, 1)).view(-1)
    k_rows, v_rows = k.view(-1, dim), v.view(-1, dim)
    k_out = torch.empty(rows.numel(), dim, device=dev, dtype=k.dtype)
    v_out = torch.empty_like(k_out)

    def compact():
        torch.index_select(k_rows, 0, rows, out=k_out)
        torch.index_select(v_rows, 0, rows, out=v_out)
    us = _bench(compact)
    moved = 2 * 2 * rows.numel() * dim * k.element_size()        # read + write, K and V
    records.append(dict(kernel="compact_selection_torch", us=us, moved_bytes=moved,
                        copy_fraction=moved / (us * 1e-6) / 1e12 / copy, **common))
    print(context, "compact one layer (torch index_select)", f"{us:.2f} us")
    del k, v, kc, vc
    if not DRY:
        torch.cuda.empty_cache()
write(probe, "kernels-sparse-gather", "python scripts/device/probe_sparse_gather.py", records)
