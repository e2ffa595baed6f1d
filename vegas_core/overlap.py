"""Keeping the GPU busy while the host works: one-row steps chained on the GPU, launched an
iteration ahead. The engine core's iteration (`engine_core.py`) reads the same without any of it;
this is how it runs on CUDA graphs (`graphs.GraphRunner`), tracing or not (a trace reads what the
host reads anyway, and the selected sets through copies queued where they are made).

- A chain: `steps` one-row forwards replayed on the GPU with no host round trip between them (a
  speculative batch's `gamma` drafts, or up to `multi_step` plain decode steps of a vanilla batch).
- Run-ahead: when the next batch is already certain (nothing waits, the pool holds every request's
  next slots), the next iteration's chain is launched before this one returns, so the GPU works
  while the host emits and schedules.
- Early launch: a speculative batch's next draft chain is queued right behind its verification,
  starting from tokens and positions that acceptance computes on the device, before the host has
  read them; a vanilla batch's next decode chain likewise behind the current one.

A chain launched ahead is used only if the next decode has exactly that batch in that state
(`take`); a stale one is harmless: its K/V writes land in its requests' own reserved slots, before
(in stream order) anything that reuses them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model_runner import BatchEntry
from .rejection import RejectionResult, greedy_accept_batch
from .request import Request
from .scheduler import lookahead
from .transfer import to_device, to_host_async


@dataclass
class Chain:
    """One-row steps chained on the GPU for a batch (`ModelRunner.chain`)."""
    kind: str                      # "draft": a speculative batch's drafts; "decode": vanilla steps
    state: tuple | None            # what the launch read of each request (`chain_state`)
    limits: list[int]              # steps per request
    tokens: torch.Tensor           # [max(limits), batch] on the device
    marks: tuple                   # timing marks around the launch
    selections: list               # held, so the state's selection ids stay unique
    probs: torch.Tensor | None = None   # sampled drafts: their distributions [steps, batch, V]
    early: bool = False            # launched before the host read the work it follows


def chain_state(reqs: list[Request]) -> tuple:
    return tuple((r.request_id, r.num_cached, len(r.token_ids), id(r.selection)) for r in reqs)


def chain_sampling(reqs: list[Request]):
    """What a chain over `reqs` samples with: None (argmax) for an all-greedy batch, else each
    request's sampling parameters and stream key."""
    if all(r.sampling.is_greedy for r in reqs):
        return None
    return [r.sampling for r in reqs], [r.rng_key for r in reqs]


class Overlap:
    def __init__(self, core, enabled: bool):
        self.core = core
        self.enabled = enabled            # run-ahead and early launch (graphs)
        self.ahead: Chain | None = None   # a chain launched for the next iteration
        self.marks = None                 # timing marks of the chain the last `take` used
        self.gpu_end = None               # where this iteration's GPU work ends, when a chain follows it
        self.counters = dict(launched=0, ahead=0, ahead_used=0, early=0, early_used=0)

    # -- within an iteration ----------------------------------------------------------------
    def begin_iteration(self) -> None:
        self.marks = self.gpu_end = None

    def pop_marks(self):
        marks, self.marks = self.marks, None
        return marks

    def take(self, kind: str, reqs: list[Request]) -> Chain | None:
        """This iteration's chain: the one launched ahead if it was for exactly this batch in
        this state, else one launched now (None when no graph takes it)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.kind == kind and ahead.state == chain_state(reqs):
            self.counters["ahead_used"] += 1
            self.counters["early_used"] += ahead.early
            chain = ahead
        else:
            chain = self._launch(kind, reqs)
        if chain is not None:
            self.marks = chain.marks
        return chain

    def decode_chained(self, reqs: list[Request]) -> list[RejectionResult] | None:
        """A vanilla batch on CUDA graphs: up to `multi_step` plain decode steps chained on the
        GPU, one host round trip for all of them (the same tokens as one step at a time); None
        when one step runs the usual way."""
        core = self.core
        if core.decode_steps <= 1 or any(r.spec.speculative for r in reqs):
            return None
        chain = self.take("decode", reqs)
        if chain is None:
            return None
        # The tokens are copied out before the next chain (which rewrites the history) is queued
        # behind this one; the host then waits for this copy alone.
        host, done = to_host_async(chain.tokens)
        if self._launch_decode_ahead(reqs, chain):
            self.gpu_end = chain.marks[1]          # the next chain starts where this one ends
        if done is not None:
            done.synchronize()
        toks = host.numpy()
        return [RejectionResult(num_accepted=0, tokens=toks[:n, i].tolist(), bonus=False, draft_probs=[],
                                target_probs=[]) for i, n in enumerate(chain.limits)]

    def launch_early(self, reqs: list[Request], drafts, acceptance) -> None:
        """Launch the next iteration's draft chain right behind this verification, before the
        host has read what it accepted: acceptance already ran on the device, and the chain
        starts from its tokens and positions.

        Only for a batch that drafted on the GPU this iteration, whose next batch is certain to
        be itself (none may reach max_tokens now), with selections that do not depend on what is
        accepted. The pages are reserved for the most the chain may write (every draft
        accepted); `keep_early` then keeps the chain, or drops it if the batch changed."""
        core = self.core
        on_device = drafts.on_device
        if not self.enabled or on_device is None or (acceptance.argmax is None and acceptance.accepted is None) \
                or len(on_device[1]) != len(reqs) \
                or any(r.spec.proposer.selects_after_accept or r.selection is None for r in reqs):
            return
        if any(r.num_generated + 1 + r.spec.gamma >= r.sampling.max_tokens for r in reqs):
            return   # a request may reach max_tokens now: the chain would be dropped
        if not self._next_batch_is(reqs):
            return
        rows = core.runner.graphs.verification_rows(len(reqs))
        if rows is None or not core.scheduler.reserve(reqs, extra=[1 + r.spec.gamma for r in reqs]):
            return
        qloc, firsts = rows
        if acceptance.argmax is not None:
            accepted, nxt = greedy_accept_batch(on_device[0], acceptance.argmax, qloc)
        else:
            accepted, nxt = acceptance.accepted, acceptance.token
        limits = [r.spec.gamma for r in reqs]
        # Host-side placeholders at the furthest start (every draft accepted); the device's
        # numbers replace them.
        entries = [BatchEntry(r.request_id, [0], r.num_cached + 1 + g, sparse=r.selection, logits="last")
                   for r, g in zip(reqs, limits)]
        if self._launch_from_device("draft", reqs, entries, limits, (nxt, firsts + accepted + 1)):
            self.gpu_end = self.ahead.marks[0]     # this iteration's work ends where the chain starts

    def keep_early(self, reqs: list[Request]) -> bool:
        """After the host accepted: keep a chain launched early behind this iteration when the
        next batch is still exactly these requests (none finished, paused or joined), recording
        the state it drafts from (the device accepted what the host did: the same comparison of
        the same tokens). False when none was launched."""
        if self.gpu_end is None:
            return False
        keep = self._next_batch_is(reqs)
        if keep:
            self.ahead.state = chain_state(reqs)
        else:
            self.ahead = None
        return keep

    def run_ahead(self) -> None:
        """Launch the next iteration's chain now, when the next batch is already certain
        (`Scheduler.certain_decode_batch`, `reserve`)."""
        core = self.core
        batch = core.scheduler.certain_decode_batch() if self.enabled else None
        if not batch:
            return
        if all(r.spec.speculative and r.selection is not None for r in batch):
            kind = "draft"
        elif core.decode_steps > 1 and not any(r.spec.speculative for r in batch):
            kind = "decode"
        else:
            return
        if not core.scheduler.reserve(batch):
            return
        self.ahead = self._launch(kind, batch)
        if self.ahead is not None:
            self.counters["ahead"] += 1

    # -- launches -------------------------------------------------------------------------------
    def _launch(self, kind: str, reqs: list[Request]) -> Chain | None:
        core = self.core
        if kind == "draft":
            limits = [r.spec.gamma for r in reqs]
            entries = [BatchEntry(r.request_id, [r.token_ids[-1]], r.num_cached, sparse=r.selection,
                                  logits="last") for r in reqs]
        else:
            limits = [lookahead(r, core.decode_steps) for r in reqs]
            entries = [BatchEntry(r.request_id, [r.token_ids[-1]], r.num_cached, logits="all") for r in reqs]
        start = core.clock.mark()
        sampling = chain_sampling(reqs)
        tokens = core.runner.chain(entries, core.allocator, max(limits), limits, to_host=False,
                                   sampling=sampling)
        if tokens is None:
            return None
        return self._new_chain(kind, chain_state(reqs), limits, tokens, start, reqs, sampling)

    def _launch_decode_ahead(self, reqs: list[Request], chain: Chain) -> bool:
        """Queue a vanilla batch's next chain right behind this one, before the host has read its
        tokens: it starts from each request's last chained token on the device, at the position
        the host will reach (a chain runs exactly its limits, so only the token is unknown). Only
        when the next batch is certain to be these requests and none reaches max_tokens in this
        chain; `keep_early` drops it if one stopped (a stop token) or the batch changed."""
        core = self.core
        if not self.enabled or not self._next_batch_is(reqs):
            return False
        limits = []
        for r, n in zip(reqs, chain.limits):
            left = r.sampling.max_tokens - r.num_generated - n
            if r.iterations_left is not None:      # step-through: held after this chain's steps
                left = min(left, r.iterations_left - n)
            if left <= 0:
                return False          # finishes with this chain: the next batch is another
            limits.append(min(core.decode_steps, left))
        if not core.scheduler.reserve(reqs, extra=limits):
            return False
        starts = [r.num_cached + n for r, n in zip(reqs, chain.limits)]
        entries = [BatchEntry(r.request_id, [0], s, logits="all") for r, s in zip(reqs, starts)]
        last = to_device([n - 1 for n in chain.limits], torch.long, core.device)
        ids = chain.tokens.gather(0, last[None])[0]
        return self._launch_from_device("decode", reqs, entries, limits,
                                        (ids, to_device(starts, torch.long, core.device)))

    def _launch_from_device(self, kind: str, reqs, entries, limits, first) -> bool:
        """Launch a chain starting from device tokens and positions (`first`) before the host
        has read them, and hold it as the next iteration's (`keep_early` decides)."""
        core = self.core
        start = core.clock.mark()
        sampling = chain_sampling(reqs)
        tokens = core.runner.chain(entries, core.allocator, max(limits), limits, to_host=False,
                                   first=first, sampling=sampling)
        if tokens is None:
            return False
        self.counters["ahead"] += 1
        self.counters["early"] += 1
        self.ahead = self._new_chain(kind, None, limits, tokens, start, reqs, sampling)
        self.ahead.early = True
        return True

    def _new_chain(self, kind, state, limits, tokens, start, reqs, sampling) -> Chain:
        """The record of a chain just launched (counted), with a sampled draft chain's
        distributions (`GraphRunner.chain_probs`)."""
        core = self.core
        self.counters["launched"] += 1
        probs = core.runner.graphs.chain_probs(max(limits), len(reqs)) if sampling and kind == "draft" else None
        return Chain(kind, state, limits, tokens, (start, core.clock.mark()), [r.selection for r in reqs], probs)

    def _next_batch_is(self, reqs: list[Request]) -> bool:
        """Whether the next decode batch is certain and is exactly `reqs`, in order (a finished
        request has left the scheduler, so it is never in it)."""
        batch = self.core.scheduler.certain_decode_batch()
        return batch is not None and len(batch) == len(reqs) and all(a is b for a, b in zip(batch, reqs))
