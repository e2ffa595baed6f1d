"""Where does a GPU decode iteration go? (on the device, after stage.sh:
`python3 scripts/device/profile_step.py [method] [batch] [context] [--eager]`). Prefills a batch
of real-text prompts, runs a few iterations so every CUDA graph is captured, then profiles three
with torch.profiler (CUPTI sees the kernels inside graph replays): the top GPU kernels by total
time, the top host operators, and the iteration's wall time, so GPU work and host gaps can be
told apart."""
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from vegas_core.bench import texts
from vegas_core.engine import Engine
from vegas_core.engine_core import EngineOptions
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

args = [a for a in sys.argv[1:] if not a.startswith("--")]
method = args[0] if args else "vanilla"
batch = int(args[1]) if len(args) > 1 else 64
context = int(args[2]) if len(args) > 2 else 6000
graphs = "off" if "--eager" in sys.argv else "auto"
engine = Engine(os.environ.get("VEGAS_DEVICE_MODEL"), "cuda", "bfloat16",
                options=EngineOptions(num_blocks=batch * (context // 16 + 24), max_num_seqs=batch,
                                      max_prefill_tokens=16384, cuda_graphs=graphs))
tok = engine.tokenizer
spec = SpecParams(method=method, gamma=6, sparsity=0.07, min_budget=16)
for i in range(batch):
    engine.add(texts.long_text(context, tok, offset=i * context), SamplingParams(max_tokens=200, ignore_eos=True), spec)
while not any(engine.step()):      # prefill steps emit nothing
    pass
for _ in range(4):                  # captures, compiles, first selections
    engine.step()
torch.cuda.synchronize()
t = time.perf_counter()
n = sum(len(e.new_token_ids) for _ in range(3) for e in engine.step())
torch.cuda.synchronize()
wall = (time.perf_counter() - t) / 3
print(f"{method} b{batch} ctx~{context} graphs={graphs}: {wall * 1e3:.2f} ms per iteration, "
      f"{n / 3 / wall:.0f} tokens/s unprofiled")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
events = prof.key_averages()
gpu = sum(getattr(e, "self_device_time_total", 0) for e in events) / 3     # kernels' own time
print(f"GPU kernel time per iteration {gpu / 1e3:.2f} ms (of {wall * 1e3:.2f} ms wall)")
print(events.table(sort_by="device_time_total", row_limit=22, max_name_column_width=70))
print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=70))
