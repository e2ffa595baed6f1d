"""Flash-decoding's merge inside the split kernel: the last split of a (request, KV head) to finish
combines every split's partial state, so no second kernel is launched.

Why: a separate merge kernel of thousands of tiny programs cost 8-18 % of the attention it follows
(Nsight Compute); in graph replay the gain is smaller and not everywhere, so
`verify_attention.launch_config` chooses per path (the merge code adds registers, which cost
occupancy unless capped) and sparse_attention keeps its merge kernel (bench/NOTES.md, split_merge).

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

    @triton.jit
    def fold_online(m, l_sum, o, m_s, l_s, acc_s):
        """Fold one split's state (max, sum, unnormalised accumulator) into a running one, both
        rescaled to their common max: the merge of the batch-invariant mode, which
        `verify_attention` also runs inside one program over splits it attends one after
        another (the same arithmetic, so the same bits). An empty split (max -1e30, sum 0)
        leaves the state as it was, exactly."""
        m_new = tl.maximum(m, m_s)
        a = tl.exp(m - m_new)
        b = tl.exp(m_s - m_new)
        return m_new, l_sum * a + l_s * b, o * a[:, None] + acc_s * b[:, None]

    @triton.jit
    def merge_partials(part_acc_ptr, part_ml_ptr, first, step, num_splits, m_valid, offs_d,
                       d_valid, ACC_STRIDE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr, ONLINE: tl.constexpr = False):
        """Combine the splits' partial states of BLOCK_M (row, head) pairs: split ``s`` of pair
        ``i`` is partial ``first[i] + s * step``, with (max, sum) at ``part_ml[2p], [2p + 1]`` and
        the unnormalised accumulator at ``part_acc[p * ACC_STRIDE + d]``. The splits are read in
        order, through L2 (``.cg``: other programs wrote them). Returns (normalised output
        [BLOCK_M, BLOCK_D] float32, log-sum-exp [BLOCK_M]); empty splits (max -1e30, sum 0) weigh
        exp(-huge) = 0. ONLINE: one pass folding each split in (`fold_online`) instead of the
        max over all splits first."""
        m_max = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        o = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if ONLINE and INTERPRET:
            s = 0
            while s < num_splits:
                m_max, l_sum, o = _fold_online_split(part_acc_ptr, part_ml_ptr, first + s * step,
                                                     m_valid, offs_d, d_valid, m_max, l_sum, o,
                                                     ACC_STRIDE)
                s += 1
        elif ONLINE:
            for s in range(0, num_splits):
                m_max, l_sum, o = _fold_online_split(part_acc_ptr, part_ml_ptr, first + s * step,
                                                     m_valid, offs_d, d_valid, m_max, l_sum, o,
                                                     ACC_STRIDE)
        elif INTERPRET:   # while loops: Triton 3.6's interpreter takes no runtime range() bound
            s = 0
            while s < num_splits:
                m_max = tl.maximum(m_max, _split_max(part_ml_ptr, first + s * step, m_valid))
                s += 1
            s = 0
            while s < num_splits:
                l_sum, o = _fold_split(part_acc_ptr, part_ml_ptr, first + s * step, m_valid, offs_d,
                                       d_valid, m_max, l_sum, o, ACC_STRIDE)
                s += 1
        else:
            for s in range(0, num_splits):
                m_max = tl.maximum(m_max, _split_max(part_ml_ptr, first + s * step, m_valid))
            for s in range(0, num_splits):
                l_sum, o = _fold_split(part_acc_ptr, part_ml_ptr, first + s * step, m_valid, offs_d,
                                       d_valid, m_max, l_sum, o, ACC_STRIDE)
        l_safe = tl.where(l_sum > 0, l_sum, 1.0)
        return o / l_safe[:, None], m_max + tl.log(l_safe)

    @triton.jit
    def _fold_online_split(part_acc_ptr, part_ml_ptr, part, m_valid, offs_d, d_valid, m, l_sum, o,
                           ACC_STRIDE: tl.constexpr):
        m_s = tl.load(part_ml_ptr + 2 * part, mask=m_valid, other=-1.0e30, cache_modifier=".cg")
        l_s = tl.load(part_ml_ptr + 2 * part + 1, mask=m_valid, other=0.0, cache_modifier=".cg")
        acc_s = tl.load(part_acc_ptr + part[:, None] * ACC_STRIDE + offs_d[None, :],
                        mask=m_valid[:, None] & d_valid[None, :], other=0.0, cache_modifier=".cg")
        return fold_online(m, l_sum, o, m_s, l_s, acc_s)

    @triton.jit
    def _split_max(part_ml_ptr, part, m_valid):
        return tl.load(part_ml_ptr + 2 * part, mask=m_valid, other=-1.0e30, cache_modifier=".cg")

    @triton.jit
    def _fold_split(part_acc_ptr, part_ml_ptr, part, m_valid, offs_d, d_valid, m_max, l_sum, o,
                    ACC_STRIDE: tl.constexpr):
        m_s = tl.load(part_ml_ptr + 2 * part, mask=m_valid, other=-1.0e30, cache_modifier=".cg")
        l_s = tl.load(part_ml_ptr + 2 * part + 1, mask=m_valid, other=0.0, cache_modifier=".cg")
        acc_s = tl.load(part_acc_ptr + part[:, None] * ACC_STRIDE + offs_d[None, :],
                        mask=m_valid[:, None] & d_valid[None, :], other=0.0, cache_modifier=".cg")
        w = tl.exp(m_s - m_max)
        return l_sum + w * l_s, o + w[:, None] * acc_s
