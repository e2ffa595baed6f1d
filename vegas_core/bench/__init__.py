"""Benchmarks: `python -m vegas_core.bench {decode,acceptance,kernels,agreement,e2e,tune} [options]`.

Each writes one JSON result file (`bench/results/<kind>-<date>-<device>.json` by default: the date,
the device in words, the exact command, the torch version and the records) and prints a table.
Timings are never asserted in tests; only the shape and plausibility of the records are.
"""
from __future__ import annotations

import argparse
import sys

from . import acceptance, agreement, decode, e2e, kernels, tune


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vegas_core.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    decode.add_arguments(sub.add_parser("decode", help="decode throughput (and the Hugging Face baseline)",
                                        description=decode.__doc__.splitlines()[0]))
    acceptance.add_arguments(sub.add_parser("acceptance", help="acceptance length and recall of every policy",
                                            description=acceptance.__doc__.splitlines()[0]))
    kernels.add_arguments(sub.add_parser("kernels", help="Triton kernels: time, bandwidth, SDPA, collection cost",
                                         description=kernels.__doc__.splitlines()[0]))
    agreement.add_arguments(sub.add_parser("agreement", help="kernel path vs reference path, same answers?",
                                           description=agreement.__doc__.splitlines()[0]))
    e2e.add_arguments(sub.add_parser("e2e", help="every method on one workload, side by side",
                                     description=e2e.__doc__.splitlines()[0]))
    tune.add_arguments(sub.add_parser("tune", help="three-step (gamma, sparsity) tuning per method",
                                      description=tune.__doc__.splitlines()[0]))
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import VegasError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        {"decode": decode.run, "acceptance": acceptance.run, "kernels": kernels.run,
         "agreement": agreement.run, "e2e": e2e.run, "tune": tune.run}[args.bench](args, argv)
    except VegasError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
