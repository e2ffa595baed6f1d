"""`python -m vegas_core.bench acceptance`: acceptance length and attention recall of every drafting
policy on one long-input prompt (issue 3's "first numbers").

The prompt is `--text-tokens` tokens of real text (the standard-library corpus of `texts.py`),
either wrapped in a chat instruction (`--workload summarise`, the default: the model reads a long
input and writes about it, as in the paper's long-input tasks) or given bare for the model to
continue (`--workload continue`). Vanilla greedy decoding runs first; then every speculative
policy (layer granularity, plus the per-KV-head variant of the verification-guided ones) generates
the same number of tokens at temperature 0 with attention recall recorded. `matches_vanilla` says
whether its tokens equal vanilla's (the method is lossless: they must, up to float ties).

Recall of a draft step in a layer is the fraction of the full-attention softmax mass (mean over
query heads) that the attended set (selected prefix entries + everything since the last
verification) covers; `recall_per_layer` averages it over every draft step of the run.
`tokens_per_s` here includes that full attention per draft step and layer: it is no speed figure.
"""
from __future__ import annotations

import argparse

from . import common, texts

INSTRUCTION = "Summarise what the following Python source code does, module by module."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..spec import METHODS

    common.add_model_arguments(p)
    p.add_argument("--text-tokens", type=int, default=2048, help="tokens of real text in the prompt (default: 2048)")
    p.add_argument("--gen-tokens", type=int, default=128, help="tokens generated per run (default: 128)")
    p.add_argument("--workload", choices=("summarise", "continue"), default="summarise",
                   help="chat instruction around the text, or bare text to continue (default: summarise)")
    p.add_argument("--gamma", type=int, default=6)
    p.add_argument("--sparsity", type=float, default=0.07)
    p.add_argument("--min-budget", type=int, default=256)
    p.add_argument("--methods", nargs="+", default=[m for m in METHODS if m != "vanilla"],
                   help="speculative policies to run (default: all)")
    p.add_argument("--kv-head-methods", nargs="*", default=["specextend", "vegas", "vegas-all"],
                   help="policies also run with one selected set per KV head (default: the "
                        "verification-guided ones)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def build_prompt(tokenizer, text_ids: list[int], workload: str) -> list[int]:
    """Token ids of the prompt: exactly `text_ids` in the middle, chat template around it. The
    template is rendered once with a marker in place of the text and each side tokenized alone, so
    the text keeps its exact token count."""
    if workload == "continue" or not tokenizer.chat_template:
        return list(text_ids)
    marker = "\x00TEXT\x00"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": f"{INSTRUCTION}\n\n{marker}"}])
    before, after = rendered.split(marker)
    return tokenizer.encode(before) + list(text_ids) + tokenizer.encode(after)


def runs(args) -> list[tuple[str, str]]:
    out = [(m, "layer") for m in args.methods]
    out += [(m, "kv-head") for m in args.methods if m in args.kv_head_methods]
    return out


def summarise_run(res, timing, vanilla_ids: list[int] | None) -> dict:
    """Acceptance, recall, budget and timings of one finished request."""
    its = res.iterations
    recalls = [it["recall"] for it in its if it.get("recall")]
    per_layer = [sum(col) / len(col) for col in zip(*recalls)] if recalls else None
    sel = [it["selection"] for it in its if it.get("selection")]
    spec_its = [it for it in its if it["drafts"]]
    mean = lambda key: sum(it[key] for it in spec_its) / len(spec_its) if spec_its else None  # noqa: E731
    return dict(
        mean_acceptance_length=res.mean_acceptance_length, per_position_acceptance=res.per_position_acceptance,
        recall_per_layer=per_layer, mean_recall=sum(per_layer) / len(per_layer) if per_layer else None,
        min_layer_recall=min(per_layer) if per_layer else None,
        iterations=res.num_iterations, speculative_iterations=res.spec_iterations,
        budget=sel[0]["budget"] if sel else None, budget_last=sel[-1]["budget"] if sel else None,
        prefix_at_first_selection=sel[0]["base"] if sel else None,
        kept_fraction=sel[0]["budget"] / sel[0]["base"] if sel and sel[0]["base"] else None,
        prompt_tokens=res.prompt_tokens, generated_tokens=res.generated_tokens,
        tokens_per_s=timing.tokens_per_s, decode_s=timing.decode_s,
        draft_ms_per_iteration=mean("draft_ms"), verify_ms_per_iteration=mean("verify_ms"),
        select_ms_per_iteration=mean("select_ms"),
        matches_vanilla=None if vanilla_ids is None else res.token_ids == vanilla_ids,
        first_mismatch=first_mismatch(res.token_ids, vanilla_ids))


def first_mismatch(ids: list[int], reference: list[int] | None) -> int | None:
    """Index of the first token that differs from `reference` (None when they are equal)."""
    if reference is None or ids == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), min(len(ids), len(reference)))


def run(args, argv: list[str]) -> str:
    from ..engine import Engine
    from ..options import EngineOptions
    from ..sampling import SamplingParams
    from ..spec import SpecParams

    todo = runs(args)
    for m, g in todo:  # validate every policy before the model loads
        SpecParams(method=m, granularity=g, gamma=args.gamma, sparsity=args.sparsity, min_budget=args.min_budget)
    engine = Engine(args.model, args.device, args.dtype, SpecParams(method="vanilla"),
                    EngineOptions(trace=True, max_prefill_tokens=4096, max_num_seqs=1,
                                  attention=args.attention, cuda_graphs="off" if args.eager else "auto",
                                  deterministic=args.deterministic))
    prompt = build_prompt(engine.tokenizer, texts.long_text(args.text_tokens, engine.tokenizer), args.workload)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.gen_tokens)
    dtype = str(engine.dtype).replace("torch.", "")

    bar = common.progress_bar(1 + len(todo), "acceptance")
    bar.set_postfix_str("vanilla")
    van = common.timed_generate(engine, [prompt], sampling, SpecParams(method="vanilla"))
    vanilla = van.results[0]
    bar.update(1)
    records = [dict(method="vanilla", granularity=None, dtype=dtype, prompt_tokens=vanilla.prompt_tokens,
                    generated_tokens=vanilla.generated_tokens, iterations=vanilla.num_iterations,
                    tokens_per_s=van.tokens_per_s, decode_s=van.decode_s, mean_acceptance_length=None,
                    matches_vanilla=True)]
    for method, gran in todo:
        bar.set_postfix_str(f"{method} {gran}")
        spec = SpecParams(method=method, granularity=gran, gamma=args.gamma, sparsity=args.sparsity,
                          min_budget=args.min_budget, record_recall=True)
        t = common.timed_generate(engine, [prompt], sampling, spec)
        rec = dict(method=method, granularity=gran, dtype=dtype, gamma=args.gamma, sparsity=args.sparsity,
                   min_budget=args.min_budget)
        rec.update(summarise_run(t.results[0], t, vanilla.token_ids))
        records.append(rec)
        bar.update(1)
    bar.close()

    path = common.write_results(
        "acceptance", args.out, engine.device, argv, records, model=engine.source,
        model_name=engine.config.name, mode=engine.mode,
        workload=dict(kind=args.workload, text=texts.corpus_info(), text_tokens=args.text_tokens,
                      instruction=INSTRUCTION if args.workload == "summarise" else None,
                      prompt_tokens=len(prompt), gen_tokens=args.gen_tokens,
                      sampling="greedy (temperature 0), stops at EOS or gen_tokens",
                      output_preview=vanilla.text[:400],
                      notes="recall = covered fraction of the full-attention mass of each draft query, "
                            "mean over query heads, averaged over draft steps per layer; tokens_per_s "
                            "includes the full attention that recall costs (reference attention)"))
    columns = ["method", "gran.", "mean acc. len", "per-position acceptance", "mean recall", "min layer recall",
               "budget", "iters", "tokens", "tok/s", "= vanilla"]
    rows = []
    for r in records:
        ppa = r.get("per_position_acceptance")
        rows.append([r["method"], r["granularity"] or "-", r["mean_acceptance_length"],
                     " ".join(f"{a:.2f}" for a in ppa) if ppa else "-", r.get("mean_recall"),
                     r.get("min_layer_recall"), r.get("budget"), r["iterations"], r["generated_tokens"],
                     r["tokens_per_s"], r["matches_vanilla"]])
    common.print_table(f"acceptance: {common.device_description(engine.device)}, {dtype}, gamma {args.gamma}, "
                       f"sparsity {args.sparsity}, min_budget {args.min_budget}, prompt {len(prompt)} tokens "
                       f"({args.workload})", columns, rows)
    print(f"wrote {path}")
    return path
