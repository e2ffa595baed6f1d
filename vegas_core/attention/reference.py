"""PyTorch reference attention over the paged pool: dense with causal masking for any number of query
rows, logit collection for chosen rows (Collect-2-Query and friends), and gathered sparse attention
for draft steps. Written for clarity and exactness, one request at a time; the Triton kernels are
tested against the same maths. Sliding-window layers (`windows[layer]`, Gemma 3's local layers) see
only the last `window` keys of each row, whatever the step: no draft selection and no logit
collection there (their window is already small; selection is for the global layers)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..kv_cache import KVPool
from .metadata import AttentionMetadata, SeqAttention


def dense_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """q [rows, H, d], k [ctx, KVH, d] -> scaled scores [rows, H, ctx] in float32 (grouped-query:
    query head h reads KV head h // (H // KVH))."""
    rows, heads, dim = q.shape
    kvh = k.shape[1]
    qg = q.float().view(rows, kvh, heads // kvh, dim)
    s = torch.einsum("rkgd,ckd->rkgc", qg, k.float()) * scale
    return s.reshape(rows, heads, -1)


def causal_mask(rows: int, ctx: int, device) -> torch.Tensor:
    """True where query row r (at position ctx - rows + r) may not see key c."""
    r = torch.arange(rows, device=device)[:, None]
    c = torch.arange(ctx, device=device)[None, :]
    return c > (ctx - rows + r)


def window_mask(rows: int, ctx: int, window: int, device) -> torch.Tensor:
    """`causal_mask`, and also True where key c is `window` or more positions before row r's."""
    r = torch.arange(rows, device=device)[:, None]
    c = torch.arange(ctx, device=device)[None, :]
    pos = ctx - rows + r
    return (c > pos) | (c <= pos - window)


# On a GPU torch may send a masked call to cuDNN, which builds an execution plan for every new
# (rows, keys) shape: tens to hundreds of ms a prefill step, paid at random by chunks whose lengths
# follow request arrivals (bench/NOTES.md version 66). Flash, memory-efficient and math need none.
GPU_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           scale: float | None = None, gqa: bool = True, causal: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention` over [..., heads, rows, d] (`gqa`: query head h reads KV
    head h // (heads // kv_heads); `causal`: rows and keys are the same positions, row r sees keys
    up to r); on a GPU never through cuDNN (`attend_gpu`)."""
    if q.is_cuda:
        return attend_gpu(q, k, v, mask, scale, gqa, causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa,
                                          is_causal=causal)


def attend_gpu(q, k, v, mask=None, scale=None, gqa: bool = True, causal: bool = False) -> torch.Tensor:
    """`attend` on `GPU_SDPA_BACKENDS`. The memory-efficient kernel, the one that takes a mask,
    does not group query heads, so a masked grouped call gets its KV heads repeated first (else
    it would fall to the math kernel, which materialises every score)."""
    if mask is not None and gqa and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    with sdpa_kernel(GPU_SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal,
                                              enable_gqa=gqa and k.shape[-3] != q.shape[-3])


def weighted_values(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """p [rows, H, ctx] float32, v [ctx, KVH, d] -> [rows, H, d] float32."""
    rows, heads, ctx = p.shape
    kvh = v.shape[1]
    out = torch.einsum("rkgc,ckd->rkgd", p.view(rows, kvh, heads // kvh, ctx), v.float())
    return out.reshape(rows, heads, -1)


class ReferenceBackend:
    name = "reference"

    def __init__(self, scale: float, windows=()):
        self.scale = scale
        self.windows = tuple(windows)   # per layer: keys a query sees (None: all); () = all None

    def _window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                pool: KVPool, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, d], k/v [T, KVH, d] (new tokens, already rotated) -> [T, H, d]. k = v = None:
        the new tokens' K/V are already in the pool at `meta.slot_mapping`."""
        if k is not None:
            pool.write(layer, meta.slot_mapping, k, v)
        kf, vf = pool.flat(layer)
        out = torch.empty_like(q)
        batch = meta.decode_batch
        window = self._window(layer)
        if batch is not None:
            out[batch.q_rows] = self._decode_batch(q[batch.q_rows], kf, vf, batch, window).to(q.dtype)
        for i, seq in enumerate(meta.seqs):
            if batch is not None and i in batch.seq_indices:
                continue
            qs = q[seq.q_start: seq.q_start + seq.q_len]
            if seq.sparse is not None and window is None:
                o = self._sparse(layer, qs, kf, vf, seq)
            elif window is not None:
                o = self._windowed(qs, kf, vf, seq, window)
                if seq.sparse is not None and seq.sparse.wants_recall:
                    seq.sparse.record_recall(layer, 1.0)   # a draft sees the target's own window
            else:
                o = self._dense(layer, i, qs, kf, vf, seq, meta)
            out[seq.q_start: seq.q_start + seq.q_len] = o.to(q.dtype)
        return out

    def _dense(self, layer, i, q, kf, vf, seq: SeqAttention, meta: AttentionMetadata):
        keys, values = kf[seq.key_slots], vf[seq.key_slots]
        # The output always comes from the same fused call, so collecting cannot change it (and a
        # verification that collects stays bit-identical to one that does not).
        out = self._sdpa(q, keys, values)
        if seq.collect_rows is not None and meta.collector is not None:
            rows = torch.as_tensor(seq.collect_rows, device=q.device)
            s = dense_scores(q[rows], keys, self.scale)               # the softmax inputs of those rows
            mask = causal_mask(q.shape[0], keys.shape[0], q.device)[rows]
            s = s.masked_fill(mask[:, None, :], float("-inf"))
            meta.collector.put(i, layer, s[:, :, : seq.collect_upto], torch.logsumexp(s, dim=-1))
        return out

    def _windowed(self, q, kf, vf, seq: SeqAttention, window: int):
        """Rows of a sliding-window layer (prefill, verification or a draft step alike): only the
        keys some row can see are gathered, so a step reads at most `window + rows - 1` of them."""
        rows, ctx = q.shape[0], seq.ctx_len
        lo = max(0, ctx - rows - window + 1)
        slots = seq.key_slots[lo:]
        mask = ~window_mask(rows, ctx, window, q.device)[:, lo:]
        o = attend(q.transpose(0, 1)[None], kf[slots].transpose(0, 1)[None], vf[slots].transpose(0, 1)[None],
                   mask, self.scale)
        return o[0].transpose(0, 1)

    def _decode_batch(self, q, kf, vf, batch, window: int | None = None):
        """Single-token full attention for B requests at once over their padded key slots.
        q [B, H, d] -> [B, H, d]. Each KV head's query group is a row block of its own, so no KV
        head is expanded in memory. A sliding layer masks keys `window` or more before the query."""
        b, heads, d = q.shape
        kvh = kf.shape[1]
        slots, valid = batch.slots, batch.valid
        if window is not None and window < slots.shape[1]:
            # Gather each row's last `window` positions only (a sliding layer reads its window,
            # not the context): columns from max(0, length - window), valid below the length.
            lengths = valid.sum(-1, keepdim=True)
            cols = (lengths - window).clamp(min=0) + torch.arange(window, device=slots.device)[None, :]
            valid = cols < lengths
            slots = slots.gather(1, cols.clamp(max=slots.shape[1] - 1))
        keys = kf[slots].transpose(1, 2)                              # [B, KVH, L, d]
        values = vf[slots].transpose(1, 2)
        qg = q.view(b, kvh, heads // kvh, d)                           # [B, KVH, G, d]
        o = attend(qg, keys, values, valid[:, None, None, :], self.scale, gqa=False)
        return o.reshape(b, heads, d)

    def _sdpa(self, q, keys, values, causal: bool = True):
        """Attention without collection through torch's fused kernel (same maths, less overhead).
        q [rows, H, d], keys/values [ctx, KVH, d]; causal: row r sees keys up to ctx - rows + r."""
        rows, ctx = q.shape[0], keys.shape[0]
        # A GPU chunk that starts a prompt needs no mask: Flash takes it, grouped heads and all.
        square = q.is_cuda and causal and rows == ctx > 1
        mask = None if rows == 1 or not causal or square else ~causal_mask(rows, ctx, q.device)
        o = attend(q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                   mask, self.scale, causal=square)
        return o[0].transpose(0, 1)

    def _sparse(self, layer, q, kf, vf, seq: SeqAttention):
        """One draft query row: attend the selected prefix positions plus every position >= base."""
        view = seq.sparse
        ctx = seq.ctx_len
        selected = view.positions(layer, q[-1])                      # [G, k]
        groups = selected.shape[0]
        tail = torch.arange(view.base, ctx, device=q.device).expand(groups, -1)
        pos = torch.cat([selected.to(q.device), tail], dim=1)        # [G, m]
        slots = seq.key_slots[pos]                                   # [G, m]
        kvh = kf.shape[1]
        if groups == 1:
            out = self._sdpa(q, kf[slots[0]], vf[slots[0]], causal=False)
        else:
            # One set per KV head: each KV head's query group attends its own gathered keys.
            heads = torch.arange(kvh, device=q.device)[:, None]
            keys, values = kf[slots, heads], vf[slots, heads]        # [KVH, m, d]
            rows, nh, d = q.shape
            qg = q.reshape(rows, kvh, nh // kvh, d).permute(1, 0, 2, 3).reshape(kvh, -1, d)
            o = attend(qg, keys, values, scale=self.scale, gqa=False)
            out = o.view(kvh, rows, nh // kvh, d).permute(1, 0, 2, 3).reshape(rows, nh, d)
        if view.wants_recall:
            view.record_recall(layer, self._recall(q, kf, seq, pos))
        return out

    def _recall(self, q, kf, seq: SeqAttention, pos: torch.Tensor) -> float:
        """Fraction of the full-attention mass of the draft query that the attended set covers
        (mean over query heads). Costs one full attention: trace-on-request only."""
        keys = kf[seq.key_slots]
        p = torch.softmax(dense_scores(q, keys, self.scale), dim=-1)[-1]   # [H, ctx]
        heads, kvh = p.shape[0], kf.shape[1]
        covered = torch.zeros_like(p, dtype=torch.bool)
        group = heads // kvh
        for g in range(pos.shape[0]):
            hs = slice(None) if pos.shape[0] == 1 else slice(g * group, (g + 1) * group)
            covered[hs, pos[g]] = True
        return float((p * covered).sum(-1).mean())
