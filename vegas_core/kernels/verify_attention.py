"""Verification attention over the paged KV pool (issue 4, kernel 1), in Triton beside a plain
PyTorch reference with the same signature.

Contract (both functions):
- ``q`` ``[total_q_rows, num_heads, head_dim]``: the query rows of all requests, flat; request ``i``
  owns rows ``q_start_loc[i]:q_start_loc[i+1]`` (1 to 17 rows, ragged across the batch).
- ``k_cache, v_cache`` ``[num_blocks, block_size, kv_heads, head_dim]``: one layer of
  ``vegas_core.kv_cache.KVPool``; position ``p`` of request ``i`` lives in page
  ``block_tables[i, p // block_size]`` at offset ``p % block_size`` (tables int32, padded).
- ``context_lens`` int32 ``[batch]``: keys visible to the request's LAST query row. Row ``r`` of a
  request with ``q_len`` rows sits at position ``ctx - q_len + r`` and sees keys ``<=`` that
  position (causal among the new rows).
- Grouped-query: query head ``h`` reads KV head ``h // (num_heads // kv_heads)``.
- ``window`` (0: none): a sliding-window layer (Gemma 3's local layers, transformers' semantics):
  row ``r`` at position ``p`` sees only keys in ``(p - window, p]``, itself included. The kernel
  reads no page wholly before the first row's window. A windowed call collects nothing (the
  engine selects on global layers only).

Returns ``(out, lse, logits)``:
- ``out`` ``[total_q_rows, num_heads, head_dim]`` in ``q``'s dtype;
- ``lse`` ``[total_q_rows, num_heads]`` float32, natural log-sum-exp of the scaled scores over each
  row's visible keys (so a key's softmax weight is ``exp(logit - lse)``);
- ``logits``: ``None`` for ``collect="none"``; otherwise ``CollectedLogits(logits, rows)`` where
  ``logits`` is bf16 ``[num_collected_rows, num_heads, max(context_lens)]`` holding the scaled
  pre-softmax scores ``scale * q.k`` and ``rows`` (int64 ``[num_collected_rows]``) is the flat query
  row each one belongs to. ``collect="c2q"`` keeps the first and last row of each request (one row
  when ``q_len == 1``), ``"all"`` every row, in request then row order; an explicit ascending
  sequence of flat rows keeps exactly those (a batch mixing policies). Positions a row cannot see
  (causally masked, or past its request's context) hold ``-inf``. Collecting never changes ``out``
  or ``lse``: the Triton kernel runs the same arithmetic and only adds stores.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .split_merge import arrival_counters

try:  # Triton is optional: the CPU engine path only needs the reference.
    import triton
    import triton.language as tl

    from .pdl import pdl_wait
    from .split_merge import fold_online, last_to_arrive, merge_partials
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

COLLECT_MODES = ("none", "c2q", "all")
MAX_Q_ROWS = 17   # rows of one request the kernel takes: gamma <= 16 drafts plus the pending token


class LaunchConfig(NamedTuple):
    block_n: int         # keys per tile
    num_warps: int
    num_stages: int
    fused_merge: bool    # the last split merges (kernels.split_merge), not a second kernel
    max_registers: int   # per thread (Triton's maxnreg); 0: the compiler's choice
    unmasked_tiles: bool  # tiles every row sees whole skip the masks (_attend_tile)
    page_ahead: int = 0  # tiles ahead whose block-table entries a program loads (0, 1 or 2)


def launch_config(collect_mode: int, head_dim: int, block_m: int = 32,
                  q_rows: int | None = None) -> LaunchConfig:
    """The launch per collection path: 0 none, 1 rows stored from the main tile (any row set),
    2 the first/last tile (Collect-2-Query), for a ``block_m``-row tile (rows x query heads per
    KV head, padded to a power of two) and at most ``q_rows`` rows a request. Each choice is the
    fastest the H200 sweeps found at batch 64 x 8K where bits allow (the sweeps and their numbers:
    bench/NOTES.md, 'Why the kernels are as they are', verify_attention.launch_config):
    - one key tile per head dim for every path, 128 keys at <= 64 and 64 above: the online softmax
      rescales at tile boundaries, so two tile sizes round differently, and collecting must not
      change the output (nor may a request's bits depend on whether its batch mixes in collecting
      requests); at each head dim the size faster for two of the three paths (the third pays
      18 % at 64, 1.4 % at 128);
    - 4 warps and 2 stages;
    - the fused merge under a register cap (168 at head dim 64; 128 for C2Q at 128) where it wins:
      the merge code adds registers, which cost programs per SM unless capped. No collection at
      head dim 128, the main-tile store and C2Q's 64-row tile (which spills under the caps) keep
      the merge kernel uncapped. The two merges give the same bits (they share `_merge_rows`), so
      this choice may differ per path;
    - unmasked tiles at head dim 128 (every path gains), masked at 64 (only C2Q gained): compiled,
      an unmasked tile's scores can differ from a masked one's in the last bit, so every path of
      one head dim makes the same choice;
    - a plain decode step (one row, no collection) at head dim 64: each tile's block-table entries
      loaded one tile ahead (`_load_pages`) over 3 stages, the only launch that gained from it. It
      changes when loads are issued, not the arithmetic: the same bits (checked at every shape)."""
    small = head_dim <= 64
    unmasked = not small          # one choice per head dim for every path (see above)
    block_n = 128 if small else 64    # likewise
    if collect_mode == 0:
        ahead = small and q_rows == 1
        return LaunchConfig(block_n, 4, 3 if ahead else 2, fused_merge=small,
                            max_registers=168 if small else 0, unmasked_tiles=unmasked,
                            page_ahead=1 if ahead else 0)
    if collect_mode == 2:
        capped = block_m <= 32
        return LaunchConfig(block_n, 4, 2, fused_merge=capped,
                            max_registers=(168 if small else 128) if capped else 0,
                            unmasked_tiles=unmasked)
    return LaunchConfig(block_n, 4, 2, fused_merge=False, max_registers=0, unmasked_tiles=unmasked)


def tile_rows(q_rows: int, group: int) -> int:
    """The score tile's rows for requests of up to ``q_rows`` rows at GQA ``group``: every query head
    of a KV head for every row, padded to a power of two of at least 16. A verification of
    gamma + 1 rows that crosses into the next tile size costs a larger tile (bench/NOTES.md:
    SmolLM2's gamma 10, 33 rows, takes 64), which the tuner's gamma grid accounts for."""
    return max(16, 1 << max(0, q_rows * group - 1).bit_length())


class CollectedLogits(NamedTuple):
    logits: torch.Tensor  # bf16 [num_collected_rows, num_heads, max_context], -inf where not visible
    rows: torch.Tensor    # int64 [num_collected_rows]: flat query row of each collected row


def collected_rows(q_start_loc: torch.Tensor, collect, total: int | None = None) -> torch.Tensor:
    """Flat query rows whose logits are kept, in request then row order (int64, on CPU).
    ``collect`` is a mode name, or an explicit sequence of flat rows (ascending, no repeats), which
    lets one batch mix requests that collect nothing, two rows or every row."""
    if not isinstance(collect, str):
        rows_t = torch.as_tensor(collect, dtype=torch.long).cpu().flatten()
        if total is None:
            total = int(q_start_loc[-1]) if len(q_start_loc) else 0
        if len(rows_t) and (bool((rows_t[1:] <= rows_t[:-1]).any()) or int(rows_t[0]) < 0
                            or int(rows_t[-1]) >= total):
            raise ValueError(f"collect rows must be ascending, unique and in [0, {total})")
        return rows_t
    if collect not in COLLECT_MODES:
        raise ValueError(f"collect must be one of {COLLECT_MODES} or a list of rows, got {collect!r}")
    if collect == "none":
        return torch.empty(0, dtype=torch.long)      # without reading q_start_loc from the device
    starts = q_start_loc.cpu().tolist()
    rows: list[int] = []
    for a, b in zip(starts[:-1], starts[1:]):
        if collect == "all":
            rows.extend(range(a, b))
        elif collect == "c2q":
            rows.extend([a] if b - a == 1 else [a, b - 1])
    return torch.tensor(rows, dtype=torch.long)


def collected_row_slots(rows: torch.Tensor, total: int) -> torch.Tensor:
    """int32 [total]: each flat query row's index among the collected ``rows``, -1 elsewhere."""
    slot = torch.full((total,), -1, dtype=torch.int32)
    slot[rows] = torch.arange(len(rows), dtype=torch.int32)
    return slot


def _collects(collect) -> bool:
    return (collect != "none") if isinstance(collect, str) else True


def verify_attention_reference(q, k_cache, v_cache, block_tables, context_lens, q_start_loc,
                               scale: float, collect: str = "none", window: int = 0):
    """Plain PyTorch, one request at a time, float32 maths (see the module docstring)."""
    rows_kept = collected_rows(q_start_loc, collect)
    total, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    lse = torch.empty(total, heads, dtype=torch.float32, device=q.device)
    max_ctx = int(context_lens.max()) if len(context_lens) else 0
    scores_all = torch.full((total, heads, max_ctx), float("-inf"), device=q.device)
    starts = q_start_loc.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        q_len = b - a
        pos = torch.arange(ctx, device=q.device)
        slots = block_tables[i].long()[pos // block_size] * block_size + pos % block_size
        keys = k_cache.reshape(-1, kv_heads, dim)[slots].float()     # [ctx, KVH, d]
        values = v_cache.reshape(-1, kv_heads, dim)[slots].float()
        keys = keys.repeat_interleave(group, dim=1)                  # [ctx, H, d]
        values = values.repeat_interleave(group, dim=1)
        s = torch.einsum("rhd,chd->rhc", q[a:b].float(), keys) * scale
        row_pos = ctx - q_len + torch.arange(q_len, device=q.device)
        hidden = pos[None, :] > row_pos[:, None]                     # [rows, ctx]
        if window:
            hidden |= pos[None, :] <= row_pos[:, None] - window
        s = s.masked_fill(hidden[:, None, :], float("-inf"))
        lse[a:b] = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[a:b, :, None])
        out[a:b] = torch.einsum("rhc,chd->rhd", p, values).to(q.dtype)
        scores_all[a:b, :, :ctx] = s
    if not _collects(collect):
        return out, lse, None
    rows_dev = rows_kept.to(q.device)
    return out, lse, CollectedLogits(scores_all[rows_dev].to(torch.bfloat16), rows_kept)


if triton is not None:

    @triton.jit
    def _load_kv(start, k_ptr, v_ptr, tables_ptr, req, kvh, ctx, s_kb, s_kt, s_kh, s_kd,
                 s_vb, s_vt, s_vh, s_vd, s_tb, BLOCK_SIZE: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                 MASKED: tl.constexpr, page_ahead, HAVE_PAGE: tl.constexpr):
        """The BLOCK_N keys from `start`: positions, validity, and K/V gathered via the table.
        Without MASKED every key is below `ctx` (the caller's promise) and no load is masked.
        HAVE_PAGE: the caller loaded this tile's block-table entries already (`page_ahead`,
        `_load_pages`)."""
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        pos = start + offs_n
        n_valid = pos < ctx
        if HAVE_PAGE:
            page = page_ahead
        elif MASKED:
            page = tl.load(tables_ptr + req * s_tb + pos // BLOCK_SIZE, mask=n_valid, other=0)
        else:
            page = tl.load(tables_ptr + req * s_tb + pos // BLOCK_SIZE)
        base_k = page.to(tl.int64) * s_kb + (pos % BLOCK_SIZE) * s_kt + kvh * s_kh
        base_v = page.to(tl.int64) * s_vb + (pos % BLOCK_SIZE) * s_vt + kvh * s_vh
        if MASKED or BLOCK_D != HEAD_DIM:
            kv_mask = n_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
            k_tile = tl.load(k_ptr + base_k[:, None] + offs_d[None, :] * s_kd, mask=kv_mask,
                             other=0.0)
            v_tile = tl.load(v_ptr + base_v[:, None] + offs_d[None, :] * s_vd, mask=kv_mask,
                             other=0.0)
        else:
            k_tile = tl.load(k_ptr + base_k[:, None] + offs_d[None, :] * s_kd)
            v_tile = tl.load(v_ptr + base_v[:, None] + offs_d[None, :] * s_vd)
        return pos, n_valid, k_tile, v_tile

    @triton.jit
    def _load_pages(start, tables_ptr, req, ctx, s_tb, BLOCK_SIZE: tl.constexpr,
                    BLOCK_N: tl.constexpr):
        """The block-table entries of the BLOCK_N keys from `start` (0 past `ctx`)."""
        pos = start + tl.arange(0, BLOCK_N)
        return tl.load(tables_ptr + req * s_tb + pos // BLOCK_SIZE, mask=pos < ctx, other=0)

    @triton.jit
    def _pages_ahead(start, p0, tables_ptr, req, ctx, s_tb, BLOCK_SIZE: tl.constexpr,
                     BLOCK_N: tl.constexpr, PAGE_AHEAD: tl.constexpr):
        """Inside the key loop at tile `start`: the block-table entries of the tile PAGE_AHEAD
        tiles on (`p0`, unused, when PAGE_AHEAD is 0)."""
        nxt = p0
        if PAGE_AHEAD > 0:
            nxt = _load_pages(start + PAGE_AHEAD * BLOCK_N, tables_ptr, req, ctx, s_tb,
                              BLOCK_SIZE, BLOCK_N)
        return nxt

    @triton.jit
    def _shift_pages(p0, p1, nxt, PAGE_AHEAD: tl.constexpr):
        """After a tile: (this tile's, the next's) entries move one tile on, `nxt` joining."""
        if PAGE_AHEAD == 1:
            p0 = nxt
        if PAGE_AHEAD == 2:
            p0 = p1
            p1 = nxt
        return p0, p1

    @triton.jit
    def _store_logits(logits_ptr, s, slot, head, keep, pos, n_valid, s_gr, s_gh, s_gc):
        dst = (logits_ptr + slot.to(tl.int64)[:, None] * s_gr + head[:, None] * s_gh
               + pos[None, :] * s_gc)
        tl.store(dst, s.to(tl.bfloat16), mask=keep[:, None] & n_valid[None, :])

    @triton.jit
    def _attend_tile(start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                     keep_c, m_i, l_i, acc, k_ptr, v_ptr,
                     logits_ptr, tables_ptr, req, kvh, ctx, scale, s_kb, s_kt, s_kh, s_kd,
                     s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, BLOCK_SIZE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                     COLLECT: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr,
                     page_ahead, HAVE_PAGE: tl.constexpr, WINDOW: tl.constexpr):
        """One BLOCK_N-key tile: gather K/V through the block table, score, mask, (collect),
        and fold into the online-softmax state (m_i, l_i, acc).

        COLLECT 1 stores the main tile's scores for the rows with a slot (any row set); COLLECT 2
        scores the first and last rows' heads again in a small tile of their own (q_c) and stores
        only that: for Collect-2-Query the masked store of the whole BLOCK_M tile is most of the
        collection's cost, and one more small dot is cheap next to the K/V gather.

        Without MASKED the tile is one every row sees whole (all keys before the request's first
        new row and inside the split): no causal, context or padded-row mask, which at 8 rows is
        a good part of the tile's ALU work. Padded rows then hold finite scores of a zero query;
        they are never stored. Compiled, the unmasked arithmetic may round a score differently in
        the last bit, so a collecting and a non-collecting call must choose alike
        (`launch_config` does) for collecting to leave the output unchanged."""
        pos, n_valid, k_tile, v_tile = _load_kv(
            start, k_ptr, v_ptr, tables_ptr, req, kvh, ctx, s_kb, s_kt, s_kh, s_kd,
            s_vb, s_vt, s_vh, s_vd, s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, MASKED,
            page_ahead, HAVE_PAGE)
        s = tl.dot(q_tile, tl.trans(k_tile), input_precision=PRECISION) * scale
        if MASKED:
            visible = (pos[None, :] <= row_pos[:, None]) & n_valid[None, :] & m_valid[:, None]
            if WINDOW > 0:   # a sliding-window layer: row r sees keys (row_pos - WINDOW, row_pos]
                visible = visible & (pos[None, :] > row_pos[:, None] - WINDOW)
            s = tl.where(visible, s, float("-inf"))
        if COLLECT == 1:
            _store_logits(logits_ptr, s, slot, head, (slot >= 0) & m_valid, pos, n_valid,
                          s_gr, s_gh, s_gc)
        if COLLECT == 2:
            s_c = tl.dot(q_c, tl.trans(k_tile), input_precision=PRECISION) * scale
            if MASKED:
                s_c = tl.where((pos[None, :] <= row_pos_c[:, None]) & n_valid[None, :], s_c,
                               float("-inf"))
            _store_logits(logits_ptr, s_c, slot_c, head_c, keep_c, pos, n_valid, s_gr, s_gh, s_gc)

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile,
                                            input_precision=PRECISION)
        m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def _store_neg_tail(logits_ptr, slot, head, keep, ctx, logits_len, s_gr, s_gh, s_gc,
                        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
        """-inf at positions [ctx, logits_len) of the collected rows (past the request's context,
        up to the buffer's width), so the buffer needs no prior fill."""
        offs_n = tl.arange(0, BLOCK_N)
        neg = tl.full([ROWS, BLOCK_N], float("-inf"), dtype=tl.float32)
        if INTERPRET:
            start = ctx
            while start < logits_len:
                pos = start + offs_n
                _store_logits(logits_ptr, neg, slot, head, keep, pos, pos < logits_len,
                              s_gr, s_gh, s_gc)
                start += BLOCK_N
        else:
            for start in range(ctx, logits_len, BLOCK_N):
                pos = start + offs_n
                _store_logits(logits_ptr, neg, slot, head, keep, pos, pos < logits_len,
                              s_gr, s_gh, s_gc)

    @triton.jit
    def _program_keys(qloc_ptr, ctx_ptr, num_splits, split_keys, BLOCK_N: tl.constexpr,
                      SPLIT: tl.constexpr, WINDOW: tl.constexpr, row_chunks=1,
                      CHUNKED: tl.constexpr = False):
        """A verification program's (request, KV head, split), its request's rows and context,
        and the keys [lo, hi) it covers: with SPLIT, that request's keys over num_splits in
        whole BLOCK_N tiles (split 0 and all of them without), or with split_keys > 0 keys
        [s * split_keys, (s + 1) * split_keys) whatever the context. The keys are [0, ctx), or with
        a WINDOW only those some row sees, from the first row's window start (with split_keys,
        from its tile): the pages before it are never read (computed here from the context, so a
        CUDA graph replays it right). CHUNKED: row_chunks programs a request (axis 0, the chunk
        fastest), each taking a chunk of its rows over the same keys."""
        req = tl.program_id(0)
        if CHUNKED:
            req = req // row_chunks
        kvh = tl.program_id(1)
        q_start = tl.load(qloc_ptr + req)
        q_len = tl.load(qloc_ptr + req + 1) - q_start
        ctx = tl.load(ctx_ptr + req)
        first = 0
        if WINDOW > 0:
            first = tl.maximum(ctx - q_len + 1 - WINDOW, 0)
        if SPLIT:
            split = tl.program_id(2)
            split_len = tl.cdiv(ctx - first, num_splits * BLOCK_N) * BLOCK_N
            lo = first + split * split_len
            hi = tl.minimum(ctx, lo + split_len)
            # The batch-invariant mode: splits and tiles start at fixed positions.
            fixed = split_keys > 0
            lo = tl.where(fixed, tl.maximum(split * split_keys, first // BLOCK_N * BLOCK_N), lo)
            hi = tl.where(fixed, tl.minimum(ctx, (split + 1) * split_keys), hi)
        else:
            split = 0
            lo = first
            hi = ctx
        return req, kvh, split, q_start, q_len, ctx, lo, hi

    @triton.jit
    def _tile_rows(kvh, q_len, ctx, row0, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, CHUNKED: tl.constexpr = False):
        """The score tile's rows (row m: query row row0 + m // GROUP, head kvh * GROUP + m % GROUP;
        row0 is 0 but when CHUNKED, where a program takes BLOCK_M // GROUP rows from it), the
        head-dim offsets, their validity, and the last key each row sees."""
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        row = offs_m // GROUP
        head = kvh * GROUP + offs_m % GROUP
        if CHUNKED:
            row = row + row0
            m_valid = (offs_m < (BLOCK_M // GROUP) * GROUP) & (row < q_len)
        else:
            m_valid = offs_m < q_len * GROUP
        d_valid = offs_d < HEAD_DIM
        row_pos = ctx - q_len + row                                    # last key each row sees
        return offs_m, offs_d, row, head, m_valid, d_valid, row_pos

    @triton.jit
    def _splits_in_program(q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                           keep_c, k_ptr, v_ptr, logits_ptr, tables_ptr, req, kvh, ctx, first_tile,
                           scale, split_keys, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_gr,
                           s_gh, s_gc, s_tb, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                           COLLECT: tl.constexpr, PRECISION: tl.constexpr,
                           INTERPRET: tl.constexpr, WINDOW: tl.constexpr):
        """The batch-invariant mode's splits (keys [s * split_keys, (s + 1) * split_keys), from the
        one holding `first_tile`, the first tile any row sees) one after another in this program:
        each attended from a fresh state, as its own program would, then folded in split order as
        the merge kernel folds them (`fold_online`), so the bits are those of split programs and
        a merge, without writing each split's partial state (which for a prefill chunk's
        thousands of rows is more traffic than the keys). Returns the folded (max, sum,
        unnormalised accumulator)."""
        m_run = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_run = tl.zeros([BLOCK_M], dtype=tl.float32)
        o_run = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        no_pages = tl.zeros([BLOCK_N], dtype=tl.int32)
        lo = ctx * 0 + first_tile // split_keys * split_keys
        while lo < ctx:
            hi = tl.minimum(ctx, lo + split_keys)
            m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            if INTERPRET:
                start = tl.maximum(lo, first_tile)
                while start < hi:
                    m_i, l_i, acc = _attend_tile(
                        start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                        keep_c, m_i, l_i, acc, k_ptr, v_ptr, logits_ptr, tables_ptr, req, kvh, hi,
                        scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc,
                        s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, True,
                        no_pages, False, WINDOW)
                    start += BLOCK_N
            else:
                for start in range(tl.maximum(lo, first_tile), hi, BLOCK_N):
                    m_i, l_i, acc = _attend_tile(
                        start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                        keep_c, m_i, l_i, acc, k_ptr, v_ptr, logits_ptr, tables_ptr, req, kvh, hi,
                        scale, s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc,
                        s_tb, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, True,
                        no_pages, False, WINDOW)
            m_run, l_run, o_run = fold_online(m_run, l_run, o_run, m_i, l_i, acc)
            lo += split_keys
        return m_run, l_run, o_run

    @triton.jit
    def _verify_attention_kernel(
            q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, logits_ptr, slot_ptr,
            part_acc_ptr, part_ml_ptr, cnt_ptr,
            tables_ptr, ctx_ptr, qloc_ptr, scale, num_splits, split_keys, logits_len, row_chunks,
            s_qt, s_qh, s_qd,
            s_kb, s_kt, s_kh, s_kd,
            s_vb, s_vt, s_vh, s_vd,
            s_ot, s_oh, s_od,
            s_lt, s_lh,
            s_gr, s_gh, s_gc,
            s_tb,
            s_ps, s_pt, s_ph,
            BLOCK_SIZE: tl.constexpr,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
            COLLECT: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr,
            UNMASKED_TILES: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
            USE_PDL: tl.constexpr, PAGE_AHEAD: tl.constexpr = 0, WINDOW: tl.constexpr = 0,
            SPLIT_SEQ: tl.constexpr = False, CHUNKED: tl.constexpr = False,
            ONLINE_MERGE: tl.constexpr = False):
        """One program = one request x one KV head (x one split of the context when SPLIT): all
        GROUP query heads of all the request's rows form the BLOCK_M-row tile (row m: query row
        m // GROUP, head kvh * GROUP + m % GROUP), so each K/V block is read once. Online softmax
        over BLOCK_N-key tiles gathered via the block table. With SPLIT, program (req, kvh, s)
        covers keys [s * split_len, (s + 1) * split_len) of ITS request, split_len being that
        request's context over num_splits in whole tiles (every request uses every split, and
        nothing depends on the batch's longest context: CUDA-graph safe), or split_keys when
        > 0 (the batch-invariant mode's fixed boundaries; splits past a context are empty), and
        leaves its
        unnormalised partial state (flash-decoding); with FUSED_MERGE the last split of the
        (request, KV head) to finish merges them (`kernels.split_merge`), else
        `_merge_splits_kernel` does, launched after. SPLIT_SEQ: split_keys' splits one after
        another in this program instead (`_splits_in_program`; the same bits). CHUNKED: a
        request's rows in row_chunks chunks of BLOCK_M // GROUP, one program each (axis 0: request
        x chunk), each over the request's keys; a chunk past its request's rows attends nothing.
        ONLINE_MERGE: the fused merge folds split by split (`fold_online`), as the batch-invariant
        mode's merge kernel and in-program fold do."""
        pdl_wait(USE_PDL)
        req, kvh, split, q_start, q_len, ctx, lo, hi = _program_keys(
            qloc_ptr, ctx_ptr, num_splits, split_keys, BLOCK_N, SPLIT, WINDOW, row_chunks, CHUNKED)
        row0 = 0
        seq_ctx = ctx      # the keys `_splits_in_program` walks
        if CHUNKED:
            row0 = (tl.program_id(0) % row_chunks) * (BLOCK_M // GROUP)
            hi = tl.where(row0 < q_len, hi, lo)
            seq_ctx = tl.where(row0 < q_len, ctx, 0)
        if SPLIT_SEQ:      # no keys for the loops below: `_splits_in_program` attends them
            first_tile = lo // BLOCK_N * BLOCK_N
            hi = lo
        offs_m, offs_d, row, head, m_valid, d_valid, row_pos = _tile_rows(
            kvh, q_len, ctx, row0, GROUP, HEAD_DIM, BLOCK_M, BLOCK_D, CHUNKED)

        q_tile = tl.load(q_ptr + (q_start + row)[:, None] * s_qt + head[:, None] * s_qh
                         + offs_d[None, :] * s_qd,
                         mask=m_valid[:, None] & d_valid[None, :], other=0.0)
        slot = tl.load(slot_ptr + q_start + row, mask=m_valid & (COLLECT == 1), other=-1)
        # COLLECT 2: tile row c holds head c % GROUP of the first (c < GROUP) or last row; the
        # last is dropped when it is the first (q_len 1) and any row without a slot is dropped.
        offs_c = tl.arange(0, BLOCK_C)
        c_row = tl.where(offs_c < GROUP, 0, q_len - 1)
        head_c = kvh * GROUP + offs_c % GROUP
        c_valid = (offs_c < 2 * GROUP) & ((offs_c < GROUP) | (q_len > 1)) & (q_len > 0) \
            & (COLLECT == 2)
        slot_c = tl.load(slot_ptr + q_start + c_row, mask=c_valid, other=-1)
        keep_c = c_valid & (slot_c >= 0)
        q_c = tl.load(q_ptr + (q_start + c_row)[:, None] * s_qt + head_c[:, None] * s_qh
                      + offs_d[None, :] * s_qd, mask=keep_c[:, None] & d_valid[None, :], other=0.0)
        row_pos_c = ctx - q_len + c_row

        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)          # finite: padded rows stay NaN-free
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Tiles [lo, mid) are seen whole by every row (keys up to the first new row's position,
        # inside the split): unmasked; [mid, hi) keep the causal and context masks. The four
        # loops below are written out on purpose: the same loops in one helper function compiled
        # to a kernel measured 4-7 % slower at head dim 128 (bench/NOTES.md, version 18).
        mid = lo
        # A sliding-window layer masks every tile: its rows' windows start at different keys.
        if UNMASKED_TILES and WINDOW == 0:
            full_end = tl.minimum(hi, ctx - q_len + 1)
            mid = lo + tl.maximum(full_end - lo, 0) // BLOCK_N * BLOCK_N
        # PAGE_AHEAD tiles ahead, the block-table entries: p0 this tile's, p1 the next's.
        p0 = tl.zeros([BLOCK_N], dtype=tl.int32)
        p1 = tl.zeros([BLOCK_N], dtype=tl.int32)
        if PAGE_AHEAD > 0:
            p0 = _load_pages(lo, tables_ptr, req, hi, s_tb, BLOCK_SIZE, BLOCK_N)
        if PAGE_AHEAD > 1:
            p1 = _load_pages(lo + BLOCK_N, tables_ptr, req, hi, s_tb, BLOCK_SIZE, BLOCK_N)
        if INTERPRET:
            # Triton 3.6's interpreter cannot take a loaded scalar as a range() bound under NumPy 2
            # (its __index__ calls int() on a 1-element array); while loops evaluate the same.
            start = lo
            while start < mid:
                nxt = _pages_ahead(start, p0, tables_ptr, req, hi, s_tb, BLOCK_SIZE, BLOCK_N,
                                   PAGE_AHEAD)
                m_i, l_i, acc = _attend_tile(
                    start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                    keep_c, m_i, l_i, acc, k_ptr, v_ptr,
                    logits_ptr, tables_ptr, req, kvh, hi, scale, s_kb, s_kt, s_kh, s_kd,
                    s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, BLOCK_SIZE,
                    BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, False, p0, PAGE_AHEAD > 0,
                    WINDOW)
                p0, p1 = _shift_pages(p0, p1, nxt, PAGE_AHEAD)
                start += BLOCK_N
            while start < hi:
                nxt = _pages_ahead(start, p0, tables_ptr, req, hi, s_tb, BLOCK_SIZE, BLOCK_N,
                                   PAGE_AHEAD)
                m_i, l_i, acc = _attend_tile(
                    start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                    keep_c, m_i, l_i, acc, k_ptr, v_ptr,
                    logits_ptr, tables_ptr, req, kvh, hi, scale, s_kb, s_kt, s_kh, s_kd,
                    s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, BLOCK_SIZE,
                    BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, True, p0, PAGE_AHEAD > 0,
                    WINDOW)
                p0, p1 = _shift_pages(p0, p1, nxt, PAGE_AHEAD)
                start += BLOCK_N
        else:
            for start in range(lo, mid, BLOCK_N):
                nxt = _pages_ahead(start, p0, tables_ptr, req, hi, s_tb, BLOCK_SIZE, BLOCK_N,
                                   PAGE_AHEAD)
                m_i, l_i, acc = _attend_tile(
                    start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                    keep_c, m_i, l_i, acc, k_ptr, v_ptr,
                    logits_ptr, tables_ptr, req, kvh, hi, scale, s_kb, s_kt, s_kh, s_kd,
                    s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, BLOCK_SIZE,
                    BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, False, p0, PAGE_AHEAD > 0,
                    WINDOW)
                p0, p1 = _shift_pages(p0, p1, nxt, PAGE_AHEAD)
            for start in range(mid, hi, BLOCK_N):
                nxt = _pages_ahead(start, p0, tables_ptr, req, hi, s_tb, BLOCK_SIZE, BLOCK_N,
                                   PAGE_AHEAD)
                m_i, l_i, acc = _attend_tile(
                    start, q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c,
                    keep_c, m_i, l_i, acc, k_ptr, v_ptr,
                    logits_ptr, tables_ptr, req, kvh, hi, scale, s_kb, s_kt, s_kh, s_kd,
                    s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, BLOCK_SIZE,
                    BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, True, p0, PAGE_AHEAD > 0,
                    WINDOW)
                p0, p1 = _shift_pages(p0, p1, nxt, PAGE_AHEAD)
        if SPLIT_SEQ:
            m_i, l_i, acc = _splits_in_program(
                q_tile, row_pos, m_valid, head, slot, q_c, row_pos_c, head_c, slot_c, keep_c,
                k_ptr, v_ptr, logits_ptr, tables_ptr, req, kvh, seq_ctx, first_tile, scale, split_keys,
                s_kb, s_kt, s_kh, s_kd, s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, BLOCK_SIZE,
                BLOCK_M, BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION, INTERPRET, WINDOW)

        if COLLECT != 0:
            last = True          # the last split writes the -inf tail
            if SPLIT:
                last = split == num_splits - 1
            if last:
                if COLLECT == 1:
                    _store_neg_tail(logits_ptr, slot, head, (slot >= 0) & m_valid, ctx,
                                    logits_len, s_gr, s_gh, s_gc, BLOCK_M, BLOCK_N, INTERPRET)
                else:
                    _store_neg_tail(logits_ptr, slot_c, head_c, keep_c, ctx, logits_len,
                                    s_gr, s_gh, s_gc, BLOCK_C, BLOCK_N, INTERPRET)

        o_rows = (q_start + row)
        if SPLIT:
            part = split * s_ps + o_rows * s_pt + head * s_ph
            tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                     mask=m_valid[:, None] & d_valid[None, :])
            tl.store(part_ml_ptr + 2 * part, m_i, mask=m_valid)
            tl.store(part_ml_ptr + 2 * part + 1, l_i, mask=m_valid)
            if FUSED_MERGE:
                counter = cnt_ptr + req * tl.num_programs(1) + kvh
                if CHUNKED:      # one counter per (request, chunk, KV head)
                    counter = cnt_ptr + tl.program_id(0) * tl.num_programs(1) + kvh
                if last_to_arrive(counter, num_splits):
                    _merge_rows(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, o_rows, head, m_valid,
                                offs_d, d_valid, num_splits, s_ps, s_pt, s_ph, s_ot, s_oh, s_od,
                                s_lt, s_lh, HEAD_DIM, BLOCK_M, BLOCK_D, INTERPRET, ONLINE_MERGE)
        else:
            l_safe = tl.where(l_i > 0, l_i, 1.0)
            acc = acc / l_safe[:, None]
            tl.store(out_ptr + o_rows[:, None] * s_ot + head[:, None] * s_oh
                     + offs_d[None, :] * s_od,
                     acc.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
            tl.store(lse_ptr + o_rows * s_lt + head * s_lh, m_i + tl.log(l_safe), mask=m_valid)

    @triton.jit
    def _merge_rows(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, o_rows, head, m_valid, offs_d,
                    d_valid, num_splits, s_ps, s_pt, s_ph, s_ot, s_oh, s_od, s_lt, s_lh,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    INTERPRET: tl.constexpr, ONLINE: tl.constexpr = False):
        """Merge and store the splits of BLOCK_M (row, head) pairs (`merge_partials`): the fused
        merge and `_merge_splits_kernel` both come here, so they give the same bits."""
        o, lse = merge_partials(part_acc_ptr, part_ml_ptr, o_rows * s_pt + head * s_ph, s_ps,
                                num_splits, m_valid, offs_d, d_valid, HEAD_DIM, BLOCK_M, BLOCK_D,
                                INTERPRET, ONLINE)
        tl.store(out_ptr + o_rows[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :] * s_od,
                 o.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
        tl.store(lse_ptr + o_rows * s_lt + head * s_lh, lse, mask=m_valid)

    @triton.jit
    def _merge_splits_kernel(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, heads, num_splits,
                             s_ps, s_pt, s_ph, s_ot, s_oh, s_od, s_lt, s_lh,
                             HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr, USE_PDL: tl.constexpr,
                             ONLINE: tl.constexpr = False):
        """One program per query row: `_merge_rows` over its heads, the same arithmetic in the
        same order as the fused merge, so the two give the same bits (and a collecting call, whose
        path may merge the other way, the same output as one that does not collect). Empty splits
        carry max -1e30 and weigh exp(-huge) = 0. ONLINE: the batch-invariant mode's fold."""
        pdl_wait(USE_PDL)
        t = tl.program_id(0)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        _merge_rows(part_acc_ptr, part_ml_ptr, out_ptr, lse_ptr, t + offs_h * 0, offs_h,
                    offs_h < heads, offs_d, offs_d < HEAD_DIM, num_splits, s_ps, s_pt, s_ph,
                    s_ot, s_oh, s_od, s_lt, s_lh, HEAD_DIM, BLOCK_H, BLOCK_D, INTERPRET, ONLINE)


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    """The GPU's SMs; without one (the CPU, Triton's interpreter) 1: the interpreter runs programs
    one after another, so splitting buys nothing there and each extra program costs milliseconds
    of Python (8 here took the CPU suite's engine tests about 1.5x longer). Batches of fewer than
    eight (request, KV head) programs still split, so the CPU engine tests keep reaching the split
    path; tests/vegas_core/kernels/test_verify_attention.py sets its split counts explicitly."""
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 1


def default_num_splits(batch: int, kv_heads: int, max_ctx: int, num_sms: int | None = None,
                       min_split: int = 512) -> int:
    """Flash-decoding's split of the context: about eight (request, KV head, split) programs per
    SM, but no split shorter than `min_split` keys (the merge and the partial writes would then
    cost more than the parallelism gains). Eight per SM: the fastest in the H200 tuning sweep at
    batch 64 x 8K (bench/NOTES.md, verify_attention.default_num_splits). Depends only on the
    batch's shape, so a collecting and a non-collecting call split alike and their outputs stay
    bit-identical."""
    if num_sms is None:
        num_sms = _sm_count()
    programs = max(1, batch * kv_heads)
    want = max(1, round(8 * num_sms / programs))
    return max(1, min(want, -(-max_ctx // min_split), 64))


# Keys per split in the batch-invariant mode: splits start at multiples of it in every call, so a
# row's keys meet the same split boundaries whatever its request's context (at 8K, 8 splits: at
# batch 64 about the programs per SM `default_num_splits` found fastest).
INVARIANT_SPLIT_KEYS = 1024


def batch_invariant_launch(head_dim: int, group: int, config=None) -> dict:
    """`verify_attention_into`'s keyword arguments in the batch-invariant mode
    (`KernelOptions.deterministic`) for ``config`` (`options.InvariantConfig`; None: its defaults,
    whose zeros mean the per-shape choices below): one launch for every call, so a query row's
    scores, softmax and sums run in one order whether it is a one-row decode step, one of 17
    verification rows or a prefill row (in pieces of `invariant_piece_rows`), whatever the batch
    and whatever is collected. The defaults:
    - one score tile, the size 17 rows need (a tile's size can change the MMA instruction, so
      a row's dot products; padded rows cost compute, not bandwidth). A smaller ``block_m``
      takes a request's rows in chunks of ``block_m // group``, a program each over the same
      keys: the same tile in every call, so the same arithmetic per row, more programs;
    - key splits at fixed positions (`INVARIANT_SPLIT_KEYS`, always split, so every row is merged
      the same way), with `invariant_num_splits` of them, folded in split order; a split that a
      row cannot see, or past its context, leaves the fold as it was (prefill pieces pass
      ``splits_in_program=True``: the same splits and fold inside one program);
    - every tile masked, no merge by the last split (no atomics), no register cap, no page
      prefetch, collection from the main tile (the first/last tile is another dot).
    Which other choices keep a row's bits on a GPU, and what they cost, `bench invariant` measures
    (bench/NOTES.md, 'The batch-invariant mode')."""
    from vegas_core.options import InvariantConfig
    cfg = config or InvariantConfig()
    block_m = cfg.block_m or tile_rows(MAX_Q_ROWS, group)
    if block_m < group:
        raise ValueError(f"a {block_m}-row tile cannot hold one row of {group} heads")
    block_n = cfg.block_n or (128 if head_dim <= 64 else 64)
    if cfg.split_keys % block_n:
        raise ValueError(f"split_keys ({cfg.split_keys}) must be a multiple of block_n ({block_n})")
    return dict(block_m=block_m, block_n=block_n,
                num_warps=cfg.num_warps or (8 if block_m >= 128 else 4), num_stages=cfg.num_stages,
                fused_merge=cfg.fused_merge, max_registers=cfg.max_registers,
                unmasked_tiles=cfg.unmasked_tiles, page_ahead=cfg.page_ahead,
                split_keys=cfg.split_keys, c2q_tile=False)


def invariant_piece_rows(group: int, config=None) -> int:
    """Rows of a prefill piece in the batch-invariant mode (``config`` as `batch_invariant_launch`'s):
    as many as the tile holds when that is 17 or more (today's launch); a smaller tile's rows in
    whole tiles up to at least 64, which the kernel takes in row chunks. A piece's programs read
    its whole context; its chunks run side by side (adjacent on the grid's first axis), so they
    should share those reads through L2, and larger pieces read the context fewer times (a
    prediction, not measured: prefill is outside the decode rate)."""
    block_m = (config.block_m if config is not None else 0) or tile_rows(MAX_Q_ROWS, group)
    rows = block_m // group
    return rows if rows >= MAX_Q_ROWS else rows * -(-64 // rows)


def invariant_num_splits(max_ctx: int, split_keys: int = INVARIANT_SPLIT_KEYS) -> int:
    """Splits that cover ``max_ctx`` keys at ``split_keys`` each."""
    return max(1, -(-max_ctx // split_keys))


def verify_attention(q, k_cache, v_cache, block_tables, context_lens, q_start_loc,
                     scale: float, collect: str = "none", block_n: int | None = None,
                     num_splits: int | None = None, max_ctx: int | None = None,
                     max_q: int | None = None, row_slot: torch.Tensor | None = None,
                     num_warps: int | None = None, num_stages: int | None = None,
                     c2q_tile: bool | None = None, fused_merge: bool | None = None,
                     max_registers: int | None = None, unmasked_tiles: bool | None = None,
                     page_ahead: int | None = None, window: int = 0, block_m: int | None = None,
                     split_keys: int = 0, splits_in_program: bool = False):
    """Triton version of ``verify_attention_reference`` (see the module docstring).

    ``block_n`` keys per tile is independent of the pool's page size; it, ``num_warps`` and
    ``num_stages`` default to `launch_config` for the collection path taken. ``num_splits`` splits each
    request's context into that many equal ranges processed by separate programs and merged
    (flash-decoding); None picks `default_num_splits`, or with ``split_keys`` (splits of that
    many keys from position 0, see `verify_attention_into`) `invariant_num_splits`.

    ``c2q_tile``: collect through a small tile of the first and last rows only (valid when every
    collected row is one of its request's first or last; None: exactly when ``collect="c2q"``)
    instead of storing from the main tile.

    An engine attends the same batch in every layer; it passes what does not change so that no
    call reads the device from the host: ``max_ctx`` (the longest context), ``max_q`` (the most
    rows of one request) and ``row_slot`` (int32 [total] on the device: each flat row's index among
    the collected rows, -1 when not collected, as `collected_row_slots` builds it)."""
    if triton is None:
        raise RuntimeError("verify_attention needs Triton; use verify_attention_reference")
    total, heads, dim = q.shape
    rows_kept = collected_rows(q_start_loc, collect, total)
    batch = context_lens.shape[0]
    if max_q is None:
        max_q = int((q_start_loc[1:] - q_start_loc[:-1]).max()) if batch else 0
    if max_ctx is None:
        max_ctx = int(context_lens.max()) if batch else 0
    out = torch.empty_like(q)
    lse = torch.empty(total, heads, dtype=torch.float32, device=q.device)
    logits = None
    do_collect = _collects(collect)
    if do_collect:
        logits = torch.empty((len(rows_kept), heads, max_ctx), dtype=torch.bfloat16,
                             device=q.device)   # every entry is written by the kernel
        if row_slot is None:
            row_slot = collected_row_slots(rows_kept, total).to(q.device)
    if num_splits is None:
        num_splits = invariant_num_splits(max_ctx, split_keys) if split_keys else \
            default_num_splits(batch, k_cache.shape[2], max_ctx)
    if c2q_tile is None:
        c2q_tile = isinstance(collect, str) and collect == "c2q"
    verify_attention_into(q, k_cache, v_cache, block_tables, context_lens, q_start_loc, scale,
                          out, lse, max_q=max_q, num_splits=num_splits, logits=logits,
                          row_slot=row_slot, c2q_tile=c2q_tile, logits_len=max_ctx,
                          block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                          fused_merge=fused_merge, max_registers=max_registers,
                          unmasked_tiles=unmasked_tiles, page_ahead=page_ahead, window=window,
                          block_m=block_m, split_keys=split_keys,
                          splits_in_program=splits_in_program)
    return out, lse, (CollectedLogits(logits, rows_kept) if do_collect else None)


def verify_attention_into(q, k_cache, v_cache, block_tables, context_lens, q_start_loc,
                          scale: float, out, lse, *, max_q: int, num_splits: int, logits=None,
                          row_slot=None, c2q_tile: bool = False, logits_len: int = 0,
                          block_n: int | None = None, num_warps: int | None = None,
                          num_stages: int | None = None, fused_merge: bool | None = None,
                          max_registers: int | None = None,
                          unmasked_tiles: bool | None = None,
                          page_ahead: int | None = None, window: int = 0, block_m: int | None = None,
                          split_keys: int = 0, splits_in_program: bool = False):
    """The launch behind `verify_attention`, safe to capture in a CUDA graph: every output is
    given (``out`` like q, ``lse`` float32 [total, heads], ``logits`` bf16 [R, heads, W] or None
    for no collection, with ``row_slot`` int32 [total] mapping flat rows to its R rows) and every
    size is a host number, so nothing is read back from the device. ``max_q`` bounds the rows of
    one request; padding rows past ``q_start_loc[-1]`` and requests with no rows are allowed (their
    output rows are left unwritten). ``logits_len``: positions [ctx, logits_len) of collected rows
    are set to -inf (0: left unwritten, for a caller that never reads past each request's
    context).

    ``fused_merge``: the last split of each (request, KV head) merges the splits
    (`kernels.split_merge`); False launches `_merge_splits_kernel` after. ``max_registers`` caps
    registers per thread (Triton's ``maxnreg``; 0: no cap), which sets how many programs an SM
    holds. ``unmasked_tiles``: tiles that every row sees whole are attended without the masks;
    False masks every tile (the same output within rounding, not always bit for bit).
    ``page_ahead`` (0, 1 or 2): how many tiles ahead a program loads the block-table entries of
    the tile it will gather (0: in front of the gather; the same bits any way). ``window``: a
    sliding-window layer's (0: none; no collection with one). All of these,
    like the tile, warps and stages, default to `launch_config`'s. ``block_m``: the score tile's
    rows (default `tile_rows` of ``max_q``; at least ``max_q`` times the GQA group).
    ``split_keys`` > 0: split ``s`` covers keys [s * split_keys, (s + 1) * split_keys) of every
    request (a multiple of ``block_n``; ``num_splits`` of them must cover the longest context),
    and the splits are merged even when there is one, rescaled split by split (`fold_online`).
    ``splits_in_program`` (with ``split_keys``): one program per (request, KV head) attends those
    splits one after another and folds them alike: the same bits, no partial states in memory
    (``num_splits`` is then unused); the fused merge then folds split by split too. A
    ``block_m`` smaller than ``max_q`` rows of the GQA group takes each request's rows in chunks
    of ``block_m // group``, one program each (not with the first/last tile).
    `batch_invariant_launch` gives all of these for the batch-invariant mode. Returns the
    launched attention kernel (Triton's compiled kernel: `asm`, `n_regs`; for probes), None for
    an empty batch."""
    total, heads, dim = q.shape
    batch = context_lens.shape[0]
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    if batch == 0 or total == 0:
        return None
    collect_mode = 0 if logits is None else (2 if c2q_tile else 1)
    block_m = block_m or tile_rows(max_q, group)
    if block_m < group:
        raise ValueError(f"a {block_m}-row tile cannot hold one row of {group} heads")
    row_chunks = max(1, -(-max_q // (block_m // group)))
    # Chunked: a tile too small for some request's rows, or in the batch-invariant mode (fixed
    # splits) one smaller than 17 rows: then every call of that tile runs the chunked kernel,
    # whatever its rows (Triton compiles a decode step's count of 1 as a constant; the values'
    # arithmetic is the same, which `bench invariant` checks on the GPU). An unchunked launch
    # passes row_chunks 1, a constant there too: its code is as before the chunks (same SASS).
    chunked_rows = row_chunks > 1 or (split_keys > 0 and block_m // group < MAX_Q_ROWS)
    if row_chunks > 1 and collect_mode == 2:
        raise ValueError(f"the first/last tile needs every row of a request in one program: a "
                         f"{block_m}-row tile cannot hold {max_q} rows of {group} heads")
    cfg = launch_config(collect_mode, dim, block_m, max_q)
    block_n, num_warps = block_n or cfg.block_n, num_warps or cfg.num_warps
    if split_keys % block_n:
        raise ValueError(f"split_keys ({split_keys}) must be a multiple of block_n ({block_n})")
    if splits_in_program and not split_keys:
        raise ValueError("splits_in_program needs split_keys")
    num_stages = num_stages or cfg.num_stages
    fused_merge = cfg.fused_merge if fused_merge is None else fused_merge
    max_registers = cfg.max_registers if max_registers is None else max_registers
    unmasked_tiles = cfg.unmasked_tiles if unmasked_tiles is None else unmasked_tiles
    page_ahead = cfg.page_ahead if page_ahead is None else page_ahead
    if page_ahead not in (0, 1, 2):
        raise ValueError(f"page_ahead must be 0, 1 or 2, got {page_ahead}")
    if window and logits is not None:
        raise ValueError("a sliding-window call collects no logits")
    if logits is None:
        logits = torch.empty(1, 1, 1, dtype=torch.bfloat16, device=q.device)
        row_slot = torch.empty(1, dtype=torch.int32, device=q.device)
    block_d = max(16, triton.next_power_of_2(dim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if splits_in_program:
        num_splits = 1
    split = (num_splits > 1 or split_keys > 0) and not splits_in_program
    if split:
        part_acc = torch.empty(num_splits, total, heads, dim, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_splits, total, heads, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = torch.empty(1, dtype=torch.float32, device=q.device)
    fused_merge = fused_merge and split
    counters = arrival_counters(q.device, batch * row_chunks * kv_heads) if fused_merge else part_ml
    s_ps, s_pt, s_ph = total * heads, heads, 1     # in (row, head) units of the partial buffers
    extra = {"maxnreg": max_registers} if max_registers and not _interpreting() else {}
    # No programmatic dependent launch here: it measured within noise (bench/NOTES.md version 38).
    pdl = {"USE_PDL": False}
    # The page size (k_cache.shape[1]) is a compile-time constant (BLOCK_SIZE): a key's page
    # and offset are then arithmetic by a known constant, not a runtime integer division
    # (bench/NOTES.md, version 33).
    kernel_args = (q, k_cache, v_cache, out, lse, logits, row_slot, part_acc, part_ml, counters,
                   block_tables, context_lens, q_start_loc, float(scale), num_splits, split_keys,
                   logits_len, row_chunks,
                   *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), *lse.stride(),
                   *logits.stride(), block_tables.stride(0), s_ps, s_pt, s_ph, k_cache.shape[1])
    # Row chunks and the online fused merge only where asked: other launches compile as before.
    chunked = {"CHUNKED": True} if chunked_rows else {}
    if fused_merge and split_keys > 0:
        chunked["ONLINE_MERGE"] = True
    launched = _verify_attention_kernel[(batch * row_chunks, kv_heads, num_splits)](
        *kernel_args, GROUP=group, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d, BLOCK_C=max(16, triton.next_power_of_2(2 * group)), COLLECT=collect_mode,
        SPLIT=split, FUSED_MERGE=fused_merge, UNMASKED_TILES=bool(unmasked_tiles), PRECISION=precision,
        INTERPRET=_interpreting(), PAGE_AHEAD=page_ahead, WINDOW=int(window or 0),
        SPLIT_SEQ=splits_in_program,
        num_warps=num_warps, num_stages=num_stages, **chunked, **extra, **pdl)
    if split and not fused_merge:
        _merge_splits_kernel[(total,)](
            part_acc, part_ml, out, lse, heads, num_splits, s_ps, s_pt, s_ph, *out.stride(),
            *lse.stride(), HEAD_DIM=dim, BLOCK_H=max(2, triton.next_power_of_2(heads)),
            BLOCK_D=block_d, INTERPRET=_interpreting(), ONLINE=split_keys > 0, **pdl)
    return launched
