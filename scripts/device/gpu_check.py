"""GPU smoke check (run on the device): greedy output of every method equals vanilla's in bf16 on a
few prompts, with the exact-match rate and the first divergence. Prints JSON."""
import json
import os
import sys
import time

from vegas_core.engine import Engine
from vegas_core.engine_core import EngineOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn leaves.",
           "Explain in two sentences why the sky is blue.", "List three uses of a paperclip.",
           "Translate 'good morning' into Spanish and German.", "Give me a short recipe for pancakes.",
           "What does a CPU cache do?", "Name four planets of the solar system."]

model = os.environ.get("VEGAS_DEVICE_MODEL")
dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
engine = Engine(model, "cuda", dtype, options=EngineOptions(kv_cache_bytes=4 << 30, max_num_seqs=64))
sampling = SamplingParams(max_tokens=64, ignore_eos=True)
out = {"dtype": dtype, "prompts": len(PROMPTS), "methods": {}}
t = time.perf_counter()
base = [r.token_ids for r in engine.generate(PROMPTS, sampling, chat=True)]
out["vanilla_s"] = time.perf_counter() - t
for method in ("stream", "quest", "specextend", "vegas", "vegas-all"):
    for gran in ("layer", "kv-head"):
        spec = SpecParams(method=method, gamma=6, sparsity=0.1, min_budget=16, granularity=gran)
        t = time.perf_counter()
        res = engine.generate(PROMPTS, sampling, spec=spec, chat=True)
        same = [r.token_ids == b for r, b in zip(res, base)]
        first = [next((i for i, (x, y) in enumerate(zip(r.token_ids, b)) if x != y), None) for r, b in zip(res, base)]
        out["methods"][f"{method}/{gran}"] = dict(
            exact_match_rate=sum(same) / len(same), first_divergence=first, seconds=time.perf_counter() - t,
            mean_acceptance_length=sum(r.mean_acceptance_length or 0 for r in res) / len(res))
print(json.dumps(out, indent=1))
