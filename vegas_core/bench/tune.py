"""`python -m vegas_core.bench tune`: the paper's three-step tuning (§3.4) of (gamma, sparsity) for
every speculative method, so that `e2e` runs each method, baselines included, at its own best.

Per method, on the e2e workload (`--workload`, greedy):
1. sweep the sparsity with a large gamma (`--large-gamma`) and take the smallest sparsity whose
   accepted drafts per iteration reach `--plateau` (95 %) of the best seen: where acceptance stops
   growing;
2. at that sparsity, sweep gamma and keep the fastest (decode tokens/s); on the Triton path the grid
   also takes the largest gamma of each verification tile size inside its range (`tile_gammas`:
   SmolLM2's GQA 3 fits 10 rows in a 32-row tile, so gamma 9, where 10 pays a 64-row tile);
3. at that gamma, try the sparsity around the plateau point (x0.5, x0.75, x1.5, x2) and keep the
   fastest.
Writes `bench/results/tune-<date>-<device>.json`: every trial, and `tuned` = {"method/granularity":
{"gamma", "sparsity"}}, which `e2e` reads for the same model and device.
"""
from __future__ import annotations

import argparse

from . import common, e2e


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    e2e.add_workload_arguments(p)
    p.add_argument("--methods", nargs="+", default=None,
                   help="method[/granularity] list (default: every speculative method of e2e)")
    p.add_argument("--sparsities", type=float, nargs="+", default=[0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2])
    p.add_argument("--gammas", type=int, nargs="+", default=[2, 3, 4, 6, 8, 10, 12])
    p.add_argument("--large-gamma", type=int, default=12, help="gamma of step 1 (default: 12)")
    p.add_argument("--tile-gammas", action=argparse.BooleanOptionalAction, default=True,
                   help="on the Triton path, add to --gammas the largest gamma of each verification "
                        "tile size within their range (default: on)")
    p.add_argument("--plateau", type=float, default=0.95,
                   help="step 1 stops at this fraction of the best acceptance (default: 0.95)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def plateau_sparsity(trials: list[dict], fraction: float) -> float:
    """The smallest sparsity whose accepted drafts per iteration reach `fraction` of the best."""
    best = max(t["accepted_per_iteration"] for t in trials)
    ok = [t["sparsity"] for t in trials if t["accepted_per_iteration"] >= fraction * best]
    return min(ok)


def tile_gammas(group: int, lo: int, hi: int) -> list[int]:
    """Gammas in [lo, hi] whose verification (gamma + 1 rows) is the last to fit its score tile at
    GQA `group` (`kernels.verify_attention.tile_rows`): one more draft costs a tile twice as tall."""
    from vegas_core.kernels.verify_attention import tile_rows
    return [g for g in range(max(1, lo), hi + 1) if tile_rows(g + 1, group) < tile_rows(g + 2, group)]


def refine_candidates(sparsity: float) -> list[float]:
    return sorted({round(min(1.0, sparsity * f), 4) for f in (0.5, 0.75, 1.0, 1.5, 2.0)})


def run(args, argv: list[str]) -> str:
    from ..engine import resolve_device
    from ..loader import load_model
    from ..sampling import SamplingParams
    from ..spec import SpecParams

    methods = [m for m in e2e.parse_methods(args.methods) if m[0] != "vanilla"]
    for m, g in methods:
        SpecParams(method=m, granularity=g)
    for s in args.sparsities:
        SpecParams(sparsity=s)
    loaded = load_model(args.model)
    workload = e2e.build_workload(args, loaded.tokenizer, loaded.config, resolve_device(args.device).type == "cuda")
    engine = e2e.engine_for(args, workload, loaded)
    parents = e2e.prefill_parents(engine, workload)     # every trial forks from the same cache
    sampling = SamplingParams(max_tokens=workload.gen_tokens, ignore_eos=True)
    gammas = sorted(set(args.gammas))
    added = []
    if args.tile_gammas and engine.core.runner.attention == "triton":
        group = engine.config.num_heads // engine.config.num_kv_heads
        added = [g for g in tile_gammas(group, gammas[0], gammas[-1]) if g not in gammas]
        gammas = sorted(gammas + added)
    trials_per_method = len(args.sparsities) + len(gammas) + 4
    bar = common.progress_bar(len(methods) * trials_per_method, f"tune {workload.name}")
    records, tuned = [], {}
    compiles = common.TritonCompiles().install()     # compiling steps are not the rate (e2e's rule)

    def trial(method, gran, step, gamma, sparsity):
        spec = SpecParams(method=method, granularity=gran, gamma=gamma, sparsity=sparsity,
                          min_budget=args.min_budget)
        bar.set_postfix_str(f"{method}/{gran} step {step}: gamma {gamma}, sparsity {sparsity}")
        st = e2e.run_workload(engine, workload, sampling, spec, parents=parents,
                              compiles=lambda: compiles.count)
        bar.update(1)
        mal = st.mean_acceptance_length or 1.0
        rec = dict(method=method, granularity=gran, step=step, gamma=gamma, sparsity=sparsity,
                   tokens_per_s=st.tokens_per_s, mean_acceptance_length=mal, accepted_per_iteration=mal - 1,
                   iteration_ms=st.iteration_ms)
        records.append(rec)
        return rec

    for method, gran in methods:
        step1 = [trial(method, gran, 1, args.large_gamma, s) for s in args.sparsities]
        sparsity = plateau_sparsity(step1, args.plateau)
        step2 = [trial(method, gran, 2, g, sparsity) for g in gammas]
        gamma = max(step2, key=lambda r: r["tokens_per_s"])["gamma"]
        step3 = [r for r in step2 if r["gamma"] == gamma]            # the x1.0 point is measured
        step3 += [trial(method, gran, 3, gamma, s) for s in refine_candidates(sparsity) if s != sparsity]
        best = max(step3, key=lambda r: r["tokens_per_s"])
        tuned[f"{method}/{gran}"] = dict(gamma=best["gamma"], sparsity=best["sparsity"],
                                         plateau_sparsity=sparsity, tokens_per_s=best["tokens_per_s"])
        path = common.write_results(
            "tune", args.out, engine.device, argv, records, model=engine.source, model_name=engine.config.name,
            dtype=str(engine.dtype).replace("torch.", ""), workload=dict(
                name=workload.name, batch=workload.batch, gen_tokens=workload.gen_tokens,
                prompt_tokens=list(workload.prompt_range), requests=len(workload.prompts), sampling="greedy"),
            gammas=gammas, tile_gammas_added=added, tuned=tuned, complete=len(tuned) == len(methods))
    compiles.uninstall()
    bar.close()
    common.print_table(f"tune: {common.device_description(engine.device)}, {workload.name} workload",
                       ["method", "gran.", "gamma", "sparsity", "plateau sparsity", "tok/s"],
                       [[k.split("/")[0], k.split("/")[1], v["gamma"], v["sparsity"], v["plateau_sparsity"],
                         v["tokens_per_s"]] for k, v in tuned.items()])
    print(f"wrote {path}")
    return path
