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

Returns ``(out, lse, logits)``:
- ``out`` ``[total_q_rows, num_heads, head_dim]`` in ``q``'s dtype;
- ``lse`` ``[total_q_rows, num_heads]`` float32, natural log-sum-exp of the scaled scores over each
  row's visible keys (so a key's softmax weight is ``exp(logit - lse)``);
- ``logits``: ``None`` for ``collect="none"``; otherwise ``CollectedLogits(logits, rows)`` where
  ``logits`` is bf16 ``[num_collected_rows, num_heads, max(context_lens)]`` holding the scaled
  pre-softmax scores ``scale * q.k`` and ``rows`` (int64 ``[num_collected_rows]``) is the flat query
  row each one belongs to. ``collect="c2q"`` keeps the first and last row of each request (one row
  when ``q_len == 1``), ``"all"`` every row, in request then row order. Positions a row cannot see
  (causally masked, or past its request's context) hold ``-inf``. Collecting never changes ``out``
  or ``lse``: the Triton kernel runs the same arithmetic and only adds stores.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

try:  # Triton is optional: the CPU engine path only needs the reference.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

COLLECT_MODES = ("none", "c2q", "all")


class CollectedLogits(NamedTuple):
    logits: torch.Tensor  # bf16 [num_collected_rows, num_heads, max_context], -inf where not visible
    rows: torch.Tensor    # int64 [num_collected_rows]: flat query row of each collected row


def collected_rows(q_start_loc: torch.Tensor, collect: str) -> torch.Tensor:
    """Flat query rows whose logits are kept, in request then row order (int64, on CPU)."""
    if collect not in COLLECT_MODES:
        raise ValueError(f"collect must be one of {COLLECT_MODES}, got {collect!r}")
    starts = q_start_loc.cpu().tolist()
    rows: list[int] = []
    for a, b in zip(starts[:-1], starts[1:]):
        if collect == "all":
            rows.extend(range(a, b))
        elif collect == "c2q":
            rows.extend([a] if b - a == 1 else [a, b - 1])
    return torch.tensor(rows, dtype=torch.long)


def verify_attention_reference(q, k_cache, v_cache, block_tables, context_lens, q_start_loc,
                               scale: float, collect: str = "none"):
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
        s = s.masked_fill(hidden[:, None, :], float("-inf"))
        lse[a:b] = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[a:b, :, None])
        out[a:b] = torch.einsum("rhc,chd->rhd", p, values).to(q.dtype)
        scores_all[a:b, :, :ctx] = s
    if collect == "none":
        return out, lse, None
    rows_dev = rows_kept.to(q.device)
    return out, lse, CollectedLogits(scores_all[rows_dev].to(torch.bfloat16), rows_kept)


if triton is not None:

    @triton.jit
    def _attend_tile(start, q_tile, row_pos, m_valid, head, slot, m_i, l_i, acc, k_ptr, v_ptr,
                     logits_ptr, tables_ptr, req, kvh, ctx, scale, s_kb, s_kt, s_kh, s_kd,
                     s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, block_size,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                     COLLECT: tl.constexpr, PRECISION: tl.constexpr):
        """One BLOCK_N-key tile: gather K/V through the block table, score, mask, (collect),
        and fold into the online-softmax state (m_i, l_i, acc)."""
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < HEAD_DIM
        pos = start + offs_n
        n_valid = pos < ctx
        page = tl.load(tables_ptr + req * s_tb + pos // block_size, mask=n_valid, other=0)
        base_k = page.to(tl.int64) * s_kb + (pos % block_size) * s_kt + kvh * s_kh
        base_v = page.to(tl.int64) * s_vb + (pos % block_size) * s_vt + kvh * s_vh
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k_tile = tl.load(k_ptr + base_k[:, None] + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        v_tile = tl.load(v_ptr + base_v[:, None] + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)

        s = tl.dot(q_tile, tl.trans(k_tile), input_precision=PRECISION) * scale
        visible = (pos[None, :] <= row_pos[:, None]) & n_valid[None, :] & m_valid[:, None]
        s = tl.where(visible, s, float("-inf"))
        if COLLECT:
            keep = (slot >= 0) & m_valid
            dst = (logits_ptr + slot.to(tl.int64)[:, None] * s_gr + head[:, None] * s_gh
                   + pos[None, :] * s_gc)
            tl.store(dst, s.to(tl.bfloat16), mask=keep[:, None] & n_valid[None, :])

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile,
                                            input_precision=PRECISION)
        m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def _verify_attention_kernel(
            q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, logits_ptr, slot_ptr,
            tables_ptr, ctx_ptr, qloc_ptr, scale,
            s_qt, s_qh, s_qd,
            s_kb, s_kt, s_kh, s_kd,
            s_vb, s_vt, s_vh, s_vd,
            s_ot, s_oh, s_od,
            s_lt, s_lh,
            s_gr, s_gh, s_gc,
            s_tb,
            block_size,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, COLLECT: tl.constexpr,
            PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
        """One program = one request x one KV head: all GROUP query heads of all the request's rows
        form the BLOCK_M-row tile (row m: query row m // GROUP, head kvh * GROUP + m % GROUP), so each
        K/V block is read once. Online softmax over BLOCK_N-key tiles gathered via the block table."""
        req = tl.program_id(0)
        kvh = tl.program_id(1)
        q_start = tl.load(qloc_ptr + req)
        q_len = tl.load(qloc_ptr + req + 1) - q_start
        ctx = tl.load(ctx_ptr + req)

        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        row = offs_m // GROUP
        head = kvh * GROUP + offs_m % GROUP
        m_valid = offs_m < q_len * GROUP
        d_valid = offs_d < HEAD_DIM
        row_pos = ctx - q_len + row                                    # last key each row sees

        q_tile = tl.load(q_ptr + (q_start + row)[:, None] * s_qt + head[:, None] * s_qh
                         + offs_d[None, :] * s_qd,
                         mask=m_valid[:, None] & d_valid[None, :], other=0.0)
        slot = tl.load(slot_ptr + q_start + row, mask=m_valid & COLLECT, other=-1)

        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)          # finite: padded rows stay NaN-free
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if INTERPRET:
            # Triton 3.6's interpreter cannot take a loaded scalar as a range() bound under NumPy 2
            # (its __index__ calls int() on a 1-element array); a while loop evaluates the same.
            start = 0
            while start < ctx:
                m_i, l_i, acc = _attend_tile(
                    start, q_tile, row_pos, m_valid, head, slot, m_i, l_i, acc, k_ptr, v_ptr,
                    logits_ptr, tables_ptr, req, kvh, ctx, scale, s_kb, s_kt, s_kh, s_kd,
                    s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, block_size,
                    BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION)
                start += BLOCK_N
        else:
            for start in range(0, ctx, BLOCK_N):
                m_i, l_i, acc = _attend_tile(
                    start, q_tile, row_pos, m_valid, head, slot, m_i, l_i, acc, k_ptr, v_ptr,
                    logits_ptr, tables_ptr, req, kvh, ctx, scale, s_kb, s_kt, s_kh, s_kd,
                    s_vb, s_vt, s_vh, s_vd, s_gr, s_gh, s_gc, s_tb, block_size,
                    BLOCK_N, BLOCK_D, HEAD_DIM, COLLECT, PRECISION)

        l_safe = tl.where(l_i > 0, l_i, 1.0)
        acc = acc / l_safe[:, None]
        o_rows = (q_start + row)
        tl.store(out_ptr + o_rows[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :] * s_od,
                 acc.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
        tl.store(lse_ptr + o_rows * s_lt + head * s_lh, m_i + tl.log(l_safe), mask=m_valid)


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


def verify_attention(q, k_cache, v_cache, block_tables, context_lens, q_start_loc,
                     scale: float, collect: str = "none", block_n: int = 32):
    """Triton version of ``verify_attention_reference`` (single pass; see the module docstring).
    ``block_n`` keys per tile is independent of the pool's page size."""
    if triton is None:
        raise RuntimeError("verify_attention needs Triton; use verify_attention_reference")
    rows_kept = collected_rows(q_start_loc, collect)
    total, heads, dim = q.shape
    batch = context_lens.shape[0]
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    max_q = int((q_start_loc[1:] - q_start_loc[:-1]).max()) if batch else 0
    out = torch.empty_like(q)
    lse = torch.empty(total, heads, dtype=torch.float32, device=q.device)
    max_ctx = int(context_lens.max()) if batch else 0
    do_collect = collect != "none"
    if do_collect:
        logits = torch.full((len(rows_kept), heads, max_ctx), float("-inf"),
                            dtype=torch.bfloat16, device=q.device)
        slot = torch.full((total,), -1, dtype=torch.int32)
        slot[rows_kept] = torch.arange(len(rows_kept), dtype=torch.int32)
        slot = slot.to(q.device)
    else:
        logits = torch.empty(1, 1, 1, dtype=torch.bfloat16, device=q.device)
        slot = torch.empty(1, dtype=torch.int32, device=q.device)
    if batch == 0 or total == 0:
        return out, lse, (CollectedLogits(logits, rows_kept) if do_collect else None)
    block_m = max(16, triton.next_power_of_2(max_q * group))
    block_d = max(16, triton.next_power_of_2(dim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _verify_attention_kernel[(batch, kv_heads)](
        q, k_cache, v_cache, out, lse, logits, slot,
        block_tables, context_lens, q_start_loc, float(scale),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), *lse.stride(),
        *logits.stride(), block_tables.stride(0), k_cache.shape[1],
        GROUP=group, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        COLLECT=do_collect, PRECISION=precision, INTERPRET=_interpreting())
    return out, lse, (CollectedLogits(logits, rows_kept) if do_collect else None)
