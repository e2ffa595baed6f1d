"""Speculative (rejection) sampling for one request: Leviathan et al. 2023, Chen et al. 2023.

Contract: given k drafts d_0..d_{k-1} sampled from the draft distributions q_i (rows of draft_probs,
shape [k, V]) and the target distributions p_0..p_k (rows of target_probs, shape [k+1, V], p_i predicts
the token at draft position i, p_k the one after the last draft), return the accepted drafts followed by
exactly one correction or bonus token. The emitted tokens are distributed exactly as sampling from p
one token at a time (lossless). Greedy mode is argmax matching. With k = 0 the single token is a plain
sample from p_0 and counts as a normal decode token (bonus=False). The generator (or torch's global RNG
when None) must live on target_probs' device; a seeded generator makes runs repeat exactly.

`rejection_sample_batch` is the engine's form of the same rule for a whole batch in tensor ops (no
host read), drawing from each request's counter-based stream (`random_streams`); the per-request
`rejection_sample` is its reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .random_streams import ACCEPT, TOKEN, uniforms
from .sampling import sample_from_probs, sample_keyed


@dataclass
class RejectionResult:
    num_accepted: int          # drafts accepted, 0..k
    tokens: list[int]          # accepted drafts followed by exactly one correction or bonus token
    bonus: bool                # True when k > 0, all k drafts were accepted and the last token is the bonus
    draft_probs: list[float]   # q_i(d_i) for each draft
    target_probs: list[float]  # p_i(d_i) for each draft


def rejection_sample(draft_tokens: list[int] | Tensor, draft_probs: Tensor, target_probs: Tensor,
                     generator: torch.Generator | None, greedy: bool) -> RejectionResult:
    device = target_probs.device
    drafts = torch.as_tensor(draft_tokens, dtype=torch.long, device=device).reshape(-1)
    k = drafts.numel()
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1 or draft_probs.shape[0] != k \
            or (k and draft_probs.shape[1] != target_probs.shape[1]):
        raise ValueError(f"{k} drafts need draft_probs [{k}, V] and target_probs [{k + 1}, V], got "
                         f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}")
    rows = torch.arange(k, device=device)
    # q_i(d_i) and p_i(d_i): the probability of each draft under the draft and the target.
    q = draft_probs[rows, drafts].float()
    p = target_probs[rows, drafts].float()

    if greedy:
        # Temperature 0: draft i is accepted iff it is the target's argmax at position i.
        accept = drafts == target_probs[:k].argmax(dim=-1)
    else:
        # Accept d_i with probability min(1, p/q): u < p/q with u ~ U[0, 1), written as u * q < p so
        # that p >= q always accepts and q = 0 needs no division (accepted iff p > 0).
        u = torch.rand(k, generator=generator, device=device)
        accept = u * q < p
    # Accepted drafts are the prefix before the first rejection (one host sync for everything).
    q_list, p_list, acc_list = torch.stack((q, p, accept.float())).tolist() if k else ([], [], [])
    n = next((i for i, a in enumerate(acc_list) if not a), k)
    tokens = drafts[:n].tolist()

    if greedy:
        # Temperature 0: the correction (n < k) or the bonus (n == k) is the target's argmax at n.
        last = int(target_probs[n].argmax())
    elif n < k:
        # First rejection at n: sample the correction from the residual norm(max(0, p_n - q_n)).
        # Fallback to p_n: a rejection needs p_n(d_n) < q_n(d_n), and as both rows sum to 1 some other
        # token then has p_n > q_n, so the residual is non-zero. It is all zero only when p_n == q_n up
        # to rounding (the rejection came from rounding, or from a draft that q_n gives probability 0).
        # The residual is then undefined, and a fresh sample from p_n is what plain decoding would emit.
        residual = (target_probs[n].float() - draft_probs[n].float()).clamp_min(0)
        dist = torch.where(residual.sum() > 0, residual, target_probs[n].float())
        last = int(sample_from_probs((dist / dist.sum())[None], [generator])[0])
    else:
        # All k drafts accepted (or k = 0): the bonus token is a sample from p_k.
        last = int(sample_from_probs(target_probs[k:].float(), [generator])[0])
    return RejectionResult(num_accepted=n, tokens=tokens + [last], bonus=k > 0 and n == k,
                           draft_probs=q_list, target_probs=p_list)


def greedy_accept_batch(drafts: Tensor, targets: Tensor, qloc: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy acceptance for a whole batch as tensor ops, on the device the tensors live on (no
    host read): what `rejection_sample(..., greedy=True)` gives each request, as counts.

    drafts [G, n]: request i's drafts down column i (its first k_i rows, later rows ignored);
    targets [T]: the verification's argmax per flat row, request i's k_i + 1 rows starting at
    qloc[i]; qloc [n + 1]: those starts, with k_i = qloc[i + 1] - qloc[i] - 1.
    Returns (accepted [n], next_token [n]): the leading drafts equal to the target's argmax, and
    the target's token after them (the correction, or the bonus when all were accepted)."""
    n, steps = qloc.numel() - 1, drafts.shape[0]
    starts, k = qloc[:-1], qloc[1:] - qloc[:-1] - 1
    j = torch.arange(steps, device=drafts.device)[:, None]
    rows = (starts[None] + j).clamp(max=targets.numel() - 1)
    match = (drafts[:, :n] == targets[rows]) & (j < k[None])
    accepted = match.long().cumprod(dim=0).sum(dim=0)
    return accepted, targets[starts + accepted]


def rejection_sample_batch(drafts: Tensor, counts: Tensor, draft_probs: Tensor, target_probs: Tensor,
                           qloc: Tensor, keys: Tensor, positions: Tensor,
                           kernel: bool = False) -> tuple[Tensor, ...]:
    """`rejection_sample(..., greedy=False)` for every request of a batch at once.

    drafts [n, K] long: request i's k_i = counts[i] drafts first in its row (padding ignored);
    draft_probs [n, K, V]: q for each draft (padding rows ignored); target_probs [T, V]: p, request
    i's k_i + 1 rows starting at flat row qloc[i] (qloc [n + 1]); keys [n]: stream keys;
    positions [n]: the sequence position of each request's first draft (the token after the last
    kept one). Draft j is accepted with the ACCEPT draw at position + j, the last token sampled with
    the TOKEN draw at position + accepted, from norm(max(0, p - q)) after a rejection (p itself if
    that is all zero) or from p after the last draft (k_i = 0: a plain sample).

    Returns (accepted [n], token [n], q_d [n, K], p_d [n, K]): drafts accepted, the correction or
    bonus token, and each draft's probability under q and p (padding columns 0). Greedy rows
    (one-hot q and p) follow argmax matching exactly. ``kernel``: the last token's race in one
    Triton launch (`sample_keyed`'s, the same draws)."""
    n, width = drafts.shape
    dev = target_probs.device
    j = torch.arange(width, device=dev)
    real = j[None, :] < counts[:, None]
    d = torch.where(real, drafts, 0)
    rows = (qloc[:-1, None] + j[None, :]).clamp(max=target_probs.shape[0] - 1)
    p_d = torch.where(real, target_probs[rows, d].float(), 0.0)
    q_d = torch.where(real, draft_probs.gather(2, d[:, :, None])[:, :, 0].float(), 0.0) if width else p_d
    u = uniforms(keys, positions[:, None] + j[None, :], ACCEPT)
    accept = (u * q_d < p_d) & real                           # u < p/q without dividing
    accepted = accept.long().cumprod(dim=1).sum(dim=1)
    p_n = target_probs[qloc[:-1] + accepted].float()           # [n, V]
    if width:
        q_n = draft_probs[torch.arange(n, device=dev), accepted.clamp(max=width - 1)].float()
        rejected = (accepted < counts)[:, None]
        residual = torch.where(rejected, (p_n - q_n).clamp_min(0), p_n)
        # All-zero residual: p == q up to rounding at the rejected position; sample p (see above).
        weights = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_n)
    else:
        weights = p_n
    token = sample_keyed(weights, keys, positions + accepted, TOKEN, kernel=kernel)
    return accepted, token, q_d, p_d
