"""Batched selection for a GPU engine step (issue 4, selection kernels): one call covers the whole
batch for one layer. Triton kernels sit beside plain PyTorch references with the same signature;
the torch-only steps (top-k, page bounds, Quest expansion) are batched tensor code, no per-request
Python loop. Per request, every function agrees with the engine's own per-request maths in
``vegas_core.spec.select`` (``select_from_logits``, ``quest_page_bounds``, ``quest_scores``,
``quest_select``).

Granularity (``vegas_core.spec.params.GRANULARITIES``): ``"layer"`` gives one set per request
(``G = 1``, all ``H`` query heads in the group); ``"kv-head"`` one per KV head (``G = kv_heads``,
group ``g`` holds query heads ``g*H/kv_heads .. (g+1)*H/kv_heads - 1``, the heads that read KV head
``g``).

Vegas / SpecExtend (softmax re-materialisation from collected verification logits):

- ``selection_scores(logits, lse, row_start, row_count, bases, kv_heads, granularity)``:
  ``logits`` bf16 (or any float) ``[R, H, N]`` are the scaled pre-softmax scores of the ``R``
  collected verification rows (``CollectedLogits.logits`` of ``verify_attention``), ``-inf`` where a
  row could not see a key; ``lse`` float32 ``[R, H]`` each row's log-sum-exp over its whole context.
  Request ``b`` owns rows ``row_start[b] .. row_start[b] + row_count[b] - 1`` (int32 ``[B]``,
  ``row_count >= 1``; the rows need not be contiguous across requests nor cover all of ``R``) and
  scores the positions ``< bases[b]`` (int32 ``[B]``, ``bases[b] <= N``). Returns float32
  ``[B, G, N]``: the LOG of the mean over the request's rows and the group's heads of
  ``exp(logit - lse)`` (a log-sum-exp, so the ranking is the mean weight's), ``-inf`` at positions
  ``>= bases[b]``. float32 maths throughout. Log space because far keys' weights underflow to
  exactly 0 in float32: thousands of tied zeros per row sent torch.topk's radix select into its
  slow path (28-36 ms a step for SpecExtend and per-KV-head Vegas on the H200,
  bench/results/e2e-2026-12-01-h200-smoke.json), and their order is lost.
- ``topk_positions(score, budgets)``: ``score [B, G, N]``, ``budgets`` int ``[B]`` with
  ``0 <= budgets[b] <= bases[b]``. Returns ``(positions int32 [B, G, Kmax], counts int32 [B])``,
  ``Kmax = max(budgets)`` (0 allowed): the first ``counts[b] = budgets[b]`` entries of each
  ``[b, g]`` row are that row's top-``budgets[b]`` positions sorted ascending, the rest are 0
  (padding). One ``torch.topk`` for the whole batch.
- ``radix_topk(keys, budgets, k_max)``: the same choice for every layer of a model step in one
  Triton launch (the engine's, through ``select_layers``), over the int32 order-preserving score
  bits ``selection_scores(..., packed="bits")`` writes: a radix select of the threshold, ties to
  the lower position, the chosen positions emitted in order (no sort).

Quest (page size == the pool's block size, so a Quest page IS a KV-pool block and its bounds live
beside the pool, ``[num_blocks, KVH, d]`` per layer, indexed by physical block):

- ``update_page_bounds(k_cache, kmin, kmax, blocks)``: ``k_cache [num_blocks, block_size, KVH, d]``
  (one layer); writes ``kmin[blk] = min``, ``kmax[blk] = max`` element-wise over the block's entries
  for each physical block in ``blocks`` (int64 ``[n]``; every entry of those blocks must be valid and
  final, i.e. complete pages below the verified prefix). ``kmin, kmax`` have the cache's dtype
  (min/max are exact, so they equal ``quest_page_bounds`` of the request's keys bit for bit).
- ``quest_page_scores(q, kmin, kmax, block_tables, num_pages, granularity)``: ``q [B, H, d]`` one
  draft row per request; ``block_tables`` int32 ``[B, max_blocks]``; ``num_pages`` int32 ``[B]``
  complete pages below each request's base (logical page ``p`` = physical block
  ``block_tables[b, p]``). Returns float32 ``[B, G, Pmax]``, ``Pmax = max(num_pages)`` (may be 0):
  the Quest bound ``sum_{h in group} sum_d max(q[h,d] * kmax[blk, kvh(h), d],
  q[h,d] * kmin[blk, kvh(h), d])``, ``-inf`` for ``p >= num_pages[b]``.
- ``quest_positions(page_scores, num_pages, bases, budgets, page_size)``: per request the top
  ``n_sel = min(num_pages[b], max(1, ceil(budgets[b] / page_size)))`` pages (0 when
  ``num_pages[b] == 0``), expanded to ``page*page_size + [0, page_size)`` and sorted ascending,
  followed by the partial tail ``[num_pages[b]*page_size, bases[b])`` (always kept; ``bases[b] >=
  num_pages[b]*page_size``). Returns
  ``(indices int32 [B, G, K], counts int32 [B])`` laid out like ``topk_positions``; per request the
  same positions, in the same order, as ``quest_select``.

Tolerances (tests/kernels/test_select.py): ``selection_scores`` Triton vs reference atol = 1e-6,
rtol = 1e-5. Both read the same bf16 logits and compute ``exp`` in float32; they differ only in
``exp``'s last-ulp rounding (the GPU's ``ex2.approx`` path: relative error ~|x| * 2^-23, about 1e-6
for ``x = logit - lse`` near -10, whose weight ``exp(x) < 5e-5`` is then far under atol) and in the
summation order of the rows*heads positive terms (at most 17 * 9 in the tests: worst-case relative
error 153 * 2^-24 < 1e-5).
``quest_page_scores`` Triton vs reference and vs ``quest_scores`` atol = rtol = 1e-4 (float32 sums of
d products per head, then over the group's heads, in a different order). Top-k and Quest
selections must be the same sets as the per-request engine functions; the test data keep the last
chosen and the first rejected score more than twice these tolerances apart, so no choice can flip.

Host syncs: output widths (``N`` is the logits' width; ``Kmax``, ``Pmax``, ``K`` are maxima of small
int tensors) are read on the host once per call.
"""
from __future__ import annotations

import torch

try:  # Triton is optional: the CPU engine path only needs the references.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

if triton is not None:   # a device helper, only where Triton is installed
    from .sort import sort_rows

GRANULARITIES = ("layer", "kv-head")

# Whether select_layers scores and selects in one launch where the rows fit
# (kernels/select_fused.py). Off: measured slower on the H200 than the two launches (vegas's
# selection 0.88 -> 2.58 ms an iteration; `bench e2e --fused-select`, bench/NOTES.md version 38).
FUSED_SELECT = False

# select_layers' two launches: (position tile, warps) of the scoring and (chunk, warps) of the radix
# top-k; any launch gives the same bits (tests/kernels/test_select.py). Measured on the H200
# (`scripts/device/probe_selection.py`, bench/results/kernels-2026-12-03-h200-selection-probe.json,
# every layer at batch 64 x 6K): the scoring took 368 us with 1,024-position tiles and 4 warps, 161
# with 512 and 4 (four positions a thread; 256 / 2 and 1,024 / 8 alike, 8+ a thread 2-30x slower);
# the top-k 293 against 278 us with 512-key chunks. In the e2e, vegas's selection 0.88 -> 0.60 ms
# an iteration (bench/NOTES.md version 43). `bench e2e --select-launch` overrides them for an A/B.
SCORE_LAUNCH: tuple[int, int] = (512, 4)
TOPK_LAUNCH: tuple[int, int] = (512, 4)


def _groups(granularity: str, heads: int, kv_heads: int) -> tuple[int, int]:
    """(G, query heads per group)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split over {kv_heads} KV heads")
    if granularity == "layer":
        return 1, heads
    return kv_heads, heads // kv_heads


def _as_int_tensor(x, device) -> torch.Tensor:
    return torch.as_tensor(x, device=device).to(torch.int64)


# ------------------------------------------------------------------------------------------------
# Vegas / SpecExtend: softmax re-materialisation from collected verification logits
# ------------------------------------------------------------------------------------------------

def selection_scores_reference(logits, lse, row_start, row_count, bases, kv_heads: int,
                               granularity: str):
    """Plain PyTorch, batched (see the module docstring); float32 maths, the log of
    ``select_from_logits``'s mean weight."""
    rows, heads, n = logits.shape
    groups, per_group = _groups(granularity, heads, kv_heads)
    device = logits.device
    batch = row_start.shape[0]
    out = torch.full((batch, groups, n), float("-inf"), dtype=torch.float32, device=device)
    if batch == 0 or n == 0:
        return out
    x = logits.float() - lse.float()[..., None]                               # [R, H, N]
    x = torch.logsumexp(x.view(rows, groups, per_group, n), dim=2)            # [R, G, N]
    start, count = _as_int_tensor(row_start, device), _as_int_tensor(row_count, device)
    # Gather each request's rows into a padded [B, max_rows] table (no per-request loop).
    j = torch.arange(int(count.max()), device=device)[None, :]
    present = j < count[:, None]                                              # [B, max_rows]
    idx = torch.where(present, start[:, None] + j, 0)
    terms = x[idx].masked_fill(~present[:, :, None, None], float("-inf"))    # [B, max_rows, G, N]
    score = torch.logsumexp(terms, dim=1) - torch.log((count * per_group).float())[:, None, None]
    keep = torch.arange(n, device=device)[None, :] < _as_int_tensor(bases, device)[:, None]
    return torch.where(keep[:, None, :], score, out)


if triton is not None:

    @triton.jit
    def _fold_rows(r, m, s, offs_n, n_valid, grp, logits_ptr, lse_ptr, s_lr, s_lh, s_ln, s_er, s_eh,
                   PER_GROUP: tl.constexpr):
        """Fold one collected row's log weights (logit - lse) of the group's heads, one head at a
        time, into the running (max, sum of exp(x - max)) per position: every reduction is per
        position, none crosses threads."""
        r64 = r.to(tl.int64)
        for h in tl.static_range(PER_GROUP):
            head = grp * PER_GROUP + h
            lse = tl.load(lse_ptr + r64 * s_er + head * s_eh).to(tl.float32)
            x = tl.load(logits_ptr + r64 * s_lr + head * s_lh + offs_n.to(tl.int64) * s_ln,
                        mask=n_valid, other=float("-inf")).to(tl.float32) - lse
            m_new = tl.maximum(m, x)
            s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
        return m, s

    @triton.jit
    def _row_scores(r0, r_end, nr, offs_n, n_valid, grp, logits_ptr, lse_ptr, s_lr, s_lh, s_ln,
                    s_er, s_eh, PER_GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    INTERPRET: tl.constexpr):
        """The log mean weight at each of the BLOCK_N positions over rows [r0, r_end) (nr of
        them) x the group's heads, -inf where invalid: an online log-sum-exp (as flash attention
        folds keys) with running max m (finite floor, so an all -inf position stays NaN-free) and
        sum s of exp(x - m). Shared by `_selection_scores_kernel` and select_fused's kernel, so
        both give the same bits."""
        m = tl.full([BLOCK_N], -1.0e30, dtype=tl.float32)
        s = tl.zeros([BLOCK_N], dtype=tl.float32)
        if INTERPRET:
            # Triton 3.6's interpreter cannot take a loaded scalar as a range() bound under NumPy 2
            # (see verify_attention); a while loop evaluates the same.
            r = r0
            while r < r_end:
                m, s = _fold_rows(r, m, s, offs_n, n_valid, grp, logits_ptr, lse_ptr,
                                  s_lr, s_lh, s_ln, s_er, s_eh, PER_GROUP)
                r += 1
        else:
            for r in range(r0, r_end):
                m, s = _fold_rows(r, m, s, offs_n, n_valid, grp, logits_ptr, lse_ptr,
                                  s_lr, s_lh, s_ln, s_er, s_eh, PER_GROUP)
        score = m + tl.log(s) - tl.log((nr * PER_GROUP).to(tl.float32))
        return tl.where(n_valid & (s > 0), score, float("-inf"))

    # Sizes and output strides change with every step's longest prefix: not specialised on, or an
    # eager step would recompile the kernel whenever one turns divisible by 16.
    @triton.jit(do_not_specialize=["batch", "s_ol", "s_ob", "s_og", "n_keys"])
    def _selection_scores_kernel(
            logits_ptr, lse_ptr, out_ptr, start_ptr, count_ptr, bases_ptr, batch,
            s_ll, s_lr, s_lh, s_ln, s_el, s_er, s_eh, s_ol, s_ob, s_og, s_on, n_keys,
            PER_GROUP: tl.constexpr, BLOCK_N: tl.constexpr, PACK: tl.constexpr,
            INTERPRET: tl.constexpr):
        """One program = one (layer, request) x one group x BLOCK_N positions; loops over the
        request's rows and, within a row, the group's heads, each a contiguous BLOCK_N load.
        Every layer of a model step in one launch. PACK 0 writes the float scores; 1 int64
        top-k keys (order-preserving score bits, then the reversed position: distinct keys for
        torch.topk); 2 only the order-preserving int32 score bits, for `_radix_topk_kernel`."""
        layer = tl.program_id(0) // batch
        req = tl.program_id(0) % batch
        grp = tl.program_id(1)
        tile = tl.program_id(2)
        r0 = tl.load(start_ptr + req)
        nr = tl.load(count_ptr + req)
        base = tl.load(bases_ptr + req)
        logits_ptr += layer.to(tl.int64) * s_ll
        lse_ptr += layer.to(tl.int64) * s_el

        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_valid = (offs_n < base) & (offs_n < n_keys)
        # A tile wholly at or past the base reads nothing: its rows loop is empty.
        r_end = tl.where(tile * BLOCK_N < base, r0 + nr, r0)
        score = _row_scores(r0, r_end, nr, offs_n, n_valid, grp, logits_ptr, lse_ptr,
                            s_lr, s_lh, s_ln, s_er, s_eh, PER_GROUP, BLOCK_N, INTERPRET)
        dst = (out_ptr + layer.to(tl.int64) * s_ol + req.to(tl.int64) * s_ob + grp * s_og
               + offs_n.to(tl.int64) * s_on)
        if PACK != 0:
            # The float's bits made order-preserving as a signed int; for PACK 1 the position
            # (reversed: ties go to the lower one) in the low half: every key is distinct.
            bits = score.to(tl.int32, bitcast=True)
            key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
            if PACK == 1:
                key = (key.to(tl.int64) << 32) | (0x7FFFFFFF - offs_n).to(tl.int64)
            tl.store(dst, key, mask=offs_n < n_keys)
        else:
            tl.store(dst, score, mask=offs_n < n_keys)

    @triton.jit
    def _quest_page_scores_kernel(
            q_ptr, kmin_ptr, kmax_ptr, tables_ptr, npages_ptr, out_ptr,
            s_qb, s_qh, s_qd, s_nb, s_nh, s_nd, s_xb, s_xh, s_xd, s_tb, s_ob, s_og, s_op,
            p_max,
            KV_PER_GROUP: tl.constexpr, GQA: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
        """One program = one request x one group x BLOCK_P pages: gathers each KV head's page
        bounds through the block table once, then adds the bound of every query head reading it."""
        req = tl.program_id(0)
        grp = tl.program_id(1)
        tile = tl.program_id(2)
        n_pages = tl.load(npages_ptr + req)

        offs_p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_d = tl.arange(0, BLOCK_D)
        p_valid = offs_p < n_pages
        d_valid = offs_d < HEAD_DIM
        blk = tl.load(tables_ptr + req.to(tl.int64) * s_tb + offs_p, mask=p_valid, other=0)
        blk = blk.to(tl.int64)
        mask = p_valid[:, None] & d_valid[None, :]

        acc = tl.zeros([BLOCK_P], dtype=tl.float32)
        for j in range(KV_PER_GROUP):
            kvh = grp * KV_PER_GROUP + j
            kmn = tl.load(kmin_ptr + blk[:, None] * s_nb + kvh * s_nh + offs_d[None, :] * s_nd,
                          mask=mask, other=0.0).to(tl.float32)
            kmx = tl.load(kmax_ptr + blk[:, None] * s_xb + kvh * s_xh + offs_d[None, :] * s_xd,
                          mask=mask, other=0.0).to(tl.float32)
            for i in range(GQA):
                head = kvh * GQA + i
                qv = tl.load(q_ptr + req.to(tl.int64) * s_qb + head * s_qh + offs_d * s_qd,
                             mask=d_valid, other=0.0).to(tl.float32)
                acc += tl.sum(tl.maximum(qv[None, :] * kmx, qv[None, :] * kmn), axis=1)

        acc = tl.where(p_valid, acc, float("-inf"))
        tl.store(out_ptr + req.to(tl.int64) * s_ob + grp * s_og + offs_p * s_op, acc,
                 mask=offs_p < p_max)


if triton is not None:

    @triton.jit
    def _chunk(key_ptr, c0, offs, n):
        """Keys [c0, c0 + BLOCK) as unsigned values in int64 (order kept), and their validity."""
        pos = c0 + offs
        valid = pos < n
        key = tl.load(key_ptr + pos, mask=valid, other=0)
        return key.to(tl.int64) + 2147483648, valid, pos

    @triton.jit
    def _digit_counts(key_ptr, n, prefix, SHIFT: tl.constexpr, BLOCK: tl.constexpr,
                      INTERPRET: tl.constexpr):
        """Histogram of digit (u >> SHIFT) & 255 over the keys whose bits above the digit equal
        prefix's."""
        offs = tl.arange(0, BLOCK)
        hist = tl.zeros([256], dtype=tl.int32)
        if INTERPRET:   # while loops: see verify_attention on range() bounds in the interpreter
            c0 = 0
            while c0 < n:
                u, valid, _ = _chunk(key_ptr, c0, offs, n)
                cand = valid & ((u >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
                hist += tl.histogram(((u >> SHIFT) & 255).to(tl.int32), 256, mask=cand)
                c0 += BLOCK
        else:
            for c0 in range(0, n, BLOCK):
                u, valid, _ = _chunk(key_ptr, c0, offs, n)
                cand = valid & ((u >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
                hist += tl.histogram(((u >> SHIFT) & 255).to(tl.int32), 256, mask=cand)
        return hist

    @triton.jit
    def _radix_step(key_ptr, n, prefix, remaining, SHIFT: tl.constexpr, BLOCK: tl.constexpr,
                    INTERPRET: tl.constexpr):
        """One 8-bit digit of the remaining-th largest key among those matching prefix: the
        largest digit whose count at or above it still reaches `remaining`."""
        hist = _digit_counts(key_ptr, n, prefix, SHIFT, BLOCK, INTERPRET)
        bins = tl.arange(0, 256)
        at_or_above = tl.sum(hist) - tl.cumsum(hist, 0) + hist
        digit = tl.max(tl.where(at_or_above >= remaining, bins, 0), axis=0)
        above = tl.sum(tl.where(bins > digit, hist, 0), axis=0)
        return prefix | (digit.to(tl.int64) << SHIFT), remaining - above

    @triton.jit
    def _emit(key_ptr, dst_ptr, s_ok, c0, offs, n, thresh, remaining, taken, ties):
        """Positions of chunk c0 in the top set, stored in position order after `taken`: keys
        above the threshold, and keys equal to it while fewer than `remaining` came before."""
        u, valid, pos = _chunk(key_ptr, c0, offs, n)
        eq = (valid & (u == thresh)).to(tl.int32)
        tie_rank = ties + tl.cumsum(eq, 0) - eq
        take = ((valid & (u > thresh)) | ((eq != 0) & (tie_rank < remaining))).to(tl.int32)
        slot = taken + tl.cumsum(take, 0) - take
        tl.store(dst_ptr + slot.to(tl.int64) * s_ok, pos, mask=take != 0)
        return taken + tl.sum(take, axis=0), ties + tl.sum(eq, axis=0)

    # Sizes and strides change with every step's longest prefix and budget: not specialised on,
    # or a step would recompile the kernel whenever one turns divisible by 16 (a compile inside
    # a timed SpecExtend run cost it 37 ms a step on the H200).
    @triton.jit(do_not_specialize=["batch", "n", "k_max", "s_kr", "s_kg", "s_or", "s_og"])
    def _radix_topk_kernel(key_ptr, budget_ptr, out_ptr, batch, n, k_max,
                           s_kr, s_kg, s_or, s_og, s_ok,
                           BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
        """One program = one (row, group): the top budget positions of its n keys (int32,
        order-preserving; ties to the lower position), written ascending, then 0 up to k_max.
        A radix select, 8 bits a pass over the keys (the threshold key and how many of its
        ties to take), then one pass that emits the chosen positions in order."""
        row = tl.program_id(0)
        grp = tl.program_id(1)
        k = tl.load(budget_ptr + row % batch).to(tl.int32)
        key_ptr += row.to(tl.int64) * s_kr + grp.to(tl.int64) * s_kg
        dst_ptr = out_ptr + row.to(tl.int64) * s_or + grp.to(tl.int64) * s_og
        prefix = tl.zeros([], dtype=tl.int64)
        remaining = k
        prefix, remaining = _radix_step(key_ptr, n, prefix, remaining, 24, BLOCK, INTERPRET)
        prefix, remaining = _radix_step(key_ptr, n, prefix, remaining, 16, BLOCK, INTERPRET)
        prefix, remaining = _radix_step(key_ptr, n, prefix, remaining, 8, BLOCK, INTERPRET)
        prefix, remaining = _radix_step(key_ptr, n, prefix, remaining, 0, BLOCK, INTERPRET)
        offs = tl.arange(0, BLOCK)
        taken = tl.zeros([], dtype=tl.int32)
        ties = tl.zeros([], dtype=tl.int32)
        if INTERPRET:
            c0 = 0
            while c0 < n:
                taken, ties = _emit(key_ptr, dst_ptr, s_ok, c0, offs, n, prefix, remaining,
                                    taken, ties)
                c0 += BLOCK
            c0 = k
            while c0 < k_max:
                tl.store(dst_ptr + (c0 + offs) * s_ok, 0, mask=c0 + offs < k_max)
                c0 += BLOCK
        else:
            for c0 in range(0, n, BLOCK):
                taken, ties = _emit(key_ptr, dst_ptr, s_ok, c0, offs, n, prefix, remaining,
                                    taken, ties)
            for c0 in range(k, k_max, BLOCK):
                tl.store(dst_ptr + (c0 + offs) * s_ok, 0, mask=c0 + offs < k_max)


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


def selection_scores(logits, lse, row_start, row_count, bases, kv_heads: int, granularity: str,
                     block_n: int = 1024, packed: bool | str = False, num_warps: int = 4):
    """Triton version of ``selection_scores_reference`` (see the module docstring). Also takes
    every layer at once: ``logits [L, R, H, N]`` and ``lse [L, R, H]`` give ``[L, B, G, N]`` in one
    launch (the same requests and rows in every layer). Grid: (layer x request, group,
    ``block_n``-position tiles), each program walking rows x heads with one contiguous load each.
    (Loading a [heads, 64 or 256] tile per row and reducing over its heads ran at 0.2-0.4 TB/s on
    the H200: bench/results/logs/profile-2026-12-01-h200-vegas.txt, kernels-2026-12-01-h200-run1.json.)
    ``packed``: False returns the float scores; True int64 (score bits, reversed position) keys;
    ``"bits"`` the int32 order-preserving score bits (larger score, larger int). ``block_n`` and
    ``num_warps``: the launch (any gives the same bits; the engine's is `SCORE_LAUNCH`)."""
    if triton is None:
        raise RuntimeError("selection_scores needs Triton; use selection_scores_reference")
    single = logits.dim() == 3
    if single:
        logits, lse = logits[None], lse[None]
    layers, rows, heads, n = logits.shape
    groups, per_group = _groups(granularity, heads, kv_heads)
    batch = row_start.shape[0]
    pack = 2 if packed == "bits" else int(bool(packed))
    out = torch.empty(layers, batch, groups, n, dtype=(torch.float32, torch.int64, torch.int32)[pack],
                      device=logits.device)
    if batch and n and layers:
        _selection_scores_kernel[(layers * batch, groups, triton.cdiv(n, block_n))](
            logits, lse, out, row_start, row_count, bases, batch,
            *logits.stride(), *lse.stride(), *out.stride(), n,
            PER_GROUP=per_group, BLOCK_N=block_n, PACK=pack, INTERPRET=_interpreting(),
            num_warps=num_warps)
    return out[0] if single else out


def topk_positions(score, budgets, k_max: int | None = None):
    """Top ``budgets[b]`` positions of each ``[b, g]`` row, sorted ascending, padded with 0 to
    ``max(budgets)`` (see the module docstring). One topk and one sort for the whole batch.
    ``k_max``: ``max(budgets)`` when the caller knows it, saving a device-to-host read."""
    budgets = _as_int_tensor(budgets, score.device)
    if k_max is None:
        k_max = int(budgets.max()) if score.shape[0] else 0
    return _topk_sorted(score, budgets, k_max), budgets.to(torch.int32)


def _topk_sorted(score, budgets, k_max: int):
    """``topk_positions``'s positions, with ``k_max = max(budgets)`` already on the host."""
    batch, groups, n = score.shape
    if k_max > n:
        raise ValueError(f"a budget of {k_max} exceeds the {n} scored positions")
    if k_max == 0:
        return torch.zeros(batch, groups, 0, dtype=torch.int32, device=score.device)
    idx = torch.topk(score, k_max, dim=-1, sorted=True).indices                # best first
    keep = torch.arange(k_max, device=score.device)[None, None, :] < budgets[:, None, None]
    idx = torch.sort(torch.where(keep, idx, n), dim=-1).values                 # padding (n) last
    return torch.where(keep, idx, 0).to(torch.int32)


# ------------------------------------------------------------------------------------------------
# Quest: page bounds beside the pool, page scores, page -> position expansion
# ------------------------------------------------------------------------------------------------

def update_page_bounds(k_cache, kmin, kmax, blocks) -> None:
    """In place: ``kmin[blk], kmax[blk]`` = element-wise min / max over physical block ``blk``'s
    entries, for every ``blk`` in ``blocks`` (see the module docstring). Leading dimensions (e.g.
    all layers, ``k_cache [L, num_blocks, ...]`` with ``kmin [L, num_blocks, KVH, d]``) are
    handled in the same few calls."""
    blocks = torch.as_tensor(blocks, device=k_cache.device).long()
    if blocks.numel() == 0:
        return
    dim = k_cache.dim() - 4                                                    # the block axis
    keys = k_cache.index_select(dim, blocks)                                   # [..., n, bs, KVH, d]
    kmin.index_copy_(dim, blocks, keys.amin(dim + 1).to(kmin.dtype))
    kmax.index_copy_(dim, blocks, keys.amax(dim + 1).to(kmax.dtype))


def quest_page_scores_reference(q, kmin, kmax, block_tables, num_pages, granularity: str):
    """Plain PyTorch, batched (see the module docstring); float32 maths as in ``quest_scores``."""
    batch, heads, dim = q.shape
    kv_heads = kmin.shape[1]
    groups, _ = _groups(granularity, heads, kv_heads)
    gqa = heads // kv_heads
    device = q.device
    num_pages = _as_int_tensor(num_pages, device)
    p_max = int(num_pages.max()) if batch else 0
    if p_max == 0:
        return torch.empty(batch, groups, 0, dtype=torch.float32, device=device)
    valid = torch.arange(p_max, device=device)[None, :] < num_pages[:, None]  # [B, P]
    blk = torch.where(valid, block_tables[:, :p_max].long(), 0)
    mn, mx = kmin[blk].float(), kmax[blk].float()                              # [B, P, KVH, d]
    qf = q.float().view(batch, 1, kv_heads, gqa, dim)
    bound = torch.maximum(qf * mx[:, :, :, None, :], qf * mn[:, :, :, None, :]).sum(-1)
    if groups == 1:                                                            # [B, P, KVH, GQA]
        agg = bound.reshape(batch, p_max, heads).sum(-1)[:, None, :]
    else:
        agg = bound.sum(-1).transpose(1, 2)                                    # [B, KVH, P]
    return torch.where(valid[:, None, :], agg, float("-inf"))


def quest_page_scores(q, kmin, kmax, block_tables, num_pages, granularity: str,
                      block_p: int = 16, p_max: int | None = None):
    """Triton version of ``quest_page_scores_reference`` (see the module docstring). Grid:
    (request, group, ``block_p``-page tiles). ``p_max``: ``max(num_pages)`` when the caller knows
    it (no device-to-host read)."""
    if triton is None:
        raise RuntimeError("quest_page_scores needs Triton; use quest_page_scores_reference")
    batch, heads, dim = q.shape
    kv_heads = kmin.shape[1]
    groups, _ = _groups(granularity, heads, kv_heads)
    if p_max is None:
        p_max = int(num_pages.max()) if batch else 0
    out = torch.empty(batch, groups, p_max, dtype=torch.float32, device=q.device)
    if p_max == 0:
        return out
    _quest_page_scores_kernel[(batch, groups, triton.cdiv(p_max, block_p))](
        q, kmin, kmax, block_tables, num_pages, out,
        *q.stride(), *kmin.stride(), *kmax.stride(), block_tables.stride(0), *out.stride(),
        p_max,
        KV_PER_GROUP=kv_heads // groups, GQA=heads // kv_heads, HEAD_DIM=dim,
        BLOCK_P=block_p, BLOCK_D=max(16, triton.next_power_of_2(dim)))
    return out


def _quest_counts(num_pages, bases, budgets, page_size: int):
    """Per request (int64 tensors): the pages Quest keeps and the positions it attends below the
    base (those pages plus the partial tail)."""
    n_sel = torch.minimum(num_pages, ((budgets + page_size - 1) // page_size).clamp(min=1))
    return n_sel, n_sel * page_size + (bases - num_pages * page_size)


def quest_positions_reference(page_scores, num_pages, bases, budgets, page_size: int,
                              sizes: tuple[int, int] | None = None):
    """Top pages expanded to positions plus the always-kept partial tail, batched, in torch (see
    the module docstring). ``sizes``: ``(max(counts), max(selected pages))`` when the caller knows
    them (see `quest_sizes`), saving the one device-to-host read."""
    batch, groups, p_max = page_scores.shape
    device = page_scores.device
    num_pages = _as_int_tensor(num_pages, device)
    bases = _as_int_tensor(bases, device)
    budgets = _as_int_tensor(budgets, device)
    n_sel, counts = _quest_counts(num_pages, bases, budgets, page_size)
    tail_start = num_pages * page_size
    n_top = n_sel * page_size                                                  # [B]
    if sizes is not None:
        k, s_max = sizes
    else:
        k, s_max = torch.stack([counts.max(), n_sel.max()]).tolist() if batch else (0, 0)  # one sync
    if k == 0:
        return (torch.zeros(batch, groups, 0, dtype=torch.int32, device=device),
                counts.to(torch.int32))
    j = torch.arange(k, device=device)[None, None, :]                          # [1, 1, K]
    if s_max > 0:
        pages = _topk_sorted(page_scores, n_sel, s_max)                       # [B, G, s_max]
        offs = torch.arange(page_size, device=device, dtype=torch.int32)
        pos = (pages[..., None] * page_size + offs).flatten(2)                 # ascending
        top = pos.gather(2, j.clamp(max=pos.shape[-1] - 1).expand(batch, groups, k))
    else:
        top = torch.zeros(batch, groups, k, dtype=torch.int32, device=device)
    tail = tail_start[:, None, None] + (j - n_top[:, None, None])
    out = torch.where(j < n_top[:, None, None], top.long(), tail)
    out = torch.where(j < counts[:, None, None], out, 0)
    return out.to(torch.int32), counts.to(torch.int32)


def quest_positions(page_scores, num_pages, bases, budgets, page_size: int,
                    sizes: tuple[int, int] | None = None):
    """Triton version of ``quest_positions_reference``: one program per (request, group) ranks
    its pages in registers (a sort of packed (score, page) keys), sorts the chosen ones by page and
    writes the positions, instead of some twenty small torch ops (82 us per call at batch 64 x 8K
    on the H200, x 30 layers x every draft step: bench/results/kernels-2026-12-01-h200.json).
    Ties go to the lower page. CUDA-graph safe when ``sizes`` is given."""
    if triton is None:
        raise RuntimeError("quest_positions needs Triton; use quest_positions_reference")
    batch, groups, p_max = page_scores.shape
    device = page_scores.device
    num_pages, bases, budgets = (_as_int_tensor(x, device) for x in (num_pages, bases, budgets))
    if sizes is None:
        counts = _quest_counts(num_pages, bases, budgets, page_size)[1]
        sizes = (int(counts.max()) if batch else 0, 0)               # one sync
    k = sizes[0]
    out = torch.empty(batch, groups, k, dtype=torch.int32, device=device)
    counts = torch.empty(batch, dtype=torch.int32, device=device)
    if batch == 0:
        return out, counts
    block_p = max(16, triton.next_power_of_2(max(p_max, 1)))
    scratch = torch.empty(batch, groups, block_p, dtype=torch.int32, device=device)
    _quest_positions_kernel[(batch, groups)](
        page_scores, num_pages, bases, budgets, out, counts, scratch,
        *page_scores.stride(), *out.stride(), p_max, k,
        PAGE=page_size, BLOCK_P=block_p, BLOCK_K=min(1024, max(16, triton.next_power_of_2(max(k, 1)))),
        INTERPRET=_interpreting())
    return out, counts


if triton is not None:

    @triton.jit
    def _quest_positions_kernel(
            scores_ptr, npages_ptr, bases_ptr, budgets_ptr, out_ptr, counts_ptr, scratch_ptr,
            s_sb, s_sg, s_sp, s_ob, s_og, s_ok, p_max, k_out,
            PAGE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
            INTERPRET: tl.constexpr):
        """One program = one (request, group): the n_sel best pages, then their positions in page
        order, then the partial tail [n_pages * PAGE, base), then 0 up to k_out."""
        req = tl.program_id(0)
        grp = tl.program_id(1)
        n_pages = tl.load(npages_ptr + req).to(tl.int32)
        base = tl.load(bases_ptr + req).to(tl.int32)
        budget = tl.load(budgets_ptr + req).to(tl.int32)
        n_sel = tl.where(n_pages > 0, tl.minimum(n_pages, tl.maximum(1, (budget + PAGE - 1) // PAGE)), 0)
        offs_p = tl.arange(0, BLOCK_P)
        sc = tl.load(scores_ptr + req.to(tl.int64) * s_sb + grp * s_sg + offs_p * s_sp,
                     mask=offs_p < tl.minimum(n_pages, p_max), other=float("-inf"))
        # Rank: float bits made order-preserving as an int, the page (reversed, so ties go to the
        # lower page) in the low half; one descending sort. (`sort_rows` is tl.sort compiled, a
        # faster network under the interpreter. One (request, group) a program: run 35 measured
        # a row-blocked, 2-D version with the network compiled too 14 us a call slower.)
        bits = sc.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
        ranked = sort_rows((key << 32) | (BLOCK_P - 1 - offs_p).to(tl.int64), 1, INTERPRET)
        page = BLOCK_P - 1 - (ranked & 0xFFFFFFFF).to(tl.int32)         # page of rank i
        chosen = sort_rows(tl.where(offs_p < n_sel, page, 2 * BLOCK_P), 0, INTERPRET)
        row = req.to(tl.int64) * (tl.num_programs(1) * BLOCK_P) + grp * BLOCK_P
        tl.store(scratch_ptr + row + offs_p, chosen)
        tl.debug_barrier()               # the chosen pages, read back by position below
        n_top = n_sel * PAGE
        count = n_top + (base - n_pages * PAGE)
        dst = out_ptr + req.to(tl.int64) * s_ob + grp * s_og
        if INTERPRET:
            k0 = 0
            while k0 < k_out:
                _quest_write(k0, dst, s_ok, scratch_ptr + row, n_top, count, n_pages, k_out, PAGE, BLOCK_K)
                k0 += BLOCK_K
        else:
            for k0 in range(0, k_out, BLOCK_K):
                _quest_write(k0, dst, s_ok, scratch_ptr + row, n_top, count, n_pages, k_out, PAGE, BLOCK_K)
        if grp == 0:
            tl.store(counts_ptr + req, count)

    @triton.jit
    def _quest_write(k0, dst, s_ok, chosen_ptr, n_top, count, n_pages, k_out,
                     PAGE: tl.constexpr, BLOCK_K: tl.constexpr):
        j = k0 + tl.arange(0, BLOCK_K)
        pg = tl.load(chosen_ptr + j // PAGE, mask=j < n_top, other=0)
        val = tl.where(j < n_top, pg * PAGE + j % PAGE,
                       tl.where(j < count, n_pages * PAGE + (j - n_top), 0))
        tl.store(dst + j * s_ok, val, mask=j < k_out)


def quest_sizes(num_pages: list[int], bases: list[int], budgets: list[int], page_size: int):
    """``quest_positions``'s output sizes from host-side lists: (max count, max selected pages)."""
    n_sel = [min(p, max(1, -(-b // page_size))) for p, b in zip(num_pages, budgets)]
    counts = [n * page_size + (base - p * page_size) for n, p, base in zip(n_sel, num_pages, bases)]
    return max(counts, default=0), max(n_sel, default=0)


def select_layers(collected, row_start, row_count, bases, budgets, k_max: int, kv_heads: int,
                  granularity: str, n_keys: int | None = None, fused: bool | None = None):
    """A whole model step's selection. ``collected`` is ``(logits [L, R, H, W], lse [L, R, H])``
    (`LogitCollector.stacked`), or a list of one ``(logits [R, H, W], lse [R, H])`` pair per
    layer; only positions below ``n_keys`` (default W; at least ``max(bases)``) are scored.
    Returns int32 ``[L, B, G, k_max]``, per (layer, request, group) the top ``budgets[b]``
    positions ascending (padding 0). One scoring launch and one top-k for every layer, so the
    per-call cost is paid once per step, not once per layer.

    ``fused``: score and select in one launch (`kernels.select_fused`, rows of up to its
    ``MAX_KEYS`` positions, the same positions); None (the engine's) takes it whenever the rows
    fit and ``FUSED_SELECT`` is on, False forces the two launches below, True insists."""
    if isinstance(collected, list):
        collected = (torch.stack([lg for lg, _ in collected]), torch.stack([ls for _, ls in collected]))
    logits, lse = collected
    if n_keys is not None:
        logits = logits[..., :n_keys]
    if fused is None:
        fused = FUSED_SELECT
    if fused:
        # Only when asked for: acc07f4 deleted kernels/select_fused.py, and importing it
        # unconditionally broke every kernel-path selection.
        from vegas_core.kernels import select_fused
        if logits.shape[-1] > select_fused.MAX_KEYS:
            raise ValueError(f"fused selection takes rows of up to {select_fused.MAX_KEYS} keys")
        return select_fused.select_fused(logits, lse, row_start, row_count, bases, budgets, k_max,
                                         kv_heads, granularity)
    # Top-k by a radix select over int32 score bits, ties to the lower position: a greedy 135M
    # model loops, its repeated keys give exactly equal scores, and ties sent torch.topk's radix
    # select into a path 10x slower (20 ms a step for SpecExtend,
    # bench/results/e2e-2026-12-01-h200-run2.json). torch.topk over int64 (score, position) keys
    # fixed that, and then cost more than the scoring: its 64-bit radix passes, the sort of the
    # chosen positions, the padding (`_radix_topk_kernel` does all three in one launch).
    block_n, warps = SCORE_LAUNCH
    scores = selection_scores(logits, lse, row_start, row_count, bases, kv_heads, granularity,
                              block_n=block_n, packed="bits", num_warps=warps)
    layers, batch, groups, n = scores.shape                                     # [L, B, G, N]
    block, warps = TOPK_LAUNCH
    pos = radix_topk(scores.view(layers * batch, groups, n), budgets, k_max, block=block,
                     num_warps=warps)
    return pos.view(layers, batch, groups, k_max)


def radix_topk(keys: torch.Tensor, budgets, k_max: int, block: int = 1024,
               num_warps: int = 4) -> torch.Tensor:
    """Triton: per ``[r, g]`` row of int32 order-preserving score bits ``keys [R, G, N]``
    (`selection_scores(..., packed="bits")`), the top ``budgets[r % B]`` positions (``budgets``
    int ``[B]``, ``R`` a multiple of ``B``: rows are layer-major), larger keys first and ties to
    the lower position, written ascending and padded with 0 to ``k_max >= max(budgets)``: int32
    ``[R, G, k_max]``. The same as `topk_positions` over the keys with the position packed in
    (tests/kernels/test_select.py). ``block`` (keys per chunk) and ``num_warps``: the launch (the
    same positions with any; the engine's is `TOPK_LAUNCH`)."""
    if triton is None:
        raise RuntimeError("radix_topk needs Triton")
    rows, groups, n = keys.shape
    if keys.dtype != torch.int32 or keys.stride(2) != 1:
        raise ValueError("keys must be int32 with contiguous positions")
    if k_max > n:
        raise ValueError(f"a budget of {k_max} exceeds the {n} scored positions")
    budgets = _as_int_tensor(budgets, keys.device)
    pos = torch.empty(rows, groups, k_max, dtype=torch.int32, device=keys.device)
    if k_max and rows:
        _radix_topk_kernel[(rows, groups)](
            keys, budgets, pos, budgets.shape[0], n, k_max, keys.stride(0), keys.stride(1),
            *pos.stride(), BLOCK=block, INTERPRET=_interpreting(), num_warps=num_warps)
    return pos
