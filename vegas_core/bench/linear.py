"""`python -m vegas_core.bench linear`: a decoder layer's projections with their neighbours fused in
(`kernels/fused_linear.py`) against the path they replace (cuBLAS products beside the fused norm
and SiLU * up kernels of `kernels/fused.py`), at a model's widths and the row counts the engine
runs: a 64-request decode or draft step, and its verification at gamma 8 (576 rows).

Per projection (qkv, o_proj, gate_up, down_proj, lm_head) and row count: `cublas_us` (the old
path's launches for that projection: the norm kernel before it, the product, SiLU * up after the
gate/up product) and `fused_us` (one launch), with the launch configuration the engine uses;
`--sweep` also times a grid of configurations and reports the best per projection, scored as the
64-row time plus an eighth of the 576-row one (a Vegas iteration runs 8 draft steps per
verification), and the table to paste into `kernels.fused_linear.CONFIGS`. A `layer` record
times the whole non-attention part of a layer both ways, and `layer-pdl` the same with
programmatic dependent launch (`kernels/pdl.py`: the Triton kernels of either path). Each fused output is checked against
the old path's first (`max_abs_diff`, bf16). `qkv_rotary` records time the qkv product and the
rotary + pool-write kernel against the rotary as the product's epilogue (`kernels/qkv_rotary.py`).
Times are medians of CUDA-graph replays.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from . import common

# name: (hidden, q heads, kv heads, head dim, intermediate, vocabulary)
SHAPES = {"smollm2": (576, 9, 3, 64, 1536, 49152), "8b-like": (4096, 32, 8, 128, 14336, 128256)}
GRID = dict(block_m=(16, 64), block_n=(16, 32, 64, 128), block_k=(64, 128),
            warps_stages=((4, 3), (2, 4)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=list(SHAPES), default="smollm2",
                   help="the model's widths (default: SmolLM2-135M's)")
    p.add_argument("--rows", type=int, nargs="+", default=[64, 576],
                   help="rows per call (default: a 64-request step and its gamma-8 verification)")
    p.add_argument("--sweep", action="store_true",
                   help="also time a grid of launch configurations and report the best")
    p.add_argument("--ops", nargs="+", default=None, help="only these projections (default: all)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def _projections(shape, device):
    """name -> (weight [N, K], norm weight or None, silu_mul, residual add)."""
    hidden, hq, hkv, d, inter, vocab = SHAPES[shape]
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(n, k):
        return (torch.randn(n, k, generator=g) * k ** -0.5).to(device, torch.bfloat16)

    norm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, torch.bfloat16)
    return {"qkv": (w((hq + 2 * hkv) * d, hidden), norm, False, False),
            "o_proj": (w(hidden, hq * d), None, False, True),
            "gate_up": (w(2 * inter, hidden), norm, True, False),
            "down_proj": (w(hidden, inter), None, False, True),
            "lm_head": (w(vocab, hidden), norm, False, False)}


def _old(x, weight, norm, silu, add, residual, norm_add=True):
    """The path fused_linear replaced, for one projection: add_rms_norm (whose residual add, into
    x here, is the previous projection's), cuBLAS, SiLU * up."""
    from kernels.fused import add_rms_norm, silu_mul
    if norm is not None:
        x = add_rms_norm(x, norm, 1e-5, x if norm_add else None)[0]
    out = torch.nn.functional.linear(x, weight)
    return silu_mul(out) if silu else out


def _new(x, weight, norm, silu, add, residual, config=None):
    from kernels.fused_linear import linear_add, norm_linear
    if add:
        return linear_add(x, weight, residual, config=config)
    return norm_linear(x, norm, 1e-5, weight, silu_mul=silu, config=config)


def _inputs(rows, weight, silu, add, device):
    g = torch.Generator(device="cpu").manual_seed(rows)
    x = torch.randn(rows, weight.shape[1], generator=g).to(device, torch.bfloat16)
    residual = torch.randn(rows, weight.shape[0] // (2 if silu else 1),
                           generator=g).to(device, torch.bfloat16)
    return x, residual


def _check(x, weight, norm, silu, add, residual) -> float:
    """Largest |fused - old| of one call (bf16 products: another reduction order)."""
    if add:
        old = residual + torch.nn.functional.linear(x, weight)
        new = _new(x, weight, norm, silu, add, residual.clone())
    else:
        old = _old(x, weight, norm, silu, add, None, norm_add=False)
        new = _new(x, weight, norm, silu, add, None)
    return float((old.float() - new.float()).abs().max())


def _qkv_rotary_records(shape: str, row_counts, weight, norm, device) -> list[dict]:
    """The qkv product then the rotary + pool-write kernel (two launches, `kernels.fused`)
    against the rotary as the product's epilogue (`kernels/qkv_rotary.py`), without and with
    programmatic dependent launch; `same_bits`: q and the pool equal between the two."""
    import kernels.pdl
    from kernels.fused import rotary_qkv
    from kernels.fused_linear import norm_linear
    from kernels.qkv_rotary import norm_linear_rotary

    from .kernels import _bench
    _, heads, kv_heads, d, _, _ = SHAPES[shape]
    records = []
    for rows in row_counts:
        g = torch.Generator(device="cpu").manual_seed(rows)
        x = torch.randn(rows, weight.shape[1], generator=g).to(device, torch.bfloat16)
        angle = torch.randint(0, 8192, (rows, 1), generator=g) * torch.rand(1, d, generator=g)
        cos, sin = angle.cos().to(device, torch.bfloat16), angle.sin().to(device, torch.bfloat16)
        blocks = rows // 16 + 2
        slots = torch.randperm(blocks * 16, generator=g)[:rows].to(device)
        pools = [[torch.zeros(blocks, 16, kv_heads, d, device=device, dtype=torch.bfloat16)
                  for _ in range(2)] for _ in range(2)]

        def two():
            return rotary_qkv(norm_linear(x, norm, 1e-5, weight), cos, sin, heads, kv_heads, d,
                              *pools[0], slots)

        def one():
            return norm_linear_rotary(x, norm, 1e-5, weight, None, cos, sin, heads, kv_heads, d,
                                      *pools[1], slots)

        same = (torch.equal(two(), one()) and torch.equal(pools[0][0], pools[1][0])
                and torch.equal(pools[0][1], pools[1][1]))
        for pdl in (False, True):
            kernels.pdl.ENABLED = pdl
            rec = {"op": "qkv_rotary-pdl" if pdl else "qkv_rotary", "rows": rows,
                   "pdl": kernels.pdl.active(device), "two_launches_us": _bench(two),
                   "epilogue_us": _bench(one), "same_bits": same}
            rec["speedup"] = rec["two_launches_us"] / rec["epilogue_us"]
            records.append(rec)
        kernels.pdl.ENABLED = False
    return records


def _configs(n: int):
    for bm, bn, bk, (warps, stages) in itertools.product(*GRID.values()):
        if bn == 128 and n < 4096:
            continue
        yield (bm, bn, bk, warps, stages)


def run(args, argv: list[str]) -> str:
    import kernels.pdl
    from kernels.fused_linear import config_for

    from .kernels import _bench
    device = torch.device(args.device)
    common.require_cuda(device, "linear", "the kernels' CPU check is the test suite, under "
                                          "TRITON_INTERPRET=1")
    projections = _projections(args.shape, device)
    records, best = [], {}
    for name, (weight, norm, silu, add) in projections.items():
        if args.ops and name not in args.ops:
            continue
        n_out, k = weight.shape[0] // (2 if silu else 1), weight.shape[1]
        engine_config = config_for(n_out, k, silu)
        for rows in args.rows:
            x, residual = _inputs(rows, weight, silu, add, device)
            rec = {"op": name, "rows": rows, "n": n_out, "k": k, "silu_mul": silu, "residual_add": add,
                   "config": list(engine_config),
                   "cublas_us": _bench(lambda: _old(x, weight, norm, silu, add, residual)),
                   "fused_us": _bench(lambda: _new(x, weight, norm, silu, add, residual)),
                   "max_abs_diff": _check(x, weight, norm, silu, add, residual),
                   "weight_MB": weight.numel() * 2 / 1e6}
            rec["speedup"] = rec["cublas_us"] / rec["fused_us"]
            records.append(rec)
        if args.sweep:
            configs = list(_configs(n_out))
            bar = common.progress_bar(len(configs), f"sweep {name}")
            scored = []
            for config in configs:
                times = {}
                for rows in args.rows:
                    x, residual = _inputs(rows, weight, silu, add, device)
                    try:
                        times[rows] = _bench(lambda: _new(x, weight, norm, silu, add, residual, config))
                    except Exception as e:   # noqa: BLE001 - out of shared memory: not a candidate
                        times[rows] = None
                        print(f"{name} {config}: {type(e).__name__}")
                    records.append({"op": name, "rows": rows, "n": n_out, "k": k, "sweep": True,
                                    "config": list(config), "fused_us": times[rows]})
                bar.update(1)
                if all(t is not None for t in times.values()):
                    score = sum(t if r <= 64 else t / 8 for r, t in times.items())
                    scored.append((score, config, times))
            bar.close()
            score, config, times = min(scored)
            best[name] = {"n": n_out, "k": k, "silu_mul": silu, "config": list(config),
                          "us": times, "score": score}
    if not args.ops or "qkv_rotary" in args.ops:
        records += _qkv_rotary_records(args.shape, args.rows, *projections["qkv"][:2], device)
    (wq, nq, _, _), (wo, _, _, _), (wg, ng, _, _), (wd, _, _, _) = (
        projections[n] for n in ("qkv", "o_proj", "gate_up", "down_proj"))
    for rows in args.rows:   # the non-attention part of a layer, old launches vs fused ones
        g = torch.Generator(device="cpu").manual_seed(rows)
        hidden, delta, o = (torch.randn(rows, w.shape[1], generator=g).to(device, torch.bfloat16)
                            for w in (wq, wq, wo))

        def old_layer():
            from kernels.fused import add_rms_norm, silu_mul
            linear = torch.nn.functional.linear
            h, r = add_rms_norm(delta, nq, 1e-5, hidden)
            linear(h, wq)
            h, r = add_rms_norm(linear(o, wo), ng, 1e-5, r)
            linear(silu_mul(linear(h, wg)), wd)

        def new_layer():
            from kernels.fused_linear import linear_add, norm_linear
            norm_linear(hidden, nq, 1e-5, wq)
            linear_add(o, wo, hidden)
            linear_add(norm_linear(hidden, ng, 1e-5, wg, silu_mul=True), wd, hidden)

        for pdl in (False, True):   # and both with programmatic dependent launch
            kernels.pdl.ENABLED = pdl
            rec = {"op": "layer-pdl" if pdl else "layer", "rows": rows,
                   "pdl": kernels.pdl.active(device),
                   "cublas_us": _bench(old_layer), "fused_us": _bench(new_layer)}
            rec["speedup"] = rec["cublas_us"] / rec["fused_us"]
            records.append(rec)
        kernels.pdl.ENABLED = False
    path = common.write_results("linear", args.out, device, argv, records, shape=args.shape,
                                best_configs=best,
                                notes="bf16; medians of CUDA-graph replays; cublas_us includes "
                                      "the norm / SiLU * up launches the fused kernel replaces")
    rotary = [r for r in records if r["op"].startswith("qkv_rotary")]
    if rotary:
        common.print_table(f"qkv + rotary + pool write ({args.shape}): two launches vs one",
                           ["op", "rows", "pdl", "two launches us", "epilogue us", "speedup",
                            "same bits"],
                           [[r["op"], r["rows"], r["pdl"], r["two_launches_us"], r["epilogue_us"],
                             r["speedup"], r["same_bits"]] for r in rotary])
    table = [r for r in records if not r.get("sweep") and r not in rotary]
    common.print_table(f"fused projections ({args.shape}): {common.device_description(device)}",
                       ["op", "rows", "N", "K", "config", "cuBLAS path us", "fused us", "speedup",
                        "max |diff|"],
                       [[r["op"], r["rows"], r.get("n", "-"), r.get("k", "-"),
                         " ".join(map(str, r.get("config", []))) or "-", r["cublas_us"],
                         r["fused_us"], r["speedup"], r.get("max_abs_diff")] for r in table])
    if best:
        print("best configurations (paste into kernels.fused_linear.CONFIGS):")
        for name, b in best.items():
            print(f"    ({b['n']}, {b['k']}, {b['silu_mul']}): {tuple(b['config'])},  # {name}: "
                  + ", ".join(f"{r} rows {t:.2f} us" for r, t in b["us"].items()))
    print(f"wrote {path}")
    return path
