"""`vegas generate ...` (or `python -m vegas_core generate ...`): stream a generation to the terminal, or print one JSON object.

Every refused input ends with one line on stderr and exit status 2, never a traceback."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from .errors import TraceError, VegasError
from .sampling import SamplingParams
from .spec import GRANULARITIES, METHODS, SpecParams


MODES = {"deterministic": "batch-invariant kernels", "default": "Triton kernels",
         "reference": "PyTorch reference"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vegas", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("--prompt", required=True, help="the prompt text")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--model", default=None, help="GGUF file, Hugging Face directory or packaged model name "
                   "(qwen2.5-coder-0.5b, gemma-3-270m; default: embedded SmolLM2)")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1, help="-1 = off")
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    g.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on CPU, bfloat16 on GPU)")
    g.add_argument("--attention", default="auto", choices=["auto", "reference", "triton"],
                   help="auto: Triton kernels on a GPU, PyTorch reference on a CPU; reference: force the reference (debugging)")
    g.add_argument("--eager", action="store_true", help="no CUDA graphs: every GPU forward runs eagerly (debugging)")
    g.add_argument("--deterministic", action="store_true",
                   help="batch-invariant kernels: the same bits whatever the batch, so every method's greedy "
                        "output equals vanilla's and a seed gives the same text alone or batched (slower; "
                        "the CPU reference path has no such mode)")
    g.add_argument("--method", default="vanilla", help=f"one of {', '.join(METHODS)}")
    g.add_argument("--granularity", default="layer", help=f"one of {', '.join(GRANULARITIES)}")
    g.add_argument("--gamma", type=int, default=6, help="draft tokens per iteration (1..16)")
    g.add_argument("--sparsity", type=float, default=0.07, help="fraction of the prefix kept for drafting")
    g.add_argument("--min-budget", type=int, default=256, help="floor on the kept entries")
    g.add_argument("--recall", action="store_true", help="record attention recall in the trace (slow)")
    g.add_argument("--trace", default=None, metavar="FILE", help="write the run's trace (JSON) here")
    g.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    return parser


def _params(args) -> tuple[SamplingParams, SpecParams]:
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              min_p=args.min_p, seed=args.seed, max_tokens=args.max_tokens,
                              stop=tuple(args.stop), ignore_eos=args.ignore_eos)
    spec = SpecParams(method=args.method, gamma=args.gamma, sparsity=args.sparsity, min_budget=args.min_budget,
                      granularity=args.granularity, record_recall=args.recall)
    return sampling, spec


def generate(args) -> int:
    from .engine import Engine, check_unicode
    from .options import EngineOptions
    from .trace import save_trace
    from .trace_builder import build_trace

    # Validate before the model loads: bad input fails fast, not after a whole generation.
    sampling, spec = _params(args)
    check_unicode(args.prompt, "the prompt")
    if args.trace:
        _check_trace_path(args.trace)
    engine = Engine(args.model, args.device, args.dtype, spec,
                    EngineOptions(trace=bool(args.trace), attention=args.attention,
                                  cuda_graphs="off" if args.eager else "auto",
                                  deterministic=args.deterministic))
    if args.deterministic and engine.mode == "reference":
        print("note: --deterministic applies to the Triton kernel path; the PyTorch reference path "
              "runs as it is", file=sys.stderr)
    elif args.deterministic and engine.mode != "deterministic":
        print("note: --deterministic: this model's layers run PyTorch's ops, which are not "
              "batch-invariant (its attention is)", file=sys.stderr)
    if not args.json:
        print(f"[{engine.source} on {engine.device}, {engine.dtype}, {MODES[engine.mode]}; "
              f"loaded in {engine.load_time_s:.1f} s]", file=sys.stderr)
    ids = engine.encode_prompt(args.prompt, chat=args.chat)
    warmup_s = engine.warm_up(ids, sampling, spec)
    if warmup_s is not None and not args.json:
        print(f"[warm-up (CUDA graph capture, kernel compilation): {warmup_s:.1f} s]", file=sys.stderr)
    for ev in engine.stream(ids, sampling, spec):
        if not args.json:
            print(ev.text_delta, end="", flush=True)
    res = engine.last_result
    if args.json:
        out = dict(text=res.text, token_ids=res.token_ids, prompt_tokens=res.prompt_tokens,
                   generated_tokens=res.generated_tokens, finish_reason=res.finish_reason,
                   decode_tokens_per_s=res.decode_tokens_per_s, method=spec.method,
                   mean_acceptance_length=res.mean_acceptance_length,
                   per_position_acceptance=res.per_position_acceptance, iterations=res.num_iterations,
                   device=str(engine.device), mode=engine.mode, warmup_s=warmup_s)
        print(json.dumps(out, allow_nan=False, default=_finite))
    else:
        print(file=sys.stdout)
        mal = res.mean_acceptance_length
        print(f"[{res.generated_tokens} tokens, {res.decode_tokens_per_s:.1f} tokens/s"
              + (f", mean acceptance length {mal:.2f}" if mal else "") + f", {res.finish_reason}]", file=sys.stderr)
    if args.trace:   # after the result is out: a failed write does not lose the generation
        save_trace(build_trace(engine, [res], spec, sampling, prompt_texts=[args.prompt]), args.trace)
    return 0


def _check_trace_path(path: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise TraceError(f"--trace {path!r} is a directory; give a file name")
    folder = target.parent
    if not folder.is_dir():
        raise TraceError(f"--trace {path!r}: the directory {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise TraceError(f"--trace {path!r}: the directory {str(folder)!r} is not writable")


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return generate(args)
    except VegasError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other tools do; stdout goes to
        # /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 1
