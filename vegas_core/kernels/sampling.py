"""Sampling for a batch, one Triton program per row, without sorting the vocabulary: the
temperature, top-k, top-p and min-p filter of `vegas_core.sampling.probs_from_tensors` and the
exponential race of `vegas_core.sampling.sample_keyed` over the request's counter-based stream
(`vegas_core.random_streams`), fused. Beside them `sample_rows_reference` and `race_reference`,
the same signatures in plain PyTorch (those two functions).

Why: the PyTorch form sorts every row of the vocabulary for top-p, then hashes and races over
[rows, V] in a dozen int64 passes, 10-13 times this kernel's time (bench/NOTES.md, sampling).

The filter is a set of thresholds on the scaled logits x = logit / T (greedy rows, T = 0: a one-hot
at the first argmax), so it needs no order, only the threshold (`probs_from_tensors` states the
rule): each is the largest order-preserving int32 key of x whose count (top-k) or mass (top-p)
of entries at or above it reaches the target, found by a (WAYS + 1)-ary search over the key range:
each pass counts or sums at WAYS candidate keys at once. The searches go over a few compacted
candidates, not the row: for top-k the entries at or above the k-th largest of the row's sub-tile
maxima (kept in registers by the first pass; exact: k entries lie at or above it), for top-p
without top-k those that can be in the nucleus at all. A top-k row with k above the sub-tile
count (`topk_bound_tiles`: 594 for 151,936 tokens in the default tiles) searches over the whole
row instead, a dozen passes (see the kernel).

Contract:
- `sample_rows(logits, params, keys, positions, tag, sample=True)` -> ``(probs, tokens)``:
  ``logits`` float [N, V]; ``params`` float32 [4, N] as `vegas_core.sampling.sampling_tensors`
  builds it (temperature, top-k with V for off, top-p, min-p); ``keys``, ``positions`` int64 [N]:
  each row's stream key and the position it samples for (None without ``sample``); ``tag``: the
  purpose (`random_streams.TOKEN`, `DRAFT`). probs float32 [N, V], tokens int64 [N] (None
  without ``sample``).
- `race(weights, keys, positions, tag)` -> tokens: the race alone over non-negative weights, not
  normalised (a rejection's residual max(0, p - q)).

Agreement with the reference (tests/vegas_core/kernels/test_sampling.py): probabilities within float32
rounding (exp and the sums' order differ), the same kept sets except where a top-p boundary mass
lies within rounding of the target, the same tokens except where two race values tie within
rounding (compiled, the log is CUDA's logf as torch's; NumPy's under the interpreter); the
uniforms themselves are the same bits.
"""
from __future__ import annotations

import torch

try:  # Triton is optional: the CPU engine path only needs the reference.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

def sample_rows_reference(logits, params, keys, positions, tag: int, sample: bool = True):
    """`sample_rows` in PyTorch: `probs_from_tensors` (filtered form) then `sample_keyed`."""
    from vegas_core.sampling import probs_from_tensors, sample_keyed
    probs = probs_from_tensors(logits, *params)
    return probs, (sample_keyed(probs, keys, positions, tag) if sample else None)


def race_reference(weights, keys, positions, tag: int):
    """`race` in PyTorch: `sample_keyed`."""
    from vegas_core.sampling import sample_keyed
    return sample_keyed(weights, keys, positions, tag)


if triton is not None:

    @triton.jit
    def _mix32(x):
        """`random_streams._mix32` (lowbias32) on uint32: the products wrap mod 2^32 as the int64
        version's masks make them."""
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        return x ^ (x >> 16)

    @triton.jit
    def _uniforms(row_hash, offs):
        """`random_streams.uniforms` for columns ``offs`` of a row whose hashed (key, position,
        tag) is ``row_hash``: the same bits."""
        col = _mix32(offs.to(tl.uint32) * 0x9E3779B9 + 1)
        h = _mix32(row_hash ^ col)
        return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)   # `unit_interval`

    @triton.jit
    def _key(x):
        """Order-preserving int32 key of a float32 (x has no -0.0: the caller adds +0.0)."""
        b = x.to(tl.int32, bitcast=True)
        return b ^ ((b >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _scaled_at(logits_ptr, row_off, offs, V: tl.constexpr, T):
        """Columns ``offs`` (any shape) of the row as x = logit / T (the reference divides too);
        -inf past V. Adding +0.0 turns -0.0 into +0.0, so keys compare as the floats do."""
        valid = offs < V
        x = tl.load(logits_ptr + row_off + offs, mask=valid, other=float("-inf"))
        return valid, x / T + 0.0

    @triton.jit
    def _scaled(logits_ptr, row_off, start, V: tl.constexpr, T, BLOCK: tl.constexpr):
        """Columns [start, start + BLOCK) of the row, scaled (`_scaled_at`)."""
        offs = start + tl.arange(0, BLOCK)
        valid, x = _scaled_at(logits_ptr, row_off, offs, V, T)
        return offs, valid, x

    @triton.jit
    def _neg_log(u, INTERPRET: tl.constexpr):
        """-log(u) as torch computes it: compiled, libdevice's logf is CUDA's, the one torch's
        log calls, so the race's values are `sample_keyed`'s. `tl.log` makes no such promise (a
        fast approximation's relative error near u = 1, where the race's winners draw, is far
        above an ulp); the two were not timed or compared apart. The interpreter has no
        libdevice; NumPy's log is accurate."""
        if INTERPRET:
            return -tl.log(u)
        else:
            return -libdevice.log(u)

    @triton.jit
    def _race_tile(w, offs, valid, row_hash, best, best_i, V: tl.constexpr, INTERPRET: tl.constexpr):
        """Fold one tile of weights into the race's running (max, first argmax)."""
        r = tl.where(valid, w / _neg_log(_uniforms(row_hash, offs), INTERPRET), -1.0)
        c = tl.max(r, axis=0)
        c_i = tl.min(tl.where(r == c, offs, V), axis=0)
        return tl.maximum(best, c), tl.where(c > best, c_i, best_i)

    @triton.jit
    def _candidate_keys(lo, hi, WAYS: tl.constexpr):
        """WAYS keys spaced evenly over (lo, hi], the last at hi (int64)."""
        step = (hi - lo + WAYS) // (WAYS + 1)
        return tl.minimum(lo + step * (tl.arange(0, WAYS).to(tl.int64) + 1), hi)

    @triton.jit
    def _narrow(cand, totals, target, lo, hi):
        """A search pass's verdict: `totals` (a count or mass at each candidate key) never grows
        with the key, so the candidates reaching `target` are a prefix; the threshold lies
        between the last that does (else lo) and the key before the first that does not."""
        ok = totals >= target
        return tl.max(tl.where(ok, cand, lo)), tl.minimum(hi, tl.min(tl.where(ok, hi + 1, cand)) - 1)

    @triton.jit
    def _count_search(logits_ptr, row_off, V: tl.constexpr, T, lo, hi, target,
                      BLOCK: tl.constexpr, WAYS: tl.constexpr):
        """The largest int32 key t in [lo, hi] with at least `target` of the row's entries at or
        above it (top-k's threshold): each pass over the row counts at WAYS keys at once
        (`_candidate_keys`, `_narrow`). The count at lo reaches the target (the caller's
        promise)."""
        lo = lo.to(tl.int64)
        hi = hi.to(tl.int64)
        while lo < hi:
            cand = _candidate_keys(lo, hi, WAYS)
            acc = tl.zeros([BLOCK, WAYS], dtype=tl.float32)
            for start in range(0, V, BLOCK):
                offs, valid, x = _scaled(logits_ptr, row_off, start, V, T, BLOCK)
                key = _key(x).to(tl.int64)
                acc += tl.where(valid[:, None] & (key[:, None] >= cand[None, :]), 1.0, 0.0)
            lo, hi = _narrow(cand, tl.sum(acc, axis=0), target, lo, hi)
        return lo

    @triton.jit
    def _key_search(keys, lo, hi, target, WAYS: tl.constexpr):
        """`_count_search` over a 1-D register tensor of keys: the largest key t in [lo, hi] with at
        least `target` of them at or above it (the count at lo reaches it)."""
        lo = lo.to(tl.int64)
        hi = hi.to(tl.int64)
        while lo < hi:
            cand = _candidate_keys(lo, hi, WAYS)
            count = tl.sum((keys.to(tl.int64)[:, None] >= cand[None, :]).to(tl.float32), axis=0)
            lo, hi = _narrow(cand, count, target, lo, hi)
        return lo

    @triton.jit
    def _compact(logits_ptr, row_off, V: tl.constexpr, T, m, lo, floor, out_ptr,
                 BLOCK: tl.constexpr):
        """Stores the row's entries with key >= lo and exp(x - m) >= floor at out_ptr[0:n], in row
        order (the probs row as scratch): (n, their least key)."""
        n = tl.full([], 0, dtype=tl.int32)
        m_key = _key(m)
        least = m_key
        for start in range(0, V, BLOCK):
            offs, valid, x = _scaled(logits_ptr, row_off, start, V, T, BLOCK)
            key = _key(x)
            keep = valid & (key >= lo) & (tl.exp(x - m) >= floor)
            flag = keep.to(tl.int32)
            tl.store(out_ptr + n + tl.cumsum(flag, axis=0) - flag, x, mask=keep)
            n += tl.sum(flag, axis=0)
            least = tl.minimum(least, tl.min(tl.where(keep, key, m_key), axis=0))
        tl.debug_barrier()     # the candidates, stored by every thread, read by all
        return n, least

    @triton.jit
    def _candidate_search(cand_ptr, n_c, m, lo, hi, target, MASS: tl.constexpr,
                          BLOCK: tl.constexpr, WAYS: tl.constexpr):
        """`_count_search` over the compacted candidates (scaled logits at cand_ptr[0:n_c]): the
        largest key t in [lo, hi] with the count (top-k) or, with MASS, the mass exp(x - m)
        (top-p) of candidates at or above it reaching `target`. Exact for the row where every
        entry with key >= lo is a candidate. While loops over the runtime count: the interpreter
        takes no loaded bound in range()."""
        lo = lo.to(tl.int64)
        hi = hi.to(tl.int64)
        while lo < hi:
            cand = _candidate_keys(lo, hi, WAYS)
            acc = tl.zeros([BLOCK, WAYS], dtype=tl.float32)
            start = 0
            while start < n_c:
                offs = start + tl.arange(0, BLOCK)
                x = tl.load(cand_ptr + offs, mask=offs < n_c, other=float("-inf"))
                above = _key(x).to(tl.int64)[:, None] >= cand[None, :]
                if MASS:
                    acc += tl.where(above, tl.exp(x - m)[:, None], 0.0)
                else:
                    acc += tl.where(above, 1.0, 0.0)
                start += BLOCK
            lo, hi = _narrow(cand, tl.sum(acc, axis=0), target, lo, hi)
        return lo

    @triton.jit
    def _candidate_mass(cand_ptr, n_c, m, t, min_p, BLOCK: tl.constexpr):
        """The mass exp(x - m) of the candidates with key >= t and exp(x - m) >= min_p."""
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        start = 0
        while start < n_c:
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(cand_ptr + offs, mask=offs < n_c, other=float("-inf"))
            e = tl.exp(x - m)
            acc += tl.where((_key(x) >= t) & (e >= min_p), e, 0.0)
            start += BLOCK
        return tl.sum(acc, axis=0)

    @triton.jit
    def _sample_rows_kernel(logits_ptr, s_l, probs_ptr, s_p, tok_ptr, params_ptr, s_par,
                            keys_ptr, pos_ptr, salt, n_c_ptr, V: tl.constexpr,
                            FILTERED: tl.constexpr, SAMPLE: tl.constexpr, BLOCK: tl.constexpr,
                            BLOCK_S: tl.constexpr, WAYS: tl.constexpr, MAXIMA: tl.constexpr,
                            NT_PAD: tl.constexpr, NS: tl.constexpr, TOPK_CANDIDATES: tl.constexpr,
                            N_C_OUT: tl.constexpr, INTERPRET: tl.constexpr):
        """One program per row (the vocabulary V is a compile-time constant: one compile per
        model, and the loops over it need no loaded bound). Passes over the row:
        1. the max of x (its first argmax for greedy rows) and the mass exp(x - max), online, and
           with TOPK_CANDIDATES the max of each sub-tile of BLOCK / MAXIMA columns (NS of them);
        2. top-k rows with k <= NS: the k-th largest sub-tile max L is at most the row's k-th
           largest entry (k sub-tiles hold an entry >= L each), so the entries with x >= L are
           compacted into the probs row, used as scratch, and the count search runs over them:
           counts at keys >= key(L) are the row's, so the threshold is the full search's. Other
           top-k rows: the count search over the row (`_count_search`, several passes), then
           the survivors' mass;
        3. top-p rows: the mass search over the compacted candidates: top-k's, else those with
           exp(x - m) >= (1 - top_p) * mass / V (the entries below hold less than 1 - top_p
           of the mass together), compacted now. The kept mass is summed over the candidates
           where there are any, else over the row;
        4. the probabilities written and, with SAMPLE, the race.
        A top-k row reads the row three times (1, 2's compaction, 4). Without FILTERED the row
        holds weights: the race alone, one pass. N_C_OUT stores each row's candidate count
        (0: none compacted) at n_c_ptr, for the tests and the bench."""
        row = tl.program_id(0)
        row_off = row.to(tl.int64) * s_l
        out_ptr = probs_ptr + row.to(tl.int64) * s_p
        row_hash = tl.full([], 0, dtype=tl.uint32)
        if SAMPLE:
            row_hash = _mix32(_mix32(tl.load(keys_ptr + row).to(tl.uint32) ^ salt.to(tl.uint32))
                              + tl.load(pos_ptr + row).to(tl.uint32))
        best = tl.full([], -float("inf"), dtype=tl.float32)
        best_i = tl.full([], 0, dtype=tl.int32)
        if FILTERED:
            T = tl.load(params_ptr + row)
            top_k = tl.load(params_ptr + s_par + row)
            top_p = tl.load(params_ptr + 2 * s_par + row)
            min_p = tl.load(params_ptr + 3 * s_par + row)
            greedy = T == 0
            sampled = T > 0
            T = tl.where(greedy, 1.0, T)
            m = tl.full([], -float("inf"), dtype=tl.float32)
            m_i = tl.full([], 0, dtype=tl.int32)
            z = tl.full([], 0.0, dtype=tl.float32)
            # The keys of the sub-tile maxima, [tile, sub-tile]; slots past the last tile hold the
            # lowest int32 key, below any entry's, so they never raise top-k's bound.
            maxima = tl.full([NT_PAD, MAXIMA], -2147483648, dtype=tl.int32)
            tiles = tl.arange(0, NT_PAD)
            SUB: tl.constexpr = BLOCK // MAXIMA
            for start in range(0, V, BLOCK):
                # The tile as [MAXIMA, SUB]: row i is sub-tile i, in memory order.
                offs = start + tl.arange(0, MAXIMA)[:, None] * SUB + tl.arange(0, SUB)[None, :]
                valid, x = _scaled_at(logits_ptr, row_off, offs, V, T)
                sub = tl.max(x, axis=1)
                c = tl.max(sub, axis=0)
                c_i = tl.min(tl.min(tl.where(x == c, offs, V), axis=1), axis=0)
                m_new = tl.maximum(m, c)
                z = z * tl.exp(m - m_new) + tl.sum(tl.sum(tl.exp(x - m_new), axis=1), axis=0)
                m_i = tl.where(c > m, c_i, m_i)
                m = m_new
                if TOPK_CANDIDATES:
                    maxima = tl.where(tiles[:, None] == start // BLOCK, _key(sub)[None, :], maxima)
            t = tl.full([], -2147483648, dtype=tl.int64)   # the lowest int32 key: keep everything
            m_key = _key(m)
            n_c = tl.full([], 0, dtype=tl.int32)
            if sampled:
                if top_k < V:
                    if TOPK_CANDIDATES and top_k <= NS:
                        # Every entry top-k can keep is at or above the k-th largest sub-tile
                        # max (pass 2 in the docstring); counts above it are the row's.
                        bound = _key_search(tl.reshape(maxima, [NT_PAD * MAXIMA]), t, m_key,
                                            top_k, WAYS)
                        n_c, _ = _compact(logits_ptr, row_off, V, T, m, bound, 0.0, out_ptr, BLOCK)
                        t = _candidate_search(out_ptr, n_c, m, bound, m_key, top_k, False,
                                              BLOCK_S, WAYS)
                        z = _candidate_mass(out_ptr, n_c, m, t, 0.0, BLOCK_S)
                    else:
                        t = _count_search(logits_ptr, row_off, V, T, t, m_key, top_k, BLOCK_S, WAYS)
                        zk = tl.zeros([BLOCK], dtype=tl.float32)
                        for start in range(0, V, BLOCK):
                            offs, valid, x = _scaled(logits_ptr, row_off, start, V, T, BLOCK)
                            zk += tl.where(valid & (_key(x) >= t), tl.exp(x - m), 0.0)
                        z = tl.sum(zk, axis=0)
                if top_p < 1.0:
                    lo = t
                    if n_c == 0:      # no top-k candidates: the nucleus's own, above its floor
                        n_c, least = _compact(logits_ptr, row_off, V, T, m, t,
                                              (1.0 - top_p) * z / V, out_ptr, BLOCK)
                        lo = tl.maximum(t, least.to(tl.int64))
                    t = _candidate_search(out_ptr, n_c, m, lo, m_key, top_p * z, True, BLOCK_S, WAYS)
            if N_C_OUT:
                tl.store(n_c_ptr + row, n_c)
            z2 = tl.full([], 0.0, dtype=tl.float32)
            if n_c > 0:
                z2 = _candidate_mass(out_ptr, n_c, m, t, min_p, BLOCK_S)
            else:
                for start in range(0, V, BLOCK):
                    offs, valid, x = _scaled(logits_ptr, row_off, start, V, T, BLOCK)
                    e = tl.exp(x - m)
                    z2 += tl.sum(tl.where(valid & (_key(x) >= t) & (e >= min_p), e, 0.0), axis=0)
            inv_z = 1.0 / z2
            tl.debug_barrier()         # every candidate read before the probabilities overwrite them
            for start in range(0, V, BLOCK):
                offs, valid, x = _scaled(logits_ptr, row_off, start, V, T, BLOCK)
                e = tl.exp(x - m)
                p = tl.where(valid & (_key(x) >= t) & (e >= min_p), e * inv_z, 0.0)
                p = tl.where(greedy, tl.where(offs == m_i, 1.0, 0.0), p)
                tl.store(out_ptr + offs, p, mask=valid)
                if SAMPLE:
                    best, best_i = _race_tile(p, offs, valid, row_hash, best, best_i, V, INTERPRET)
        else:
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                valid = offs < V
                w = tl.load(logits_ptr + row_off + offs, mask=valid, other=0.0)
                best, best_i = _race_tile(w, offs, valid, row_hash, best, best_i, V, INTERPRET)
        if SAMPLE:
            tl.store(tok_ptr + row, best_i.to(tl.int64))


# Sub-tile maxima a tile keeps for top-k's bound: BLOCK / MAXIMA columns each (256 at the
# default 4,096), so a 151,936-token row has 594 and any k up to that takes the candidates.
MAXIMA = 16


def _tiles(vocab: int, block: int) -> int:
    return -(-vocab // block)


def topk_bound_tiles(vocab: int, block: int) -> int:
    """How many sub-tile maxima a row of ``vocab`` in tiles of ``block`` has: a top-k row with
    k at most this (and below ``vocab``) takes the candidate path, the others the full search."""
    return _tiles(vocab, block // min(MAXIMA, block))


def _launch(logits, params, keys, positions, tag, probs, tokens, block, ways, num_warps,
            topk_candidates=True, n_c=None):
    if triton is None:
        raise RuntimeError("kernels.sampling needs Triton; use the *_reference functions")
    from vegas_core.random_streams import tag_salt
    n, vocab = logits.shape
    if n == 0:
        return
    block = block or min(4096, max(16, triton.next_power_of_2(vocab)))
    maxima = min(MAXIMA, block) if topk_candidates else 1
    # A variant's unused outputs and inputs point at the logits (never touched).
    probs_arg = logits if probs is None else probs
    if tokens is not None:
        keys, positions = keys.to(torch.int64).contiguous(), positions.to(torch.int64).contiguous()
    _sample_rows_kernel[(n,)](
        logits, logits.stride(0), probs_arg, probs_arg.stride(0),
        logits if tokens is None else tokens, logits if params is None else params, n,
        logits if tokens is None else keys, logits if tokens is None else positions, tag_salt(tag),
        logits if n_c is None else n_c, vocab, FILTERED=probs is not None,
        SAMPLE=tokens is not None, BLOCK=block, BLOCK_S=min(block, 1024), WAYS=ways,
        MAXIMA=maxima, NT_PAD=triton.next_power_of_2(_tiles(vocab, block)),
        NS=topk_bound_tiles(vocab, block), TOPK_CANDIDATES=topk_candidates,
        N_C_OUT=n_c is not None, INTERPRET=bool(triton.knobs.runtime.interpret), num_warps=num_warps)


# The engine's top-k path: the candidate search (bench/NOTES.md version 64: the same kept sets and
# tokens as the full-row search on an H100, 8x faster at Qwen's card); False: the full-row search.
TOPK_CANDIDATES = True


def sample_rows(logits, params, keys, positions, tag: int, sample: bool = True,
                block: int | None = None, ways: int = 4, num_warps: int = 8,
                topk_candidates: bool | None = None, candidates: torch.Tensor | None = None):
    """Triton version of `sample_rows_reference` (see the module docstring): (probs, tokens),
    tokens None without ``sample``. ``block`` columns per tile of a pass (default 4096, or the
    vocabulary rounded up to a power of two when smaller; the searches take tiles of at most
    1024), ``ways`` candidate keys per search pass (a power of two). The defaults are the fastest
    measured on the H200 (bench/results/sampling-2026-12-02-h200*.json).
    ``topk_candidates``: top-k over the compacted candidates (True) or a search over the whole
    row (False, the kernel before bench/NOTES.md version 61); None: `TOPK_CANDIDATES`. ``candidates``: an int32 [N]
    tensor that receives each row's compacted candidate count (0: none), for tests and the
    bench. No host read: safe in a CUDA graph."""
    topk_candidates = TOPK_CANDIDATES if topk_candidates is None else topk_candidates
    logits = logits.float()
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    probs = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device) if sample else None
    _launch(logits, params.to(torch.float32).contiguous(), keys, positions, tag, probs,
            tokens, block, ways, num_warps, topk_candidates, candidates)
    return probs, tokens


def race(weights, keys, positions, tag: int, block: int | None = None, num_warps: int = 8):
    """Triton version of `race_reference`: one token per row of non-negative ``weights`` [N, V]."""
    weights = weights.float()
    weights = weights if weights.stride(1) == 1 else weights.contiguous()
    tokens = torch.empty(weights.shape[0], dtype=torch.int64, device=weights.device)
    _launch(weights, None, keys, positions, tag, None, tokens, block, 4, num_warps, False)
    return tokens
