"""A burst of requests on the engine alone: when the first token comes out, and the burst's tokens/s,
for each prefill budget (`EngineOptions.max_prefill_tokens`) and spacing of the arrivals.

    python -m vegas_core.bench burst --device cuda --budgets 1024 4096 16384 --gaps-ms 0 2 5

Requests are added between engine steps as they come due (gap 0: all at once, as `generate` adds
them; a gap of a few ms: as the app's accepts arrive), greedy vanilla, warmed up. Each record keeps
the engine's steps, so a slow start shows where it went: how many prefill steps, and what each cost.
"""
from __future__ import annotations

import argparse
import statistics
import time

from . import common
from .app import chat_prompts, step_timeline


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--requests", type=int, default=8, help="requests in a burst (default: 8)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="tokens of text per prompt (default: 512)")
    p.add_argument("--max-tokens", type=int, default=256, help="generated tokens per request (default: 256)")
    p.add_argument("--budgets", type=int, nargs="+", default=[1024, 4096, 16384],
                   help="prefill budgets, tokens a prefill step takes (default: 1024 4096 16384)")
    p.add_argument("--gaps-ms", type=float, nargs="+", default=[0.0, 2.0, 5.0],
                   help="ms between arrivals (default: 0 2 5)")
    p.add_argument("--repeats", type=int, default=2, help="bursts per (budget, gap); the median is kept (default: 2)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def burst(engine, prompts: list[str], sampling, spec, gap_ms: float) -> dict:
    """One burst: prompts[i] added `i * gap_ms` after the first, between steps. Its tokens/s over
    the wall time, ms to the first token out, its prefill steps and their median ms, and the steps
    ([start ms, end ms, kind, rows, tokens], `app.step_timeline`)."""
    pending, reqs, first = list(prompts), [], None
    t0, t_wall = time.perf_counter(), time.time()
    due = t0
    try:
        while pending or any(not r.finished for r in reqs):
            now = time.perf_counter()
            while pending and now >= due:
                reqs.append(engine.add(pending.pop(0), sampling, spec, chat=True))
                due += gap_ms / 1e3
            if not engine.core.has_work:
                time.sleep(max(0.0, due - now))
                continue
            events = engine.step()
            if first is None and any(ev.new_token_ids for ev in events):
                first = time.perf_counter() - t0
    finally:
        for r in reqs:       # a finished request has given its pages back; one left early gives them now
            if not r.finished:
                engine.abort(r.request_id)
    wall = time.perf_counter() - t0
    tokens = sum(r.num_generated for r in reqs)
    # None where the engine's step log (its last STEP_LOG_STEPS) no longer reaches the burst's start
    steps = step_timeline(engine.core.recent_steps(), t_wall, t_wall + wall)
    prefills = None if steps is None else [s[1] - s[0] for s in steps if s[2] == "prefill"]
    return dict(tokens=tokens, tokens_per_s=tokens / wall, wall_ms=1e3 * wall, first_token_ms=1e3 * first,
                prefill_steps=None if prefills is None else len(prefills),
                prefill_step_ms=statistics.median(prefills) if prefills else None, steps=steps)


def run(args, argv: list[str]) -> str:
    from ..engine import Engine, resolve_device
    from ..loader import load_model
    from ..options import EngineOptions
    from ..sampling import SamplingParams
    from ..spec import SpecParams
    from ..errors import InvalidRequestError
    if args.requests < 1 or args.max_tokens < 1 or args.prompt_tokens < 1 or min(args.gaps_ms) < 0:
        raise InvalidRequestError("--requests, --max-tokens and --prompt-tokens must be >= 1 and --gaps-ms >= 0")
    device = resolve_device(args.device)
    loaded = load_model(args.model)
    prompts = chat_prompts(loaded.tokenizer, args.requests, args.prompt_tokens)
    sampling, spec = SamplingParams(max_tokens=args.max_tokens), SpecParams(method="vanilla")
    records = []
    for budget in args.budgets:
        opts = EngineOptions(max_num_seqs=max(16, args.requests), kv_cache_bytes=4 << 30, max_prefill_tokens=budget,
                             attention=args.attention, cuda_graphs="off" if args.eager else "auto",
                             deterministic=args.deterministic)
        engine = Engine(args.model, args.device, args.dtype, options=opts, loaded=loaded)
        with common.frozen_heap():
            for gap in args.gaps_ms:            # warm-up: graphs at every batch size a burst makes
                burst(engine, prompts, sampling, spec, gap)
            for gap in args.gaps_ms:
                runs = sorted((burst(engine, prompts, sampling, spec, gap) for _ in range(max(1, args.repeats))),
                              key=lambda r: r["first_token_ms"])
                records.append(dict(budget=budget, gap_ms=gap, **runs[len(runs) // 2],
                                    runs_first_token_ms=[r["first_token_ms"] for r in runs],
                                    runs_tokens_per_s=[r["tokens_per_s"] for r in runs]))
        del engine                              # its KV pool goes before the next budget's
        common.free_device_memory()
    path = common.write_results("burst", args.out, device, argv, records, model=loaded.source,
                                requests=args.requests, prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens)
    common.print_table(f"a burst of {args.requests} requests: {common.device_description(device)}, "
                       f"{args.prompt_tokens}-token prompts, {args.max_tokens} tokens, greedy vanilla",
                       ["prefill budget", "gap ms", "prefill steps", "first token ms", "wall ms", "tokens/s",
                        "median prefill step ms"],
                       [[r["budget"], r["gap_ms"], r["prefill_steps"], r["first_token_ms"], r["wall_ms"],
                         r["tokens_per_s"], r["prefill_step_ms"]]
                        for r in records])
    print(f"wrote {path}")
    return path
