"""`python -m vegas_core.bench agreement`: do the Triton kernels give the reference path's answers?

Two engines in one process share the weights: one on the kernel path (`attention="triton"`), one
forced onto the PyTorch reference (`attention="reference"`). Every method at both granularities
(and vanilla) generates greedily for the same chat prompts on both. Per method the record gives
- `exact_match_rate`: outputs identical between the two paths;
- `vs_vanilla_rate`: the kernel path's output identical to the kernel path's own vanilla (lossless
  on the GPU);
- at each first divergence, the reference path's logit gap there: logit(reference's token) -
  logit(kernel path's token) under full attention after the common prefix. A gap of a few bf16
  ulps says two almost-tied candidates swapped through rounding, not a wrong kernel.
"""
from __future__ import annotations

import argparse

from . import common

PROMPTS = [
    "What is the capital of France?", "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.", "List three uses of a paperclip.",
    "Translate 'good morning' into Spanish and German.", "Give me a short recipe for pancakes.",
    "What does a CPU cache do?", "Name four planets of the solar system.",
    "Why do cats purr?", "Summarise the plot of Romeo and Juliet in three sentences.",
    "What is photosynthesis?", "Give three tips for learning a new language.",
    "Write a limerick about a programmer.", "How does a bicycle stay upright?",
    "What is the difference between weather and climate?", "Explain recursion to a child.",
    "Write a short email asking for a meeting next week.", "What are prime numbers? Give examples.",
    "Describe the water cycle.", "What is the Pythagorean theorem?",
    "Suggest a name for a coffee shop and explain it.", "How do vaccines work?",
    "Write Python code that reverses a string.", "What causes the seasons on Earth?",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p, attention=False)   # it runs both paths
    p.add_argument("--gen-tokens", type=int, default=48, help="tokens per prompt (default: 48)")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many (default: {len(PROMPTS)})")
    p.add_argument("--gamma", type=int, default=6)
    p.add_argument("--sparsity", type=float, default=0.1)
    p.add_argument("--min-budget", type=int, default=16)
    p.add_argument("--methods", nargs="+", default=None,
                   help="method[/granularity] to compare (default: vanilla and every method at both "
                        "granularities)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(args, argv: list[str]) -> str:
    from ..engine import Engine
    from ..options import EngineOptions
    from ..loader import load_model
    from ..sampling import SamplingParams
    from ..spec import SpecParams

    loaded = load_model(args.model)
    prompts = PROMPTS[: args.prompts]
    engines = {}
    for path in ("triton", "reference"):
        opts = EngineOptions(kv_cache_bytes=2 << 30, max_num_seqs=len(prompts), attention=path,
                             deterministic=args.deterministic)
        engines[path] = Engine(args.model, args.device, args.dtype, options=opts, loaded=loaded)
    kernel, ref = engines["triton"], engines["reference"]
    sampling = SamplingParams(max_tokens=args.gen_tokens, ignore_eos=True)
    specs = [SpecParams(method="vanilla")] + [
        SpecParams(method=m, gamma=args.gamma, sparsity=args.sparsity, min_budget=args.min_budget, granularity=g)
        for m in ("stream", "quest", "specextend", "vegas", "vegas-all") for g in ("layer", "kv-head")]
    if args.methods:
        wanted = {m if "/" in m else f"{m}/layer" for m in args.methods} | {"vanilla/layer"}
        specs = [s for s in specs if f"{s.method}/{s.granularity}" in wanted]
    records, vanilla = [], None
    bar = common.progress_bar(len(specs), "agreement")
    for spec in specs:
        out = {path: [r.token_ids for r in e.generate(prompts, sampling, spec=spec, chat=True)]
               for path, e in engines.items()}
        if spec.method == "vanilla":
            vanilla = out["triton"]
        gaps = []
        for i, (a, b) in enumerate(zip(out["reference"], out["triton"])):
            at = _first_divergence(a, b)
            if at is None:
                continue
            prefix = ref.encode_prompt(prompts[i], chat=True) + a[:at]
            logits = ref.core.next_token_logits(prefix)
            gaps.append(dict(prompt=i, position=at, reference_token=a[at], kernel_token=b[at],
                             logit_gap=float(logits[a[at]] - logits[b[at]])))
        same = [a == b for a, b in zip(out["reference"], out["triton"])]
        lossless = [a == v for a, v in zip(out["triton"], vanilla)]
        records.append(dict(method=spec.method, granularity=spec.granularity if spec.speculative else None,
                            gamma=spec.gamma if spec.speculative else None,
                            sparsity=spec.sparsity if spec.speculative else None,
                            exact_match_rate=sum(same) / len(same), vs_vanilla_rate=sum(lossless) / len(lossless),
                            divergences=gaps))
        # Written after every method, so a run stopped early still leaves what it measured.
        path = common.write_results(
            "agreement", args.out, kernel.device, argv, records, model=kernel.source,
            model_name=kernel.config.name, dtype=str(kernel.dtype).replace("torch.", ""), mode=kernel.mode,
            prompts=len(prompts), gen_tokens=args.gen_tokens, sampling="greedy (temperature 0), ignore_eos",
            complete=len(records) == len(specs))
        bar.update(1)
    bar.close()
    rows = [[r["method"], r["granularity"] or "-", r["exact_match_rate"], r["vs_vanilla_rate"], len(r["divergences"]),
             max((abs(d["logit_gap"]) for d in r["divergences"]), default=None)] for r in records]
    common.print_table(f"kernel path vs reference path: {common.device_description(kernel.device)}, "
                       f"{len(prompts)} prompts x {args.gen_tokens} tokens",
                       ["method", "gran.", "= reference", "= vanilla", "divergences", "max |logit gap|"], rows)
    print(f"wrote {path}")
    return path

