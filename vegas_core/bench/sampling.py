"""`python -m vegas_core.bench sampling`: the batched sampler, PyTorch against the Triton kernel.

The GPU time of the PyTorch form (`probs_from_tensors` + `sample_keyed`: a sort of the vocabulary
for top-k/top-p, then the hash and race in int64 tensor ops) against the Triton form
(`kernels.sampling.sample_rows`: threshold searches, one program per row), in the same run, at
the rows of a 64-request draft step and of its verification at gamma 9 (640), for SmolLM2's
49,152-token vocabulary and Qwen2.5's 151,936.

The kernel runs twice a setting: its top-k over the compacted candidates (`topk_path`
"candidates", the engine's) and the count search over the whole row that preceded it ("search",
`sample_rows(topk_candidates=False)`; bench/NOTES.md version 61), so one run shows before and after.

Each setting is checked before it is timed: the kernel's probabilities against the reference's
(largest difference, rows whose kept set differs) and its tokens (rows that differ). Times are
medians over CUDA-graph replays (`kernels._bench`). Records: `setting`, `rows`, `vocab`,
`topk_path`, `ways`, `num_warps`, `torch_us`, `kernel_us`, `speedup`, `max_prob_diff`,
`kept_set_mismatch_rows`, `token_mismatch_rows`, `mean_kept`, `mean_candidates` (entries a row
compacted: top-k's or top-p's candidates).
"""
from __future__ import annotations

import argparse

import torch

from . import common

SETTINGS = {  # name: (temperature, top_k (0: off), top_p, min_p)
    "model-card": (0.2, 0, 0.9, 0.0),      # SmolLM2's card: temperature 0.2, top-p 0.9
    "qwen-card": (0.7, 20, 0.8, 0.0),      # Qwen2.5's generation_config: top-k 20, top-p 0.8
    "top-p-0.9-t1": (1.0, 0, 0.9, 0.0),
    "top-k-50": (1.0, 50, 1.0, 0.0),
    "min-p-0.05": (1.0, 0, 1.0, 0.05),
    "plain-t1": (1.0, 0, 1.0, 0.0),
}
PATHS = {"candidates": True, "search": False}   # topk_path: sample_rows(topk_candidates=...)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, nargs="+", default=[64, 640],
                   help="rows per call (default: a 64-request draft step, and its verification at gamma 9)")
    p.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936],
                   help="vocabularies (default: SmolLM2's 49,152 and Qwen2.5's 151,936)")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--topk-paths", nargs="+", default=list(PATHS), choices=list(PATHS),
                   help="the kernel's top-k: over the compacted candidates (the engine's) and/or the "
                        "count search over the row that preceded it (default: both)")
    p.add_argument("--ways", type=int, nargs="+", default=[4],
                   help="candidate keys per search pass, each a power of two (default: 4, the "
                        "kernel's own default, which the engine uses)")
    p.add_argument("--warps", type=int, nargs="+", default=[8], help="num_warps of the kernel (default: 8)")
    p.add_argument("--logit-scale", type=float, default=3.0,
                   help="random logits are N(0, 1) times this (default: 3)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def _inputs(rows, vocab, setting, scale, device):
    from ..random_streams import stream_key
    from ..sampling import SamplingParams, sampling_tensors
    t, k, p, mp = SETTINGS[setting]
    logits = (torch.randn(rows, vocab, device=device) * scale).bfloat16().float()
    params = sampling_tensors([SamplingParams(temperature=t, top_k=k, top_p=p, min_p=mp)] * rows,
                              vocab, device)
    keys = torch.tensor([stream_key(i) for i in range(rows)], device=device)
    positions = torch.arange(rows, device=device) + 1000
    return logits, params, keys, positions


def records_for(setting, rows, vocab, paths, ways, warps, scale, device) -> list[dict]:
    """One record per (top-k path, ways, warps) on one set of inputs; the reference timed once."""
    from ..kernels.sampling import sample_rows, sample_rows_reference
    from ..random_streams import DRAFT
    from .kernels import _bench
    logits, params, keys, positions = _inputs(rows, vocab, setting, scale, device)
    ref_probs, ref_tokens = sample_rows_reference(logits, params, keys, positions, DRAFT)
    torch_us = _bench(lambda: sample_rows_reference(logits, params, keys, positions, DRAFT))
    out = []
    for path in paths:
        for w in ways:
            for nw in warps:
                kw = dict(ways=w, num_warps=nw, topk_candidates=PATHS[path])
                n_c = torch.zeros(rows, dtype=torch.int32, device=device)
                probs, tokens = sample_rows(logits, params, keys, positions, DRAFT, candidates=n_c, **kw)
                kernel_us = _bench(lambda: sample_rows(logits, params, keys, positions, DRAFT, **kw))
                out.append({"kernel": "sample_rows", "setting": setting, "rows": rows, "vocab": vocab,
                            "topk_path": path, "ways": w, "num_warps": nw, "torch_us": torch_us,
                            "kernel_us": kernel_us, "speedup": torch_us / kernel_us,
                            "max_prob_diff": float((probs - ref_probs).abs().max()),
                            "kept_set_mismatch_rows": int(((probs > 0) != (ref_probs > 0)).any(dim=1).sum()),
                            "token_mismatch_rows": int((tokens != ref_tokens).sum()),
                            "mean_kept": float((probs > 0).sum(dim=1).float().mean()),
                            "mean_candidates": float(n_c.float().mean())})
    return out


def run(args, argv: list[str]) -> str:
    device = torch.device(args.device)
    common.require_cuda(device, "sampling", "tests/vegas_core/kernels/test_sampling.py checks the "
                                            "kernel under TRITON_INTERPRET=1")
    torch.manual_seed(0)
    grid = [(s, v, r) for v in args.vocab for s in args.settings for r in args.rows]
    bar = common.progress_bar(len(grid), "sampling")
    records = []
    for setting, vocab, rows in grid:
        records += records_for(setting, rows, vocab, args.topk_paths, args.ways, args.warps,
                               args.logit_scale, device)
        bar.update(1)
    bar.close()
    path = common.write_results("sampling", args.out, device, argv, records,
                                notes="random bf16-valued logits times --logit-scale; medians of "
                                      "CUDA-graph replays")
    cols = ["vocab", "setting", "rows", "top-k path", "ways", "warps", "torch us", "kernel us",
            "speedup", "kept", "candidates", "max |dp|", "set diff rows", "token diff rows"]
    common.print_table(f"sampling: {common.device_description(device)}", cols,
                       [[r["vocab"], r["setting"], r["rows"], r["topk_path"], r["ways"], r["num_warps"],
                         r["torch_us"], r["kernel_us"], r["speedup"], r["mean_kept"],
                         r["mean_candidates"], r["max_prob_diff"], r["kept_set_mismatch_rows"],
                         r["token_mismatch_rows"]] for r in records])
    print(f"wrote {path}")
    return path
