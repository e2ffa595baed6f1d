"""`python -m vegas_core.bench decode`: decode throughput of the engine, and of Hugging Face
`generate()` on the same weights and prompts in the same run.

For every (context, batch) pair: `batch` prompts of exactly `context` tokens of real text (distinct
slices of the standard-library corpus, `texts.long_text`), greedy, `ignore_eos`, `gen_tokens` new
tokens each; one warmup generation of the same shape first. Decode tokens/s = all tokens the batch
generated / wall time of the decode steps (prefill steps are timed apart and left out).

The Hugging Face baseline (`--hf`, on by default for a CPU run at batch 1 only) runs
`model.generate(max_new_tokens=N, min_new_tokens=N, do_sample=False, use_cache=True)` on a
transformers model holding the weights our loader produced (for a GGUF file: the dequantized
tensors, which the loader tests check equal transformers' own GGUF loading tensor for tensor; for a
Hugging Face directory: `from_pretrained`). A stopping criterion stamps the time after every
generated token, so its decode tokens/s = batch * (N - 1) / (time of token N - time of token 1):
token 1 comes out of the prefill pass in transformers, while our first token is a decode step.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch

from . import common, texts

GAMMA_SLACK = 17  # slots a speculative iteration may write past the verified prefix (gamma <= 16)


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes (default: 1)")
    p.add_argument("--context", type=int, nargs="+", default=[100],
                   help="prompt lengths in tokens of real text (default: 100)")
    p.add_argument("--gen-tokens", type=int, default=None,
                   help="tokens generated per request (default: 128 on CPU, 64 on GPU)")
    p.add_argument("--warmup", type=int, default=1, help="warmup generations per shape (default: 1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs per shape, the engine's and HF's alternating; the median is reported (default: 1)")
    p.add_argument("--method", default="vanilla", help="drafting policy of the engine (default: vanilla)")
    p.add_argument("--hf", action=argparse.BooleanOptionalAction, default=None,
                   help="also time Hugging Face generate() (default: on for a CPU run at batch 1 only)")
    p.add_argument("--kv-cache-gb", type=float, default=None,
                   help="KV pool size in GB (default: exactly what the largest batch needs)")
    p.add_argument("--max-prefill-tokens", type=int, default=None,
                   help="tokens per prefill step (default: 16384 on GPU, 4096 on CPU)")
    p.add_argument("--out", default=common.DEFAULT_OUT, help=f"result folder (default: {common.DEFAULT_OUT})")


def engine_options(args, device: torch.device, gen_tokens: int):
    """Sized so the largest batch runs at once: one sequence slot per request, every request's
    pages in the pool (no preemption), large prefill steps."""
    from ..options import EngineOptions

    block = 16
    per_request = math.ceil((max(args.context) + gen_tokens + GAMMA_SLACK) / block) + 1
    size = dict(kv_cache_bytes=int(args.kv_cache_gb * 1e9)) if args.kv_cache_gb else \
        dict(num_blocks=per_request * max(args.batch))
    return EngineOptions(block_size=block, max_num_seqs=max(args.batch), attention=args.attention,
                         cuda_graphs="off" if args.eager else "auto", deterministic=args.deterministic,
                         max_prefill_tokens=args.max_prefill_tokens or (16384 if device.type == "cuda" else 4096),
                         **size)


# -- the Hugging Face baseline ----------------------------------------------------------------
def hf_model(model_path: str | None, device: torch.device, dtype: torch.dtype):
    """A transformers causal LM with the same weights as the engine's."""
    import transformers

    from ..loader import default_model_path, load_model

    path = model_path or default_model_path()
    if os.path.isdir(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        return model.to(device).eval(), f"transformers AutoModelForCausalLM.from_pretrained({path!r})"
    loaded = load_model(path)
    cfg = loaded.config
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "gemma3": transformers.Gemma3TextConfig}[cfg.arch]
    extra = {"attention_bias": cfg.attention_bias} if cfg.arch in ("llama", "qwen3") else {}
    rope = dict(rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling)
    if cfg.arch == "gemma3":   # hybrid attention; one RoPE set per layer type
        extra = dict(sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types),
                     query_pre_attn_scalar=cfg.query_pre_attn_scalar or cfg.head_dim,
                     final_logit_softcapping=cfg.final_logit_softcapping)
        rope = dict(rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_theta}})
    hf_cfg = cls(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                 num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                 num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                 max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
                 tie_word_embeddings=cfg.tie_word_embeddings, bos_token_id=cfg.bos_token_id,
                 eos_token_id=list(cfg.eos_token_ids) or None, **rope, **extra)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    missing, unexpected = model.load_state_dict(loaded.weights, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF baseline: weights do not fit transformers' {cls.__name__}: "
                           f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model = model.to(device=device, dtype=dtype).eval()
    return model, f"transformers {cls.__name__.replace('Config', 'ForCausalLM')} with vegas_core.loader's weights"


def hf_generate(model, prompts: list[list[int]], gen_tokens: int, device: torch.device) -> dict:
    """Greedy transformers generate() of exactly `gen_tokens` tokens per prompt, timed per token."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    stamps: list[float] = []

    class Clock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            common.sync(device)
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    ids = torch.tensor(prompts, dtype=torch.long, device=device)  # same length: no padding needed
    eos = model.config.eos_token_id
    pad = eos if isinstance(eos, int) else (eos[0] if eos else 0)
    common.sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_tokens,
                             min_new_tokens=gen_tokens, do_sample=False, use_cache=True,
                             pad_token_id=pad,
                             stopping_criteria=StoppingCriteriaList([Clock()]),
                             temperature=None, top_p=None, top_k=None)
    decode_s = stamps[-1] - stamps[0]
    return dict(hf_tokens_per_s=len(prompts) * (len(stamps) - 1) / decode_s if decode_s > 0 else None,
                hf_decode_s=decode_s, hf_prefill_s=stamps[0] - t0,
                token_ids=out[:, ids.shape[1]:].tolist())


# -- the benchmark -----------------------------------------------------------------------------
def measure(engine, hf, prompts, spec, gen: int, warmup: int, repeats: int, device) -> dict:
    """Warm up, then time `repeats` runs of the engine, each followed by one of Hugging Face (when
    `hf`): alternating the two makes a change of machine load hit both alike. Reports the median
    run of each and every sample."""
    from ..sampling import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)
    warm = SamplingParams(temperature=0.0, max_tokens=min(gen, 8), ignore_eos=True)
    for _ in range(warmup):
        common.timed_generate(engine, prompts, warm, spec)
        if hf is not None:
            hf_generate(hf, prompts, min(gen, 8), device)
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(common.timed_generate(engine, prompts, sampling, spec))
        if hf is not None:
            theirs.append(hf_generate(hf, prompts, gen, device))
    t = sorted(ours, key=lambda x: x.tokens_per_s)[len(ours) // 2]
    rec = dict(generated_tokens=t.generated_tokens, decode_s=t.decode_s, prefill_s=t.prefill_s,
               decode_steps=t.decode_steps, ms_per_step=1e3 * t.decode_s / max(t.decode_steps, 1),
               tokens_per_s=t.tokens_per_s, tokens_per_s_samples=[x.tokens_per_s for x in ours],
               load_average_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    if spec.speculative:
        acc = [r.mean_acceptance_length for r in t.results if r.mean_acceptance_length]
        rec["mean_acceptance_length"] = sum(acc) / len(acc) if acc else None
    if hf is not None:
        h = sorted(theirs, key=lambda x: x["hf_tokens_per_s"] or 0)[len(theirs) // 2]
        rec.update(hf_tokens_per_s=h["hf_tokens_per_s"], hf_decode_s=h["hf_decode_s"], hf_prefill_s=h["hf_prefill_s"],
                   hf_tokens_per_s_samples=[x["hf_tokens_per_s"] for x in theirs],
                   speedup_vs_hf=t.tokens_per_s / h["hf_tokens_per_s"] if h["hf_tokens_per_s"] else None,
                   hf_same_tokens=h["token_ids"] == [r.token_ids for r in t.results])
    return rec


def run(args, argv: list[str]) -> str:
    from ..engine import Engine, resolve_device, resolve_dtype
    from ..spec import SpecParams

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    gen = args.gen_tokens or (64 if device.type == "cuda" else 128)
    use_hf = args.hf if args.hf is not None else (device.type == "cpu" and args.batch == [1])
    spec = SpecParams(method=args.method)
    engine = Engine(args.model, str(device), str(dtype).replace("torch.", ""), spec,
                    engine_options(args, device, gen))
    hf, hf_source = hf_model(args.model, device, dtype) if use_hf else (None, None)

    shapes = [(c, b) for c in args.context for b in args.batch]
    bar = common.progress_bar(len(shapes), "decode")
    records = []
    for context, batch in shapes:
        bar.set_postfix_str(f"context {context} batch {batch}")
        prompts = [texts.long_text(context, engine.tokenizer, offset=997 * i) for i in range(batch)]
        rec = dict(device=common.device_description(device), dtype=str(dtype).replace("torch.", ""),
                   method=args.method, batch=batch, context=context, gen_tokens=gen)
        rec.update(measure(engine, hf, prompts, spec, gen, args.warmup, args.repeats, device))
        records.append(rec)
        bar.update(1)
    bar.close()

    path = common.write_results(
        "decode", args.out, device, argv, records, model=engine.source,
        model_name=engine.config.name, mode=engine.mode, hf_baseline=hf_source,
        workload=dict(prompts="distinct slices of real text, exactly `context` tokens each (offset 997 * i)",
                      text=texts.corpus_info(), sampling="greedy, ignore_eos, exactly gen_tokens new tokens",
                      warmup=f"{args.warmup} generation(s) of min(gen_tokens, 8) tokens per shape",
                      repeats=f"{args.repeats} timed run(s) per shape, ours and HF alternating; median reported",
                      tokens_per_s="generated tokens of the whole batch / wall time of the decode steps",
                      hf_tokens_per_s="batch * (N - 1) / time from the 1st to the N-th generated token"))
    columns = ["batch", "context", "gen", "tokens/s", "ms/step", "prefill s"]
    if hf is not None:
        columns += ["HF tokens/s", "ours / HF", "same ids"]
    rows = []
    for r in records:
        row = [r["batch"], r["context"], r["gen_tokens"], r["tokens_per_s"], r["ms_per_step"], r["prefill_s"]]
        if hf is not None:
            row += [r["hf_tokens_per_s"], r["speedup_vs_hf"], r["hf_same_tokens"]]
        rows.append(row)
    dt = str(dtype).replace("torch.", "")
    common.print_table(f"decode: {common.device_description(device)}, {dt}, {args.method}", columns, rows)
    print(f"wrote {path}")
    return path
