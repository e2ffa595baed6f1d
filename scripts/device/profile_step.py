"""Where does a GPU decode step go? (run on the device: `python3 scripts/device/profile_step.py
[method] [batch] [context]`, after stage.sh). Prefills a batch, then profiles a few decode
iterations with torch.profiler and prints the top operators by self CPU time and by CUDA time, so
the Python / launch overhead that bounds the engine before CUDA graphs can be attributed."""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from vegas_core.bench import texts
from vegas_core.engine import Engine
from vegas_core.engine_core import EngineOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

method = sys.argv[1] if len(sys.argv) > 1 else "vanilla"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 64
context = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
engine = Engine(os.environ.get("VEGAS_DEVICE_MODEL"), "cuda", "bfloat16",
                options=EngineOptions(num_blocks=batch * (context // 16 + 8), max_num_seqs=batch,
                                      max_prefill_tokens=16384))
tok = engine.tokenizer
spec = SpecParams(method=method, gamma=6, sparsity=0.07, min_budget=16)
for i in range(batch):
    engine.add(texts.long_text(context, tok, offset=i * context), SamplingParams(max_tokens=64, ignore_eos=True), spec)
while not any(engine.step()):      # prefill steps emit nothing
    pass
for _ in range(3):                  # warm up (Triton compiles, first selections)
    engine.step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(4):
        engine.step()
    torch.cuda.synchronize()
out = os.environ.get("OUT", ".")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20))
prof.export_chrome_trace(os.path.join(out, f"profile-{method}-b{batch}.json"))
