"""`python -m vegas_core.bench linear`: the fused projections (`kernels/fused_linear.py`,
`kernels/qkv_rotary.py`) at a model's shapes, each launch configuration of a small grid against the
one the engine picks (`fused_linear.config_for`) and cuBLAS (`F.linear`, the product alone).

Decode and draft steps of up to `KernelOptions.fused_linear_rows` rows run their projections
through these kernels with a configuration chosen from the weight's shape alone (so a row's bits do
not depend on its batch); a shape without a tuned entry in `fused_linear.CONFIGS` takes the default,
which suits SmolLM2's small weights. Per shape: each candidate's median time (CUDA events, L2
cleared between repetitions as a decode step finds it: `triton.testing.do_bench`), the weight's
read rate, and the fastest candidate in `CONFIGS`' form. Random bf16 data; every candidate's
output is checked against the reference first.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from . import common

GRID = dict(block_m=(16, 64), block_n=(16, 32, 64), block_k=(64, 128), warps=(4, 8), stages=(3,))


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p, attention=False)
    p.add_argument("--rows", type=int, nargs="+", default=[64], help="rows per product (default: 64)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def model_shapes(cfg) -> list[dict]:
    """The decoder layer's products: name, N (outputs), K, and which kernel runs it."""
    h, d = cfg.hidden_size, cfg.head_dim
    q_out = cfg.num_heads * d
    return [dict(name="qkv", n=(cfg.num_heads + 2 * cfg.num_kv_heads) * d, k=h, cfg=cfg,
                 kind="norm" if cfg.qk_norm else "rotary", bias=cfg.attention_bias),
            dict(name="o_proj", n=h, k=q_out, kind="add", bias=False),
            dict(name="gate_up", n=cfg.intermediate_size, k=h, kind="silu", bias=False),
            dict(name="down_proj", n=h, k=cfg.intermediate_size, kind="add", bias=False)]


def run(args, argv: list[str]) -> str:
    from ..engine import resolve_device
    from ..kernels import fused_linear
    from ..loader import load_model
    device = resolve_device(args.device)
    common.require_cuda(device, "linear", "tests/vegas_core/kernels/test_fused_linear.py checks the kernels")
    cfg = load_model(args.model).config
    records = []
    candidates = [c for c in itertools.product(*GRID.values())]
    bar = common.progress_bar(len(args.rows) * 4 * (len(candidates) + 2), "linear")
    for rows in args.rows:
        for shape in model_shapes(cfg):
            records.append(time_shape(shape, rows, candidates, fused_linear.config_for(
                shape["n"], shape["k"], shape["kind"] == "silu"), device, bar))
    bar.close()
    path = common.write_results("linear", args.out, device, argv, records, model=args.model or "SmolLM2",
                                model_name=cfg.name, grid=GRID)
    common.print_table(f"fused projections: {common.device_description(device)}, {cfg.name}",
                       ["rows", "product", "N x K", "cuBLAS us", "engine us", "engine config", "best us",
                        "best config", "best TB/s"],
                       [[r["rows"], r["name"], f"{r['n']} x {r['k']}", r["cublas_us"], r["engine_us"],
                         str(tuple(r["engine_config"])), r["best_us"], str(tuple(r["best_config"])),
                         r["best_TBps"]] for r in records])
    print("CONFIGS entries (N, K, silu_mul): (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages):")
    for r in records:
        print(f"    ({r['n']}, {r['k']}, {r['kind'] == 'silu'}): {tuple(r['best_config'])},   # {r['name']}")
    print(f"wrote {path}")
    return path


def time_shape(shape: dict, rows: int, candidates: list, engine_config, device, bar) -> dict:
    import triton.testing
    from ..kernels import fused_linear, qkv_rotary
    torch.manual_seed(0)
    n, k, kind = shape["n"], shape["k"], shape["kind"]
    dt = torch.bfloat16
    x = torch.randn(rows, k, dtype=dt, device=device)
    w = torch.randn(2 * n if kind == "silu" else n, k, dtype=dt, device=device) / k ** 0.5
    nw = torch.rand(k, dtype=dt, device=device) + 0.5
    b = torch.randn(n, dtype=dt, device=device) if shape["bias"] else None
    residual = torch.randn(rows, n, dtype=dt, device=device)
    rot = _rotary_inputs(shape["cfg"], rows, device) if kind == "rotary" else None

    def launch(config):
        if kind == "rotary":
            return qkv_rotary.norm_linear_rotary(x, nw, 1e-6, w, b, *rot, config=config)
        if kind == "add":
            return fused_linear.linear_add(x, w, residual.clone(), config=config)
        return fused_linear.norm_linear(x, nw, 1e-6, w, b, silu_mul=kind == "silu", config=config)

    def reference():
        if kind == "rotary":
            return qkv_rotary.norm_linear_rotary_reference(x, nw, 1e-6, w, b, *_rotary_inputs(shape["cfg"], rows, device))
        if kind == "add":
            return fused_linear.linear_add_reference(x, w, residual.clone())
        return fused_linear.norm_linear_reference(x, nw, 1e-6, w, b, silu_mul=kind == "silu")

    want = reference()
    times = {}
    for config in [tuple(engine_config), *candidates]:
        if config in times:
            bar.update(1)
            continue
        got = launch(config)
        if not torch.allclose(got.float(), want.float(), atol=5e-2, rtol=5e-2):
            raise AssertionError(f"{shape['name']} config {config}: output differs from the reference")
        times[config] = 1e3 * triton.testing.do_bench(lambda c=config: launch(c))
        bar.update(1)
    cublas = 1e3 * triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w))
    bar.update(1)
    best = min(times, key=times.get)
    weight_bytes = w.numel() * w.element_size()
    return dict(name=shape["name"], kind=kind, rows=rows, n=n, k=k, cublas_us=cublas,
                engine_config=list(engine_config), engine_us=times[tuple(engine_config)],
                best_config=list(best), best_us=times[best], best_TBps=weight_bytes / (times[best] * 1e6),
                candidates=[dict(config=list(c), us=t) for c, t in sorted(times.items(), key=lambda kv: kv[1])])


def _rotary_inputs(cfg, rows: int, device):
    """cos, sin ([rows, head dim]), heads, KV heads, head dim, a K/V pool and slots for
    `norm_linear_rotary`."""
    d = cfg.head_dim
    pos = torch.arange(rows, device=device, dtype=torch.float32)[:, None]
    freqs = pos / (10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    freqs = torch.cat([freqs, freqs], dim=1)
    cos, sin = torch.cos(freqs).to(torch.bfloat16), torch.sin(freqs).to(torch.bfloat16)
    k_cache = torch.zeros(rows, 16, cfg.num_kv_heads, d, dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.arange(rows, device=device, dtype=torch.int64) * 16
    return cos, sin, cfg.num_heads, cfg.num_kv_heads, d, k_cache, v_cache, slots
