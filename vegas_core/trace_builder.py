"""Turn an engine run (results with their per-iteration records) into a `trace.Trace`."""
from __future__ import annotations

from .sampling import SamplingParams
from .spec import SpecParams
from .trace import ModelInfo, RequestTrace, RunConfig, Trace


def build_trace(engine, results, spec: SpecParams, sampling: SamplingParams,
                prompt_ids: list[list[int]] | None = None, prompt_texts: list[str] | None = None,
                decode_time_s: float | None = None) -> Trace:
    cfg = engine.config
    model = ModelInfo(name=cfg.name or engine.source, arch=cfg.arch, num_layers=cfg.num_layers,
                      num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                      vocab_size=cfg.vocab_size, dtype=str(engine.dtype).replace("torch.", ""),
                      device=str(engine.device))
    config = RunConfig(method=spec.method, granularity=spec.granularity, gamma=spec.gamma,
                       sparsity=spec.sparsity, min_budget=spec.min_budget, sink=spec.sink,
                       page_size=spec.page_size, temperature=sampling.temperature, top_p=sampling.top_p,
                       top_k=max(sampling.top_k, 0), min_p=sampling.min_p, seed=sampling.seed,
                       max_tokens=sampling.max_tokens)
    requests, seen = [], set()
    for i, res in enumerate(results):
        prompt = prompt_ids[i] if prompt_ids else res.prompt_ids
        requests.append(RequestTrace(
            request_id=str(res.request_id), prompt_token_ids=prompt,
            prompt_text=prompt_texts[i] if prompt_texts else None, output_token_ids=res.token_ids,
            output_text=res.text, finish_reason=res.finish_reason or "abort", iterations=res.iterations,
            decode_time_s=res.decode_time_s, prefill_time_s=res.prefill_time_s))
        seen.update(prompt)
        seen.update(res.token_ids)
        for it in res.iterations:
            seen.update(d["token_id"] for d in it["drafts"])
    tok = engine.tokenizer
    token_texts = {t: tok.decode([t], skip_special_tokens=False) for t in sorted(seen)}
    return Trace(model=model, config=config, requests=requests, token_texts=token_texts,
                 decode_time_s=decode_time_s)
