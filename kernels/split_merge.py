"""Flash-decoding's merge inside the split kernel: the last split of a (request, KV head) to finish
combines every split's partial state, so no second kernel is launched.

Why: Nsight Compute timed the separate merge kernels at 10.8 us per verification layer (4,608
tiny programs at batch 64 x 8 rows) and 3.0 us per sparse draft layer, next to 135 us and 17 us
of attention (bench/results/logs/ncu-2026-12-01-h200-attention.txt). Measured in graph replay
(`sweep: merge_tune`, bench/results/kernels-2026-12-01-h200-merge.json) the gain is smaller and
not everywhere, which is why `verify_attention.launch_config` and `sparse_attention` choose per
path: the merge code adds registers, which cost occupancy unless capped.

How: each split stores its partial (max, sum, accumulator), then one thread of the program adds 1
to the (request, KV head)'s arrival counter with acquire-release semantics after a CTA barrier
(CUTLASS's semaphore pattern: the barrier orders the other threads' stores before the release).
The program that sees ``num_splits - 1`` arrivals before it is the last; it reads the partials
(through L2, ``.cg``) and resets the counter to 0, so the counters are zero again whenever a
kernel ends: one zeroed buffer serves every layer and every CUDA-graph replay. Kernels that share
a buffer must not run concurrently (the engine runs one stream). Which program is last varies;
the merge reads the splits in split order, so the result does not depend on it.
"""
from __future__ import annotations

import torch

try:  # Triton is optional: the CPU engine path only needs the references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

_COUNTERS: dict[tuple[str, int | None], torch.Tensor] = {}
_KEEP: list[torch.Tensor] = []   # replaced buffers stay alive: captured graphs hold their address


def arrival_counters(device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``n`` counters on ``device``, shared by every call (the
    kernels leave it zeroed). Grown, never freed; allocate the largest size before capturing a
    graph that needs it (a warm-up run does)."""
    device = torch.device(device)
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 8192), dtype=torch.int32, device=device)
        _KEEP.append(buf)
        _COUNTERS[key] = buf
    return buf


if triton is not None:

    @triton.jit
    def last_to_arrive(counter_ptr, num_splits):
        """True in the program that arrives last at ``counter_ptr`` (and then resets it). Call
        after the program's partial-state stores."""
        tl.debug_barrier()                       # every thread's partial stores before the release
        arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
        last = arrived == num_splits - 1
        if last:
            tl.store(counter_ptr, 0)             # the next kernel (stream-ordered) finds it zeroed
        return last
