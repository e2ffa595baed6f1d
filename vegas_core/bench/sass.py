"""`python -m vegas_core.bench sass`: verify_attention's launches compiled for the H200 (sm_90) on
this machine, no GPU needed (`kernels.offline`), and what the compiler made of each: registers,
local memory (spills), shared memory, the MMA layout, how many programs an SM can hold, and per
key tile of the main loop the barriers, shared-memory and tensor-core instructions.

It answers what the compiler decides, not how fast a launch runs: a kernel change can be checked
for spills, occupancy and per-tile synchronisation before device time is spent on it (the
timings come from `bench kernels` and the probes under `scripts/device/` on the GPU).

Launches: the engine's own (`launch_config`) for each collection path (none, C2Q's first/last
tile, the main-tile store of all rows) at SmolLM2's shape (9 / 3 heads, head dim 64) and the
8B-like one (32 / 8 / 128), for the given row counts, at batch 64 x 8K. Records: `kernel`,
`shape`, `q_rows`, `collect`, `variant`, `block_n`, `num_warps`, `max_registers`, `registers`, `stack`,
`shared`, `mma`, `programs_per_sm`, `tile_keys`, `loop_instructions` and the loop's opcode
counts (`loop_BAR`, `loop_STS`, ...), per key `warp_instructions_per_key` (all warps) and
`barriers_per_128_keys`, and `sass_sha256` (the instruction text: equal hashes are
the same kernel whatever the source lines).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

import torch

from . import common

SHAPES = {"smollm2": (9, 3, 64), "8b": (32, 8, 128)}   # query heads, KV heads, head dim
COLLECTS = ("none", "c2q", "all")
# An H200 SM: 64K 32-bit registers, 228 KB of shared memory (227 KB to one program), 64 warps.
SM_REGISTERS, SM_SHARED, SM_WARPS = 65536, 233472, 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernels", nargs="+", default=["verify", "sparse"], choices=["verify", "sparse"],
                   help="verify_attention's launches, and the draft's sparse_attention (packed where "
                        "the heads fit one program, and per KV head)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 10, 11],
                   help="query rows a request (default: 1 a plain decode step, 8, 10 vegas's tuned "
                        "gamma 9, 11 stream's gamma 10)")
    p.add_argument("--collects", nargs="+", default=list(COLLECTS), choices=list(COLLECTS))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def _stand_ins(shape: str, q_rows: int, batch: int, context: int, block: int = 16):
    """CPU tensors standing in for a launch's queries, a 4-page pool, block tables and contexts:
    only their dtypes, strides and alignment reach the compiler."""
    heads, kvh, dim = SHAPES[shape]
    q = torch.zeros(q_rows, heads, dim, dtype=torch.bfloat16)
    k = torch.zeros(4, block, kvh, dim, dtype=torch.bfloat16)
    tables = torch.zeros(batch, context // block, dtype=torch.int32)
    ctx = torch.full((batch,), context, dtype=torch.int32)
    return q, k, torch.zeros_like(k), tables, ctx


def engine_launch(shape: str, rows: int, collect: str, batch: int = 64, context: int = 8192,
                  **launch):
    """The compiled verify_attention kernel of the call the engine makes at this shape."""
    import kernels.verify_attention as va
    from kernels.offline import compile_launch, record
    heads, kvh, dim = SHAPES[shape]
    total = batch * rows
    q, k, v, tables, ctx = _stand_ins(shape, total, batch, context)
    loc = torch.arange(0, total + 1, rows, dtype=torch.int32)
    out, lse = torch.empty_like(q), torch.empty(total, heads)
    logits = slots = None
    if collect != "none":
        kept = va.collected_rows(loc, collect)
        logits = torch.empty(len(kept), heads, context, dtype=torch.bfloat16)
        slots = va.collected_row_slots(kept, total)
    splits = va.default_num_splits(batch, kvh, context, num_sms=132)
    # the split merge after it is recorded too (not launched: there is no driver)
    with record(va, "_verify_attention_kernel") as (kernel, launches), \
            record(va, "_merge_splits_kernel"):
        va.verify_attention_into(q, k, v, tables, ctx, loc, dim ** -0.5, out, lse, max_q=rows,
                                 num_splits=splits, logits=logits, row_slot=slots,
                                 c2q_tile=collect == "c2q", logits_len=context, **launch)
    return kernel, launches[0], compile_launch(kernel, launches[0])


def sparse_launch(shape: str, packed: bool, batch: int = 64, context: int = 8192):
    """The compiled sparse_attention kernel of a draft step as the engine's CUDA graphs launch
    it: index buffers as wide as the context (so the split count is the device rule's, 12 for a
    packed batch of 64 on 132 SMs), one selection shared by the KV heads when ``packed``."""
    import kernels.sparse_attention as sa
    from kernels.offline import compile_launch, record
    heads, kvh, dim = SHAPES[shape]
    q, k, v, tables, ctx = _stand_ins(shape, batch, batch, context)
    groups = 1 if packed else kvh
    idx = torch.zeros(batch, groups, context, dtype=torch.int32)
    counts = torch.zeros(batch, dtype=torch.int32)
    tail = torch.full((batch,), context, dtype=torch.int32)
    splits = sa.split_count(batch, 1 if packed else kvh, context, 32, dim, 132)
    with record(sa, "_sparse_attention_kernel") as (kernel, launches), \
            record(sa, "_merge_splits_kernel"):
        sa.sparse_attention(q, k, v, tables, ctx, idx, counts, tail, dim ** -0.5,
                            num_splits=splits, packed=packed)
    return kernel, launches[0], compile_launch(kernel, launches[0])


def _stats_record(launch, compiled, **fields) -> dict:
    from kernels.offline import sass_stats
    st = sass_stats(compiled)
    kw = launch.kwargs
    warps = kw["num_warps"]
    regs_per_program = st.registers * 32 * warps
    programs = min(SM_REGISTERS // regs_per_program, SM_SHARED // max(st.shared, 1), SM_WARPS // warps)
    rec = dict(**fields, block_n=kw["BLOCK_N"], block_m=kw["BLOCK_M"], num_warps=warps,
               num_stages=kw["num_stages"], max_registers=kw.get("maxnreg", 0),
               registers=st.registers, stack=st.stack, shared=st.shared, mma=st.mma,
               programs_per_sm=programs, tile_keys=kw["BLOCK_N"],
               sass_sha256=st.sass_sha256)
    loop = st.main_loop
    if loop is not None:
        rec["loop_instructions"] = loop.instructions
        rec.update({f"loop_{op}": n for op, n in loop.ops.items()})
        # per key, so tiles of different sizes compare: instructions all warps issue, barriers
        rec["warp_instructions_per_key"] = loop.instructions * warps / kw["BLOCK_N"]
        rec["barriers_per_128_keys"] = loop.ops["BAR"] * 128 / kw["BLOCK_N"]
    return rec


def record_for(shape, rows, collect, batch, context) -> dict:
    _, launch, compiled = engine_launch(shape, rows, collect, batch, context)
    return _stats_record(launch, compiled, kernel="verify_attention", shape=shape, q_rows=rows,
                         collect=collect, batch=batch, context=context, variant="engine")


def sparse_record_for(shape, packed, batch, context) -> dict:
    _, launch, compiled = sparse_launch(shape, packed, batch, context)
    return _stats_record(launch, compiled, kernel="sparse_attention", shape=shape, q_rows=1,
                         collect="none", batch=batch, context=context,
                         variant="packed" if packed else "per-kv-head",
                         num_splits=launch.grid[2])


def run(args, argv: list[str]) -> str:
    from tqdm import tqdm

    from ..errors import VegasError
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise VegasError("bench sass compiles the kernels: run it without TRITON_INTERPRET=1")
    try:
        import kernels.offline  # noqa: F401 - Triton with its ptxas
    except ImportError as e:
        raise VegasError(f"bench sass needs Triton (pip install triton==3.6.0): {e}") from e
    cases = [(s, r, c) for s in args.shapes for r in args.rows for c in args.collects
             if "verify" in args.kernels]
    from kernels.sparse_attention import packs_kv_heads
    sparse_cases = [(s, packed) for s in args.shapes for packed in (True, False)
                    if "sparse" in args.kernels
                    and (not packed or packs_kv_heads(SHAPES[s][0], SHAPES[s][1], 1))]
    bar = tqdm(total=len(cases) + len(sparse_cases), desc="compiling for sm_90", unit="launch")
    records = []
    for s, r, c in cases:
        records.append(record_for(s, r, c, args.batch, args.context))
        bar.update()
    for s, packed in sparse_cases:
        records.append(sparse_record_for(s, packed, args.batch, args.context))
        bar.update()
    bar.close()
    import triton
    date = datetime.date.today().isoformat()
    doc = dict(date=date, device=f"none: compiled offline for sm_90 (Triton {triton.__version__}'s "
                                 f"ptxas) on {common.device_description(torch.device('cpu'))}",
               command=common.command_line(argv), torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), records=records)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"sass-{date}-sm90.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    _print(records)
    print(f"wrote {path}")
    return path


def _print(records) -> None:
    cols = ("kernel", "shape", "q_rows", "collect", "variant", "block_n", "num_warps", "max_registers", "registers",
            "stack", "programs_per_sm", "loop_instructions", "warp_instructions_per_key",
            "barriers_per_128_keys", "loop_STS", "loop_LDS", "loop_LDSM", "loop_HMMA", "loop_LDL")
    print(" ".join(f"{c[:9]:>9}" for c in cols))
    for r in records:
        print(" ".join(f"{_cell(r.get(c, '-')):>9}" for c in cols))


def _cell(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)[:9]
