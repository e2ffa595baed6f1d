"""Selection of the prefix entries a draft attends to, per policy. Pure tensor functions.

Every function returns positions of shape [G, k], sorted ascending, with G = 1 (one set per layer)
or G = kv_heads (one set per KV head)."""
from __future__ import annotations

import torch


def select_from_logits(logits: torch.Tensor, lse: torch.Tensor, k: int, kv_heads: int,
                       granularity: str) -> torch.Tensor:
    """Vegas / SpecExtend selection from collected verification logits.

    logits [R, H, n] are the scaled QK products of R collected rows over the n prefix keys, lse [R, H]
    the log-sum-exp of each row over its whole context. The softmax weight exp(logit - lse) is the
    true attention weight; average it over the rows and the query heads (all of them, or those of one
    KV head) and keep the top k."""
    w = torch.exp(logits.float() - lse.float()[..., None])           # [R, H, n]
    rows, heads, n = w.shape
    if granularity == "layer":
        score = w.mean(dim=(0, 1))[None]                              # [1, n]
    else:
        score = w.view(rows, kv_heads, heads // kv_heads, n).mean(dim=(0, 2))  # [KVH, n]
    return topk_sorted(score, k)


def no_selection(granularity: str, kv_heads: int) -> torch.Tensor:
    """The empty set of a layer that selects nothing (a sliding-window layer): [G, 0]."""
    return torch.empty(1 if granularity == "layer" else kv_heads, 0, dtype=torch.long)


def topk_sorted(score: torch.Tensor, k: int) -> torch.Tensor:
    idx = torch.topk(score, k, dim=-1, sorted=False).indices
    return torch.sort(idx, dim=-1).values


def stream_positions(base: int, k: int, sink: int, device=None) -> torch.Tensor:
    """MagicDec-Stream: the first `sink` tokens plus the most recent ones, k in all."""
    sink = min(sink, k)
    window = k - sink
    pos = torch.cat([torch.arange(0, sink), torch.arange(base - window, base)])
    return pos.to(device)[None]


def stream_indices(bases: torch.Tensor, budgets: torch.Tensor, sinks: torch.Tensor, k_max: int) -> torch.Tensor:
    """`stream_positions` for a batch at once, on the bases' device: int32 [B, k_max], row b's first
    budgets[b] entries are request b's sink + window (ascending), the rest 0 (padding)."""
    j = torch.arange(k_max, device=bases.device)[None, :]
    sink = torch.minimum(sinks, budgets)[:, None]
    window_start = (bases - (budgets - torch.minimum(sinks, budgets)))[:, None]
    pos = torch.where(j < sink, j, window_start + (j - sink))
    return torch.where(j < budgets[:, None], pos, 0).to(torch.int32)


def quest_page_bounds(keys: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per complete page, element-wise min and max of the keys: keys [n, KVH, d] ->
    kmin, kmax [n // page_size, KVH, d] (a trailing partial page is left out: it is always kept)."""
    full = keys.shape[0] // page_size
    kf = keys[: full * page_size].float().view(full, page_size, *keys.shape[1:])
    return kf.amin(1), kf.amax(1)


def quest_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bound of q . k over each page: sum_d max(q_d * kmax_d, q_d * kmin_d).
    q [H, d], kmin/kmax [P, KVH, d] -> [H, P]."""
    heads, kvh = q.shape[0], kmin.shape[1]
    qf = q.float().view(1, kvh, heads // kvh, q.shape[-1])            # [1, KVH, G, d]
    bound = torch.maximum(qf * kmax[:, :, None, :], qf * kmin[:, :, None, :]).sum(-1)  # [P, KVH, G]
    return bound.reshape(kmin.shape[0], heads).T                      # [H, P]


def quest_select(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, k: int, base: int,
                 page_size: int, granularity: str) -> torch.Tensor:
    """Score the complete pages of the prefix [0, base), keep the top ceil(k / page_size) by score
    summed over the heads of the set, and always keep the partial last page (Quest keeps the current
    page). kmin/kmax cover the complete pages only: [base // page_size, KVH, d]."""
    kvh = kmin.shape[1]
    groups = 1 if granularity == "layer" else kvh
    full = kmin.shape[0]
    partial = torch.arange(full * page_size, base, device=q.device).expand(groups, -1)
    if full == 0:
        return partial
    scores = quest_scores(q, kmin, kmax)                              # [H, P]
    heads = scores.shape[0]
    agg = scores.sum(0, keepdim=True) if groups == 1 else scores.view(kvh, heads // kvh, full).sum(1)
    n_pages = min(full, max(1, -(-k // page_size)))
    top = topk_sorted(agg, n_pages)                                   # [G, n_pages]
    offs = torch.arange(page_size, device=top.device)
    pos = (top[..., None] * page_size + offs).flatten(1)              # [G, n_pages * page_size]
    return torch.cat([pos, partial], dim=1)
