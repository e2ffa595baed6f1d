"""Token-gather sparse attention for draft steps over the paged KV pool (issue 4, kernel 2), in Triton
beside a plain PyTorch reference with the same signature. Same maths as
``vegas_core.attention.reference.ReferenceBackend._sparse``, for a whole batch at once.

Contract (both functions):
- ``q`` ``[B, H, d]``: one draft query row per request (the token at position
  ``context_lens[b] - 1``, whose K/V is already in the pool).
- ``k_cache, v_cache`` ``[num_blocks, block_size, KVH, d]``: one layer of
  ``vegas_core.kv_cache.KVPool``; logical position ``p`` of request ``b`` lives in page
  ``block_tables[b, p // block_size]`` at offset ``p % block_size`` (tables int32
  ``[B, max_blocks]``, padded).
- ``context_lens`` int32 ``[B]``.
- ``indices`` int32 ``[B, G, K]``: logical positions of the selected prefix entries, with ``G = 1``
  (one set shared by all KV heads) or ``G = KVH`` (set ``g`` is read by KV head ``g`` and its query
  heads). Only the first ``index_counts[b]`` entries (int32 ``[B]``; 0 = empty selection, up to
  ``K``) of every group of request ``b`` are read; the rest is padding with arbitrary values and is
  never dereferenced. Order within a set is arbitrary. Every selected position is
  ``< tail_start[b]``.
- ``tail_start`` int32 ``[B]``: positions ``[tail_start[b], context_lens[b])`` (the entries written
  since the last verification, the query's own included) are attended by every group as well.
- Grouped-query: query head ``h`` reads KV head ``h // (H // KVH)``.
- ``window`` (0: none): a sliding-window layer (Gemma 3's local layers), which drafts with the
  target's own attention: the selection is not read (``indices``, ``index_counts`` and
  ``tail_start`` may be None) and the request attends positions ``[max(0, ctx - window), ctx)``,
  the query's window (keys ``> p - window`` for the query at ``p = ctx - 1``), computed on the
  device from ``context_lens``.

Returns ``out`` ``[B, H, d]`` in ``q``'s dtype: softmax of ``scale * q.k`` over the selected and
tail keys, times their values (no other mask). A request whose attended set is empty (count 0 and
``tail_start == context_lens``, which the engine never produces) gets zeros from both functions.

Triton design: one program per (request, KV head, split) takes all ``GROUP = H // KVH`` query heads
of that KV head as the rows of one tile (padded to >= 16 rows for ``tl.dot``), so every gathered K/V
row (``d`` contiguous elements) is read once per KV head. The program walks the virtual key list
"selected entries, then tail positions" in ``BLOCK_N`` tiles: the position of entry ``j`` is
``indices[b, g, j]`` for ``j < count`` and ``tail_start + j - count`` after; the page comes from the
block table; online softmax in float32. With ``num_splits > 1`` the virtual list is cut into
``num_splits`` BLOCK_N-aligned chunks handled by separate programs (more programs in flight for
small batches, as decode is bandwidth-bound) and a second small kernel merges their partial
(max, sum, accumulator) states. ``num_splits=None`` picks one from the GPU's SM count and the
shapes only (no host sync, CUDA-graph safe); on CPU / under the interpreter it is 1.

Packed (``G = 1``, the KV heads sharing one selection, and at most ``MAX_PACKED_HEADS`` query heads):
one program per (request, split) instead of per (request, KV head, split). Each entry's index, page
and offset are then resolved once for all KV heads, the K/V rows of the KV heads at a slot (adjacent
in the pool) are gathered together, and the softmax runs once over a tile whose rows are all the
query heads (at SmolLM2's 9 / 3, 9 real rows of 16 instead of 3 of 16 in each of three programs).

Committed measurements: `sparse_attention` records of `bench/results/kernels-2026-11-30-h200*.json`
(`python -m vegas_core.bench kernels`). Where it is still slow: few, long, latency-bound gather
chains per program at small batch (more splits help until about one wave of programs) and d = 64
rows of only 128 bytes.
"""
from __future__ import annotations

import torch

try:  # Triton is optional: the CPU engine path only needs the reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

from .pdl import launch_options

if triton is not None:
    from .pdl import pdl_wait


def sparse_attention_reference(q, k_cache, v_cache, block_tables, context_lens, indices,
                               index_counts, tail_start, scale: float, window: int = 0):
    """Plain PyTorch, one request and one KV head at a time, float32 maths (see the module
    docstring)."""
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    groups = 1 if window else indices.shape[1]
    k_flat = k_cache.reshape(-1, kv_heads, dim)
    v_flat = v_cache.reshape(-1, kv_heads, dim)
    out = torch.empty_like(q)
    for b in range(batch):
        ctx = int(context_lens[b])
        if window:     # the query's own window, no selection
            count, base = 0, max(0, ctx - window)
        else:
            count, base = int(index_counts[b]), int(tail_start[b])
        tail = torch.arange(base, ctx, device=q.device)
        for kvh in range(kv_heads):
            selected = indices[b, kvh if groups == kv_heads else 0, :count].long() if count \
                else torch.empty(0, dtype=torch.long, device=q.device)             # padding unread
            pos = torch.cat([selected, tail])                                     # [m]
            slots = block_tables[b].long()[pos // block_size] * block_size + pos % block_size
            keys = k_flat[slots, kvh].float()                                    # [m, d]
            values = v_flat[slots, kvh].float()
            hs = slice(kvh * group, (kvh + 1) * group)
            s = q[b, hs].float() @ keys.T * scale                                # [group, m]
            out[b, hs] = (torch.softmax(s, dim=-1) @ values).to(q.dtype)
    return out


if triton is not None:

    @triton.jit
    def _entry_slots(j0, idx_ptr, tables_ptr, req, set_off, count, base, end, s_ik, s_tb,
                     BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
        """Entries ``[j0, j0 + BLOCK_N)`` of the virtual list (the selected set at ``set_off``, then
        the tail), clipped to ``end``: which are real, and each one's (page, offset) in the pool."""
        j = j0 + tl.arange(0, BLOCK_N)
        n_valid = j < end
        is_sel = n_valid & (j < count)
        sel = tl.load(idx_ptr + set_off + j * s_ik, mask=is_sel, other=0)
        pos = tl.where(is_sel, sel, base + (j - count))
        pos = tl.where(n_valid, pos, 0)
        page = tl.load(tables_ptr + req * s_tb + pos // BLOCK_SIZE, mask=n_valid, other=0)
        return n_valid, page.to(tl.int64), pos % BLOCK_SIZE

    @triton.jit
    def _softmax_step(s, m_i, l_i):
        """Online softmax over one tile's scores: (new max, rescale of the old state, weights, sum)."""
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)

    @triton.jit
    def _sparse_tile(j0, q_tile, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr, req, kvh,
                     count, base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                     s_ib, s_ig, s_ik, s_tb, BLOCK_SIZE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                     PRECISION: tl.constexpr):
        """Entries ``[j0, j0 + BLOCK_N)`` of the virtual list (selected, then tail), clipped to
        ``end``: resolve positions, gather K/V through the block table, score, fold into the
        online-softmax state (m_i, l_i, acc)."""
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < HEAD_DIM
        n_valid, page, off = _entry_slots(j0, idx_ptr, tables_ptr, req, req * s_ib + kvh * s_ig,
                                          count, base, end, s_ik, s_tb, BLOCK_SIZE, BLOCK_N)
        base_k = page * s_kb + off * s_kt + kvh * s_kh
        base_v = page * s_vb + off * s_vt + kvh * s_vh
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k_tile = tl.load(k_ptr + base_k[:, None] + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        v_tile = tl.load(v_ptr + base_v[:, None] + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)

        s = tl.dot(q_tile, tl.trans(k_tile), input_precision=PRECISION) * scale
        s = tl.where(n_valid[None, :], s, float("-inf"))
        m_new, alpha, p, l_i = _softmax_step(s, m_i, l_i)
        acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _sparse_tile_packed(j0, q_tile, grp, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr,
                            req, count, base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt,
                            s_vh, s_vd, s_ib, s_ik, s_tb, BLOCK_SIZE: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                            KV_HEADS: tl.constexpr, PRECISION: tl.constexpr):
        """`_sparse_tile` for every KV head at once (one selection shared by the KV heads): the
        tile's rows are all the query heads (row ``m`` is head ``m``, of KV head ``grp[m]``). Each
        entry's index, page and offset are resolved once, and the K/V rows of all KV heads at that
        slot (adjacent in the pool) are gathered together. Scores come from one dot per KV head
        with the other heads' query rows zeroed, chained through the accumulator: a row gets its
        own head's products plus exact zeros, the scores `_sparse_tile` computes.

        The values go into a zeroed tile, added to the rescaled accumulator after: chaining the
        dots into the accumulator as `_sparse_tile` does (the compiler fuses `acc * alpha +
        dot(p, v)` into one dot) made drafting slower than one program per KV head, this way
        faster (bench/NOTES.md, sparse_attention._sparse_tile_packed). Compiled, that is not
        `_sparse_tile`'s bits, but equal to the reference within the tests' tolerance."""
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < HEAD_DIM
        n_valid, page, off = _entry_slots(j0, idx_ptr, tables_ptr, req, req * s_ib, count, base,
                                          end, s_ik, s_tb, BLOCK_SIZE, BLOCK_N)
        row_k = page * s_kb + off * s_kt
        row_v = page * s_vb + off * s_vt
        kv_mask = n_valid[:, None] & d_valid[None, :]
        zero_q = tl.zeros_like(q_tile)
        s = tl.zeros([q_tile.shape[0], BLOCK_N], dtype=tl.float32)
        for g in tl.static_range(KV_HEADS):
            k_g = tl.load(k_ptr + row_k[:, None] + g * s_kh + offs_d[None, :] * s_kd,
                          mask=kv_mask, other=0.0)
            q_g = tl.where((grp == g)[:, None], q_tile, zero_q)
            s = tl.dot(q_g, tl.trans(k_g), s, input_precision=PRECISION)
        s = s * scale
        s = tl.where(n_valid[None, :], s, float("-inf"))
        m_new, alpha, p, l_i = _softmax_step(s, m_i, l_i)
        p_lo = p.to(q_tile.dtype)
        zero_p = tl.zeros_like(p_lo)
        pv = tl.zeros([q_tile.shape[0], BLOCK_D], dtype=tl.float32)
        for g in tl.static_range(KV_HEADS):
            v_g = tl.load(v_ptr + row_v[:, None] + g * s_vh + offs_d[None, :] * s_vd,
                          mask=kv_mask, other=0.0)
            pv = tl.dot(tl.where((grp == g)[:, None], p_lo, zero_p), v_g, pv,
                        input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        return m_new, l_i, acc

    @triton.jit
    def _tile_step(j0, q_tile, grp, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr, req, kvh,
                   count, base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                   s_ib, s_ig, s_ik, s_tb, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, KV_HEADS: tl.constexpr,
                   PACKED: tl.constexpr, PRECISION: tl.constexpr):
        """One tile of entries, by the program's kind: all KV heads (PACKED) or one."""
        if PACKED:
            m_i, l_i, acc = _sparse_tile_packed(
                j0, q_tile, grp, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr, req, count,
                base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_ib, s_ik,
                s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, KV_HEADS, PRECISION)
        else:
            m_i, l_i, acc = _sparse_tile(
                j0, q_tile, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr, req, kvh,
                count, base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                s_ib, s_ig, s_ik, s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, PRECISION)
        return m_i, l_i, acc

    @triton.jit
    def _sparse_attention_kernel(
            q_ptr, k_ptr, v_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
            tables_ptr, ctx_ptr, idx_ptr, cnt_ptr, tail_ptr, scale, num_splits,
            s_qb, s_qh, s_qd,
            s_kb, s_kt, s_kh, s_kd,
            s_vb, s_vt, s_vh, s_vd,
            s_ob, s_oh, s_od,
            s_ib, s_ig, s_ik,
            s_tb,
            BLOCK_SIZE: tl.constexpr,
            GROUP: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            SPLIT: tl.constexpr, PACKED: tl.constexpr,
            PRECISION: tl.constexpr, INTERPRET: tl.constexpr, USE_PDL: tl.constexpr,
            WINDOW: tl.constexpr = 0):
        """One program = one request x one KV head x one split: the GROUP query heads of the KV head
        are the rows of the BLOCK_M tile; PACKED (one selection for every KV head): one request x one
        split, all query heads in the tile (`_sparse_tile_packed`), grid axis 1 of size 1. Without
        SPLIT (num_splits == 1) it writes ``out``; with it, the unnormalised accumulator and
        (max, sum) of its chunk go to the partial buffers (``part_acc [B, H, S, BLOCK_D]``,
        ``part_ml [B, H, S, 2]``, contiguous float32), which `_merge_splits_kernel` then merges.
        num_splits is a runtime value so that
        batch-size-dependent choices do not recompile."""
        pdl_wait(USE_PDL)
        req = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        ctx = tl.load(ctx_ptr + req)
        if WINDOW > 0:   # a sliding-window layer: the query's own window, as a tail only
            count = 0
            base = tl.maximum(ctx - WINDOW, 0)
        else:
            count = tl.load(cnt_ptr + req)
            base = tl.load(tail_ptr + req)
        total = count + (ctx - base)                     # length of the virtual key list

        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        if PACKED:
            head = offs_m
            m_valid = offs_m < GROUP * KV_HEADS
        else:
            head = kvh * GROUP + offs_m
            m_valid = offs_m < GROUP
        grp = head // GROUP
        d_valid = offs_d < HEAD_DIM
        q_tile = tl.load(q_ptr + req * s_qb + head[:, None] * s_qh + offs_d[None, :] * s_qd,
                         mask=m_valid[:, None] & d_valid[None, :], other=0.0)

        if SPLIT:  # BLOCK_N-aligned chunks; trailing splits may be empty
            chunk = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
            start = split * chunk
            end = tl.minimum(start + chunk, total)
        else:
            start = 0
            end = total

        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)          # finite: empty rows stay NaN-free
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if INTERPRET:
            # Triton 3.6's interpreter cannot take a loaded scalar as a range() bound under NumPy 2
            # (its __index__ calls int() on a 1-element array); a while loop evaluates the same.
            j0 = start
            while j0 < end:
                m_i, l_i, acc = _tile_step(
                    j0, q_tile, grp, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr, req, kvh,
                    count, base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                    s_ib, s_ig, s_ik, s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, KV_HEADS,
                    PACKED, PRECISION)
                j0 += BLOCK_N
        else:
            for j0 in range(start, end, BLOCK_N):
                m_i, l_i, acc = _tile_step(
                    j0, q_tile, grp, m_i, l_i, acc, k_ptr, v_ptr, idx_ptr, tables_ptr, req, kvh,
                    count, base, end, scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd,
                    s_ib, s_ig, s_ik, s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, KV_HEADS,
                    PACKED, PRECISION)

        if not SPLIT:
            l_safe = tl.where(l_i > 0, l_i, 1.0)
            o = acc / l_safe[:, None]
            tl.store(out_ptr + req * s_ob + head[:, None] * s_oh + offs_d[None, :] * s_od,
                     o.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
        else:
            row = (req * (GROUP * KV_HEADS) + head).to(tl.int64) * num_splits + split
            tl.store(part_acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :], acc,
                     mask=m_valid[:, None])
            tl.store(part_ml_ptr + row * 2, m_i, mask=m_valid)
            tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=m_valid)

    @triton.jit
    def _merge_splits_kernel(part_acc_ptr, part_ml_ptr, out_ptr, s_ob, s_oh, s_od, heads,
                             num_splits, SPLITS_PAD: tl.constexpr,
                             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
        """One program = one (request, query head): combine the num_splits partial states."""
        pdl_wait(USE_PDL)
        req = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, SPLITS_PAD)
        offs_d = tl.arange(0, BLOCK_D)
        s_valid = offs_s < num_splits
        row = (req * heads + head).to(tl.int64) * num_splits + offs_s
        m_s = tl.load(part_ml_ptr + row * 2, mask=s_valid, other=-1.0e30)
        l_s = tl.load(part_ml_ptr + row * 2 + 1, mask=s_valid, other=0.0)
        acc_s = tl.load(part_acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :],
                        mask=s_valid[:, None], other=0.0)
        m = tl.max(m_s, axis=0)
        w = tl.exp(m_s - m)                              # empty splits have l_s = 0, acc_s = 0
        l_tot = tl.sum(l_s * w, axis=0)
        o = tl.sum(acc_s * w[:, None], axis=0)
        o = o / tl.where(l_tot > 0, l_tot, 1.0)
        tl.store(out_ptr + req * s_ob + head * s_oh + offs_d * s_od,
                 o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


# One program for all the KV heads of a request when they share one selection (`_sparse_tile_packed`)
# and the query heads fit a tile of at most MAX_PACKED_HEADS rows.
MAX_PACKED_HEADS = 16
# Each split keeps at least this many tiles of the index capacity (`_auto_splits`).
MIN_TILES_PER_SPLIT = 2
# Splits per (request, KV head) in the batch-invariant mode (`KernelOptions.deterministic`), where
# the count must not follow the batch: a request's list is cut by its own length alone. Four is
# `_auto_splits`' choice at batch 64 with one program per KV head (SmolLM2, an H200).
INVARIANT_SPLITS = 4


def packs_kv_heads(heads: int, kv_heads: int, groups: int) -> bool:
    """Whether `sparse_attention` takes every KV head of a request in one program."""
    return groups == 1 and 1 < kv_heads and heads <= MAX_PACKED_HEADS


def _auto_splits(q, batch: int, kv_heads: int, max_selected: int, block_n: int) -> int:
    """Splits per (request, KV head), or per request when packed (``kv_heads`` 1 then): fill
    about one wave of resident programs (~4 per SM at d = 128, ~6 at d <= 64, from a split sweep
    on the H200; going past a wave costs a second, mostly idle one), each split keeping at least
    ``MIN_TILES_PER_SPLIT`` (2) tiles of the index capacity ``K``. (The engine's CUDA graphs pass
    index buffers as wide as the pool, so there ``want`` decides: 12 packed splits at batch 64,
    the count the isolated sweep found fastest: bench/NOTES.md, sparse_attention._auto_splits.)
    Uses shapes only (no host sync, so CUDA-graph safe). A program walks its tiles as one
    dependent gather chain (index -> page -> K/V) after another, so few long programs are
    latency-bound: one split is up to 10x slower at B <= 4."""
    if not q.is_cuda or _interpreting():
        return 1
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return split_count(batch, kv_heads, max_selected, block_n, q.shape[-1], sms)


def split_count(batch: int, kv_heads: int, max_selected: int, block_n: int, head_dim: int,
                num_sms: int) -> int:
    """`_auto_splits`' rule on a GPU of ``num_sms`` SMs (also for compiling its launch offline)."""
    per_sm = 6 if head_dim <= 64 else 4
    want = (per_sm * num_sms) // max(1, batch * kv_heads)
    cap = max(1, -(-max_selected // (MIN_TILES_PER_SPLIT * block_n)))
    return int(max(1, min(want, cap, 64)))


def sparse_attention(q, k_cache, v_cache, block_tables, context_lens, indices, index_counts,
                     tail_start, scale: float, block_n: int = 32, num_splits: int | None = None,
                     num_warps: int = 4, num_stages: int | None = None,
                     packed: bool | None = None, pdl: bool = False, window: int = 0):
    """Triton version of ``sparse_attention_reference`` (see the module docstring). ``block_n``
    entries per tile is independent of the pool's page size; ``num_splits`` chunks of the key list
    per (request, KV head) (None: chosen from the device and the shapes), merged by a second
    kernel (a merge by the last split to finish measured slower end to end: bench/NOTES.md
    version 45).

    ``num_stages`` (Triton's software pipelining of the gather) defaults to 2 at head dim <= 64
    and 4 above: about 5 and 8 % faster than Triton's default 3 at batch 64 x 8K; a grid with the
    KV head first and slot-addressed selections gained nothing (bench/NOTES.md,
    sparse_attention.sparse_attention).

    ``packed``: one program per (request, split) for all KV heads (valid only with one shared
    selection, ``G = 1``); None: `packs_kv_heads`. Compiled, the output can differ from the
    per-KV-head programs' in the last bit (`_sparse_tile_packed` says why)."""
    if triton is None:
        raise RuntimeError("sparse_attention needs Triton; use sparse_attention_reference")
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    if window:
        # Nothing of the selection is read: stand-ins of the right rank for the pointers.
        indices = context_lens.view(-1, 1, 1)
        index_counts = tail_start = context_lens
    groups = indices.shape[1]
    if heads % kv_heads:
        raise ValueError(f"num_heads {heads} is not a multiple of kv_heads {kv_heads}")
    if groups not in (1, kv_heads):
        raise ValueError(f"indices must have 1 or kv_heads={kv_heads} groups, got {groups}")
    group = heads // kv_heads
    if packed is None:
        packed = packs_kv_heads(heads, kv_heads, groups)
    elif packed and groups != 1:
        raise ValueError("packed sparse attention needs one selection shared by the KV heads (G = 1)")
    out = torch.empty_like(q)
    if batch == 0:
        return out
    programs = 1 if packed else kv_heads      # per (request, split)
    if num_splits is None:
        num_splits = _auto_splits(q, batch, programs, window or indices.shape[2], block_n)
    num_splits = max(1, int(num_splits))
    block_m = max(16, triton.next_power_of_2(heads if packed else group))
    block_d = max(16, triton.next_power_of_2(dim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if num_splits > 1:
        part_acc = torch.empty(batch, heads, num_splits, block_d, dtype=torch.float32,
                               device=q.device)
        part_ml = torch.empty(batch, heads, num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = torch.empty(1, dtype=torch.float32, device=q.device)
    s_ig = indices.stride(1) if groups == kv_heads and kv_heads > 1 else 0
    if num_stages is None:
        num_stages = 2 if dim <= 64 else 4
    # The page size (k_cache.shape[1]) is a compile-time constant (BLOCK_SIZE): a key's page
    # and offset are then arithmetic by a known constant, not a runtime integer division
    # (bench/NOTES.md, version 33).
    _sparse_attention_kernel[(batch, programs, num_splits)](
        q, k_cache, v_cache, out, part_acc, part_ml,
        block_tables, context_lens, indices, index_counts, tail_start, float(scale),
        num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        indices.stride(0), s_ig, indices.stride(2), block_tables.stride(0), k_cache.shape[1],
        GROUP=group, KV_HEADS=kv_heads, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d, SPLIT=num_splits > 1, PACKED=bool(packed), PRECISION=precision,
        INTERPRET=_interpreting(), WINDOW=int(window or 0),
        num_warps=num_warps, num_stages=num_stages, **launch_options(q.device, pdl))
    if num_splits > 1:
        _merge_splits_kernel[(batch, heads)](
            part_acc, part_ml, out, *out.stride(), heads, num_splits,
            SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
            HEAD_DIM=dim, BLOCK_D=block_d, **launch_options(q.device, pdl))
    return out
