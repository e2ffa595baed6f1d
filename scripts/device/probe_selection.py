"""Where does a Vegas selection's time go, and do other launch sizes do better? (on the device:
`python3 scripts/device/probe_selection.py`). At SmolLM2's shape, batch 64, two collected rows a
request (Collect-2-Query), every layer in one call as the engine runs it (`select_layers`): times
`selection_scores` (the softmax re-materialisation, int32 score bits out) over a grid of position
tiles and warps, and `radix_topk` over a grid of chunk sizes and warps, each checked against the
engine's launch (the same bits, the same positions). The e2e profile put them at 447 and 291 us an
iteration (bench/results/logs/profile-2026-12-03-h200-vegas-g8-greedy-run36-gaps.txt); the floor
of the scoring is its logits read, printed beside it. Writes $OUT/results/kernels-selection-probe.json."""
import torch

from kernels.select import radix_topk, selection_scores
from probe_setup import setup, write
from vegas_core.bench.kernels import SHAPES

probe = setup()
DRY, dev, copy, _bench = probe.dry, probe.dev, probe.copy_TBps, probe.bench
heads, kvh, dim, layers = SHAPES["smollm2"]
layers = 2 if DRY else layers
batch, q_rows = (2 if DRY else 64), 9
records = []
for context in ((64,) if DRY else (6144, 8192)):
    rows = 2 * batch
    g = torch.Generator(device="cpu").manual_seed(context)
    logits = (torch.randn(layers, rows, heads, context, generator=g) * 3).to(dev, torch.bfloat16)
    lse = torch.logsumexp(logits.float(), dim=-1)
    row_start = torch.arange(0, rows, 2, dtype=torch.int32, device=dev)
    row_count = torch.full((batch,), 2, dtype=torch.int32, device=dev)
    # ragged prefixes, as the e2e's 4K-7.5K prompts: a request scores its own base only
    bases = torch.randint(context // 2, context - q_rows + 1, (batch,), generator=g,
                          dtype=torch.int32).to(dev)
    n_keys = int(bases.max())
    budget_of = (0.05 * bases.float()).ceil().to(torch.int32)
    k_max = int(budget_of.max())
    view = logits[..., :n_keys]
    read_bytes = int(2 * (bases.long() * layers * 2 * heads).sum())   # the logits below each base

    def score(block_n, warps):
        return selection_scores(view, lse, row_start, row_count, bases, kvh, "layer",
                                block_n=block_n, packed="bits", num_warps=warps)

    want = score(1024, 4)
    for block_n in ((64, 128) if DRY else (256, 512, 1024, 2048, 4096)):
        for warps in (2, 4, 8):
            same = bool(torch.equal(score(block_n, warps), want))
            us = _bench(lambda: score(block_n, warps))
            records.append(dict(kernel="selection_scores", context=context, batch=batch,
                                layers=layers, block_n=block_n, num_warps=warps, us=us,
                                same_bits=same, read_bytes=read_bytes,
                                copy_fraction=read_bytes / (us * 1e-6) / 1e12 / copy))
            print(context, "scores", block_n, warps, f"{us:.1f} us", same,
                  f"{records[-1]['copy_fraction']:.0%} of copy")
    keys = want.view(layers * batch, 1, n_keys)
    pos_want = radix_topk(keys, budget_of, k_max)
    for block in ((32, 64) if DRY else (256, 512, 1024, 2048, 4096)):
        for warps in (2, 4, 8):
            same = bool(torch.equal(radix_topk(keys, budget_of, k_max, block=block, num_warps=warps),
                                    pos_want))
            us = _bench(lambda: radix_topk(keys, budget_of, k_max, block=block, num_warps=warps))
            records.append(dict(kernel="radix_topk", context=context, batch=batch, layers=layers,
                                block=block, num_warps=warps, us=us, same_positions=same,
                                key_bytes=keys.numel() * 4))
            print(context, "topk", block, warps, f"{us:.1f} us", same)

write(probe, "kernels-selection-probe", "python3 scripts/device/probe_selection.py", records,
      engine_launch=dict(scores=(1024, 4), topk=(1024, 4)))
