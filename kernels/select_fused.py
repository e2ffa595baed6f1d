"""A whole model step's Vegas / SpecExtend selection in one Triton launch: per (layer, request,
group) one program scores every position into registers and selects the top ``budget`` of them
there (`select_fused`), instead of `selection_scores` writing int32 keys to memory and
`radix_topk` reading them back five times (four 8-bit histogram passes and an emit pass, each over
1,024-key chunks). Rows of up to ``MAX_KEYS`` positions (the scores live in one register tile);
`kernels.select.select_layers` uses it for those and the two-launch path above that.

Same answer, bit for bit, as the two-launch path: the scores are `_row_scores`' per-position
float32 maths unchanged (no reduction crosses positions), and the choice is the same radix select
(larger scores first, ties to the lower position), so `tests/kernels/test_select_fused.py` asserts
equality, not a tolerance.
"""
from __future__ import annotations

import torch

from kernels.select import _as_int_tensor, _groups, _interpreting

try:  # Triton is optional: the CPU engine path only needs the references.
    import triton
    import triton.language as tl

    from kernels.select import _row_scores
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

# One register tile per row: 8,192 float32 scores are 32 a thread at 8 warps. SmolLM2's whole
# context (8K); longer rows take the two-launch path.
MAX_KEYS = 8192
NUM_WARPS = 8


if triton is not None:

    @triton.jit
    def _tile_radix_step(u, valid, prefix, remaining, SHIFT: tl.constexpr):
        """One 8-bit digit of the remaining-th largest of the unsigned keys `u` among those whose
        bits above the digit equal prefix's: the largest digit whose count at or above it still
        reaches `remaining` (as `kernels.select._radix_step`, over registers instead of memory)."""
        if SHIFT == 24:
            cand = valid
        else:
            cand = valid & ((u >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        hist = tl.histogram(((u >> SHIFT) & 255).to(tl.int32), 256, mask=cand)
        bins = tl.arange(0, 256)
        at_or_above = tl.sum(hist) - tl.cumsum(hist, 0) + hist
        digit = tl.max(tl.where(at_or_above >= remaining, bins, 0), axis=0)
        above = tl.sum(tl.where(bins > digit, hist, 0), axis=0)
        return prefix | (digit.to(tl.uint32) << SHIFT), remaining - above

    # Sizes and strides change with every step's longest prefix and budget: not specialised on
    # (a recompile inside a timed step cost SpecExtend 37 ms on the H200; see kernels/select.py).
    @triton.jit(do_not_specialize=["batch", "n", "k_max", "s_ll", "s_lr", "s_el", "s_or", "s_og"])
    def _select_fused_kernel(
            logits_ptr, lse_ptr, start_ptr, count_ptr, bases_ptr, budget_ptr, out_ptr,
            batch, n, k_max, s_ll, s_lr, s_lh, s_ln, s_el, s_er, s_eh, s_or, s_og, s_ok,
            PER_GROUP: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
        """One program = one (layer, request) x one group: scores of positions [0, n)
        (`_row_scores`, as `_selection_scores_kernel`), made order-preserving unsigned keys, a
        radix select of the budget-th largest in four histogram passes over the registers, then
        the chosen positions written ascending and 0 up to k_max."""
        layer = tl.program_id(0) // batch
        req = tl.program_id(0) % batch
        grp = tl.program_id(1)
        r0 = tl.load(start_ptr + req)
        nr = tl.load(count_ptr + req)
        base = tl.load(bases_ptr + req)
        k = tl.load(budget_ptr + req).to(tl.int32)
        logits_ptr += layer.to(tl.int64) * s_ll
        lse_ptr += layer.to(tl.int64) * s_el

        offs = tl.arange(0, BLOCK_N)
        valid = offs < n
        n_valid = (offs < base) & valid
        r_end = tl.where(base > 0, r0 + nr, r0)
        score = _row_scores(r0, r_end, nr, offs, n_valid, grp, logits_ptr, lse_ptr,
                            s_lr, s_lh, s_ln, s_er, s_eh, PER_GROUP, BLOCK_N, INTERPRET)
        # Order-preserving int32 bits (as packed="bits"), then the sign bit flipped: unsigned order.
        bits = score.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        u = key.to(tl.uint32, bitcast=True) ^ 0x80000000

        prefix = tl.zeros([], dtype=tl.uint32)
        remaining = k
        prefix, remaining = _tile_radix_step(u, valid, prefix, remaining, 24)
        prefix, remaining = _tile_radix_step(u, valid, prefix, remaining, 16)
        prefix, remaining = _tile_radix_step(u, valid, prefix, remaining, 8)
        prefix, remaining = _tile_radix_step(u, valid, prefix, remaining, 0)

        # Keys above the threshold, and keys equal to it while fewer than `remaining` came before.
        eq = (valid & (u == prefix)).to(tl.int32)
        tie_rank = tl.cumsum(eq, 0) - eq
        take = ((valid & (u > prefix)) | ((eq != 0) & (tie_rank < remaining))).to(tl.int32)
        slot = tl.cumsum(take, 0) - take
        dst = out_ptr + tl.program_id(0).to(tl.int64) * s_or + grp.to(tl.int64) * s_og
        tl.store(dst + slot.to(tl.int64) * s_ok, offs, mask=take != 0)
        tl.store(dst + (k + offs).to(tl.int64) * s_ok, 0, mask=k + offs < k_max)


def select_fused(logits, lse, row_start, row_count, bases, budgets, k_max: int, kv_heads: int,
                 granularity: str, n_keys: int | None = None, num_warps: int = NUM_WARPS):
    """`kernels.select.select_layers` for ``logits [L, R, H, W]``, ``lse [L, R, H]`` and at most
    ``MAX_KEYS`` scored positions (``n_keys``, default W), in one launch: int32
    ``[L, B, G, k_max]``, per (layer, request, group) the top ``budgets[b]`` positions ascending,
    padded with 0. The same positions as `selection_scores(..., packed="bits")` + `radix_topk`."""
    if triton is None:
        raise RuntimeError("select_fused needs Triton; use the references in kernels.select")
    layers, rows, heads, width = logits.shape
    n = width if n_keys is None else n_keys
    if not 0 <= n <= min(width, MAX_KEYS):
        raise ValueError(f"select_fused scores 0 to {MAX_KEYS} positions within the logits' "
                         f"{width}, not {n}")
    if k_max > n:
        raise ValueError(f"a budget of {k_max} exceeds the {n} scored positions")
    groups, per_group = _groups(granularity, heads, kv_heads)
    batch = row_start.shape[0]
    budgets = _as_int_tensor(budgets, logits.device)
    out = torch.empty(layers, batch, groups, k_max, dtype=torch.int32, device=logits.device)
    if k_max and batch and layers:
        flat = out.view(layers * batch, groups, k_max)
        _select_fused_kernel[(layers * batch, groups)](
            logits, lse, row_start, row_count, bases, budgets, flat, batch, n, k_max,
            *logits.stride(), *lse.stride(), *flat.stride(),
            PER_GROUP=per_group, BLOCK_N=max(16, triton.next_power_of_2(max(n, 1))),
            INTERPRET=_interpreting(), num_warps=num_warps)
    return out
