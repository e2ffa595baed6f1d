"""Acceptance for a whole verification batch, launched on the device right after the verification
and read by the host once (`Acceptance.read`), so the host reads one small tensor per iteration.

Temperature 0 for the whole batch: every row's argmax; a draft is accepted while it equals the
target's argmax, then the argmax follows (the correction, or the bonus token after the last draft).
Otherwise: rejection sampling (`rejection.rejection_sample_batch`) on each request's own
counter-based stream; greedy requests in a sampled batch have one-hot distributions there.

While tracing, a greedy draft's target probability is the target's softmax probability of it
(not the one-hot 0/1 the decision used): computed on the device with the rest and read in the
same host read, so tracing adds no wait.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .rejection import RejectionResult, rejection_sample_batch
from .request import Request
from .sampling import logits_to_probs
from .transfer import to_device, to_host_async


@dataclass
class Drafts:
    """A draft phase's output. `lists`: request id -> its drafts (placeholders while a GPU chain
    holds them: filled once the host reads the acceptance). `qprobs`: sampled drafts'
    distributions, (step, probs [active, V], request ids) per step or a chain's [steps, n, V].
    `on_device`: (tokens [steps, n], column by request id) of a chain still on the GPU."""
    lists: dict[int, list[int]] = field(default_factory=dict)
    qprobs: object = field(default_factory=list)
    on_device: tuple | None = None

    def of(self, req: Request) -> list[int]:
        return self.lists.get(req.request_id, [])


@dataclass
class Acceptance:
    argmax: torch.Tensor | None        # every row's argmax on the device (all-greedy batch)
    accepted: torch.Tensor | None      # [n] drafts accepted, on the device (sampled batch)
    token: torch.Tensor | None         # [n] the correction or bonus token, on the device
    read: Callable[[], list[RejectionResult]]


def launch_acceptance(reqs: list[Request], entries, drafts: Drafts, logits: torch.Tensor,
                      kernels: bool, trace: bool) -> Acceptance:
    if all(r.sampling.is_greedy for r in reqs):
        argmax = logits.argmax(dim=-1)
        lists = [drafts.of(r) for r in reqs]
        width = max(map(len, lists), default=0)
        confidence = None
        if trace and width:
            grid = _draft_tokens(reqs, drafts, lists, width, logits.device)
            confidence = draft_confidence(logits, entries, grid)
        targets = _targets(argmax, drafts, confidence)
        return Acceptance(argmax, None, None, lambda: _accept_greedy_batch(reqs, entries, drafts, *targets()))
    return _launch_sampled(reqs, entries, drafts, logits, kernels, trace)


def accept_greedy(drafts: list[int], targets: list[int], confidence: list[float] | None = None) -> RejectionResult:
    """Drafts are accepted while they equal the target's argmax, then its token follows (what
    rejection sampling does with one-hot distributions). `confidence` (tracing): the target's
    softmax probability of each draft, recorded instead of the one-hot 0/1."""
    k = len(drafts)
    n = next((i for i, (d, t) in enumerate(zip(drafts, targets)) if d != t), k)
    res = RejectionResult(num_accepted=n, tokens=drafts[:n] + [targets[n]], bonus=k > 0 and n == k,
                          draft_probs=[1.0] * k, target_probs=[float(d == t) for d, t in zip(drafts, targets)])
    if drafts and confidence is not None:
        res.target_probs = list(confidence[:k])
    return res


def draft_confidence(logits: torch.Tensor, entries, grid: torch.Tensor) -> torch.Tensor:
    """[n, width] on the device: the target's softmax probability of each request's draft j, from
    its verification row j (which predicts it), as exp(logit - logsumexp) so no [rows, V] softmax
    is written. Entries past a request's drafts are meaningless."""
    width, dev = grid.shape[1], logits.device
    starts = to_device([0] + [len(e.tokens) for e in entries[:-1]], torch.long, dev).cumsum(0)
    rows = (starts[:, None] + torch.arange(width, device=dev)).clamp(max=logits.shape[0] - 1)
    lse = torch.logsumexp(logits, dim=-1)
    return torch.exp(logits[rows, grid] - lse[rows])


def _targets(argmax: torch.Tensor, drafts: Drafts, confidence: torch.Tensor | None):
    """The targets (and the drafts still on the GPU) copied to the host in one copy that work
    launched after it does not delay, and the drafts' confidences (tracing) in another right
    behind it. Returns a callable that waits for those copies alone, fills the drafts'
    placeholder lists and gives the targets and the confidences (None: not traced)."""
    on_device = drafts.on_device
    flat = argmax
    if on_device is not None:
        flat = torch.cat([flat, on_device[0].t().reshape(-1)])     # [n, steps] after the targets
    host, done = to_host_async(flat)
    conf, conf_done = to_host_async(confidence) if confidence is not None else (None, None)
    n_rows = argmax.shape[0]

    def read():
        for event in (done, conf_done):
            if event is not None:
                event.synchronize()
        values = host.tolist()
        if on_device is not None:
            steps = on_device[0].shape[0]
            for rid, col in on_device[1].items():
                at = n_rows + col * steps
                drafts.lists[rid][:] = values[at:at + len(drafts.lists[rid])]
        return values[:n_rows], None if conf is None else conf.tolist()
    return read


def _accept_greedy_batch(reqs, entries, drafts: Drafts, targets, confidence):
    results, row = [], 0
    for i, (req, entry) in enumerate(zip(reqs, entries)):
        n = len(entry.tokens)
        results.append(accept_greedy(drafts.of(req), targets[row:row + n],
                                     None if confidence is None else confidence[i]))
        row += n
    return results


def _launch_sampled(reqs, entries, drafts: Drafts, logits, kernels: bool, trace: bool) -> Acceptance:
    """Rejection sampling for the whole batch in tensor ops, launched now; `read()` makes the one
    host read and gives the results."""
    dev = logits.device
    # Every row's target distribution in one call (on the GPU one `kernels.sampling` program per row).
    probs = logits_to_probs(logits, [r.sampling for r, e in zip(reqs, entries) for _ in e.tokens],
                            kernel=kernels)
    lists = [drafts.of(r) for r in reqs]
    width = max(map(len, lists), default=0)
    grid, q = _draft_grid(reqs, drafts, lists, width, probs)
    qloc = torch.tensor([0] + [len(e.tokens) for e in entries]).cumsum(0)
    counts = [len(d) for d in lists]
    # Non-blocking uploads: a blocking one would wait out the verification queued before it.
    on_dev = to_device([counts, [r.rng_key for r in reqs], [len(r.token_ids) for r in reqs]],
                       torch.long, dev)
    accepted, token, q_d, p_d = rejection_sample_batch(
        grid, on_dev[0], q, probs, to_device(qloc, torch.long, dev), on_dev[1], on_dev[2],
        kernel=kernels)
    parts = [accepted[:, None], token[:, None], q_d, p_d, grid]
    if trace and width:      # greedy drafts' confidences (sampled drafts keep p_d)
        parts.append(draft_confidence(logits, entries, grid))
    packed = torch.cat([x.double() for x in parts], dim=1)
    # Copied with an event of its own: `read()` waits for this copy alone, not for a draft chain
    # queued behind it.
    host, done = to_host_async(packed)

    def read():
        if done is not None:
            done.synchronize()
        return _sampled_results(reqs, lists, width, host.tolist(), trace)
    return Acceptance(None, accepted, token, read)


def _draft_tokens(reqs, drafts: Drafts, lists, width: int, dev) -> torch.Tensor:
    """The drafts [n, width] on the device (0 past a request's drafts)."""
    n = len(reqs)
    if drafts.on_device is None:
        return to_device([d + [0] * (width - len(d)) for d in lists], torch.long, dev).view(n, width)
    # Chained drafts: tokens [steps, column] on the device.
    tokens, columns = drafts.on_device
    if _in_batch_order(reqs, columns):
        return tokens[:width].t()           # a view, no copy
    rows = [i for i, r in enumerate(reqs) if r.request_id in columns]
    grid = torch.zeros(n, width, dtype=torch.long, device=dev)
    grid[to_device(rows, torch.long, dev)] = \
        tokens[:width].t()[to_device([columns[reqs[i].request_id] for i in rows], torch.long, dev)]
    return grid


def _in_batch_order(reqs, columns: dict) -> bool:
    """Every request drafted in a chain, in batch order (the usual case)."""
    return len(columns) == len(reqs) and all(columns.get(r.request_id) == i for i, r in enumerate(reqs))


def _draft_grid(reqs, drafts: Drafts, lists, width: int, probs):
    """The drafts [n, width] and their distributions q [n, width, V] on the device (q 0 where a
    draft was greedy: its distribution is one-hot, which the sampler matches by argmax)."""
    n, dev = len(reqs), probs.device
    grid = _draft_tokens(reqs, drafts, lists, width, dev)
    qprobs = drafts.qprobs
    if drafts.on_device is None:
        q = torch.zeros(n, width, probs.shape[1], dtype=probs.dtype, device=dev)
        row_of = {r.request_id: i for i, r in enumerate(reqs)}
        for j, step_probs, rids in qprobs:
            q[to_device([row_of[rid] for rid in rids], torch.long, dev), j] = step_probs.to(probs.dtype)
        return grid, q
    # Chained drafts: distributions [steps, column, V] on the device (none: all greedy).
    columns = drafts.on_device[1]
    if _in_batch_order(reqs, columns):
        q = qprobs[:width].transpose(0, 1) if torch.is_tensor(qprobs) else \
            torch.zeros(n, width, probs.shape[1], dtype=probs.dtype, device=dev)
        return grid, q
    q = torch.zeros(n, width, probs.shape[1], dtype=probs.dtype, device=dev)
    if torch.is_tensor(qprobs):
        rows = [i for i, r in enumerate(reqs) if r.request_id in columns]
        cols = to_device([columns[reqs[i].request_id] for i in rows], torch.long, dev)
        q[to_device(rows, torch.long, dev)] = qprobs[:width].transpose(0, 1)[cols].to(probs.dtype)
    return grid, q


def _sampled_results(reqs, lists, width, packed, trace: bool) -> list[RejectionResult]:
    results = []
    for req, d, vals in zip(reqs, lists, packed):
        k = len(d)
        a, tok = int(vals[0]), int(vals[1])
        d[:] = [int(x) for x in vals[2 + 2 * width:2 + 2 * width + k]]    # the drafts, as drafted
        res = RejectionResult(num_accepted=a, tokens=d[:a] + [tok], bonus=k > 0 and a == k,
                              draft_probs=vals[2:2 + k], target_probs=vals[2 + width:2 + width + k])
        if req.sampling.is_greedy:      # as `accept_greedy` reports it (q is one-hot)
            res.draft_probs = [1.0] * k
            if d and trace:
                res.target_probs = vals[2 + 3 * width:2 + 3 * width + k]
        results.append(res)
    return results
