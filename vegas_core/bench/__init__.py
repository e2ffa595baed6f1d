"""Benchmarks: `python -m vegas_core.bench {decode,acceptance,kernels,collect,agreement,e2e,sweep,tune,profile,linear,sampling,app,burst,invariant} [options]`.

Each writes one JSON result file (`bench/results/<kind>-<date>-<device>.json` by default: the date,
the device in words, the exact command, the torch version and the records) and prints a table.
Timings are never asserted in tests; only the shape and plausibility of the records are.
"""
from __future__ import annotations

import argparse
import sys

from . import (acceptance, agreement, app, burst, collect, decode, e2e, invariant, kernels, linear, profile,
               sampling, sweep, tune)


# name -> (module with add_arguments / run / a docstring, one-line help)
BENCHMARKS = {
    "decode": (decode, "decode throughput (and the Hugging Face baseline)"),
    "acceptance": (acceptance, "acceptance length and recall of every policy"),
    "kernels": (kernels, "Triton kernels: time, bandwidth, SDPA, collection cost"),
    "collect": (collect, "Collect-2-Query's cost per verification, iteration and layer, against all rows"),
    "agreement": (agreement, "kernel path vs reference path, same answers?"),
    "e2e": (e2e, "every method on one workload, side by side"),
    "sweep": (sweep, "vanilla, stream and vegas over batch x context, against the bandwidth bound"),
    "app": (app, "the app streaming through its API against the engine alone, 1 and N clients"),
    "burst": (burst, "a burst of requests: first token and tokens/s per prefill budget and arrival spacing"),
    "tune": (tune, "three-step (gamma, sparsity) tuning per method"),
    "linear": (linear, "the fused projections' launch configurations at a model's shapes, against cuBLAS"),
    "sampling": (sampling, "the batched sampler: PyTorch against the Triton kernel, top-k before/after"),
    "profile": (profile, "where a decode iteration's time goes, kernel by kernel, per method"),
    "invariant": (invariant, "the batch-invariant mode's launches: timed beside the default's, bits checked"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vegas_core.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=help_text, description=module.__doc__.splitlines()[0]))
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import VegasError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        BENCHMARKS[args.bench][0].run(args, argv)
    except VegasError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
