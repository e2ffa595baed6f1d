"""Continuous-batching scheduler: plain Python over `Request`s and the `BlockAllocator`.

Each engine step is either a prefill step (chunks of prompts, at most `max_prefill_tokens` tokens in
all) or a decode iteration over every running request whose prompt is in the cache. Requests join
and finish at any step. When pages run out, the most recently arrived request is preempted (its
pages freed, its tokens kept) and recomputed later: no crash, no neighbour touched.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockAllocator
from .request import Request, Status


@dataclass
class PrefillChunk:
    request: Request
    start: int
    end: int


@dataclass
class Plan:
    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not self.prefill and not self.decode


def lookahead(req: Request, decode_steps: int = 1) -> int:
    """Cache slots a decode iteration writes past `num_cached`: the pending token, plus the drafts
    once the request has a selection to draft with; a vanilla request may run up to
    `decode_steps` plain steps in one iteration (never past its max_tokens, nor past the steps a
    step-through lets it run), greedy or sampled (a chain samples on the GPU)."""
    if req.spec.speculative:
        return 1 + (req.spec.gamma if req.selection is not None else 0)
    steps = min(decode_steps, req.sampling.max_tokens - req.num_generated)
    if req.iterations_left is not None:
        steps = min(steps, req.iterations_left)
    return max(1, steps)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_num_seqs: int, max_prefill_tokens: int,
                 decode_steps: int = 1):
        self.allocator = allocator
        self.decode_steps = decode_steps      # plain steps a vanilla iteration may run
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._arrivals = 0

    def add(self, req: Request) -> None:
        req.arrival = self._arrivals
        self._arrivals += 1
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Drop a finished or aborted request and give its pages back."""
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.allocator.free(req.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Plan:
        plan = Plan()
        budget = self.max_prefill_tokens
        for req in self.running:
            if budget and req.needs_prefill:
                budget = self._add_chunk(plan, req, budget)
        while self.waiting and budget and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = min(budget, req.prefill_target - req.num_cached)
            if not self.allocator.can_ensure(req.request_id, req.num_cached + max(n, 1)):
                break
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            if n:
                budget = self._add_chunk(plan, req, budget)
        if plan.prefill:
            return plan
        for req in self._decode_candidates():
            # (re-checked: making room for an older request may have preempted this one)
            if req.status is Status.RUNNING and self._make_room(plan, req):
                plan.decode.append(req)
        return plan

    def _decode_candidates(self) -> list[Request]:
        """The running requests a decode iteration takes, oldest first (held ones sit out)."""
        return [r for r in sorted(self.running, key=lambda r: r.arrival)
                if not r.held and r.status is Status.RUNNING and not r.needs_prefill]

    def certain_decode_batch(self) -> list[Request] | None:
        """The next step's decode batch when it is already certain: nothing needs a prefill and
        nothing can join (nothing waits, or the batch is full: `schedule` admits no one while
        `max_num_seqs` requests run), so the next step decodes these requests (if `reserve` finds
        them room). None otherwise."""
        if (self.waiting and len(self.running) < self.max_num_seqs) or any(r.needs_prefill for r in self.running):
            return None
        return self._decode_candidates() or None

    def reserve(self, batch: list[Request], extra: list[int] | None = None) -> bool:
        """Reserve every request's slots for its next decode iteration, as `schedule` would (and
        `extra[i]` slots more for request i), or none of them (no preemption) when the pool
        cannot hold them all."""
        extra = extra or [0] * len(batch)
        needs = [(r.request_id, r.num_cached + lookahead(r, self.decode_steps) + x) for r, x in zip(batch, extra)]
        alloc = self.allocator
        pages = sum(max(0, alloc.blocks_needed(n) - len(alloc.block_table(rid))) for rid, n in needs)
        if pages > alloc.num_free:
            return False
        for rid, n in needs:
            alloc.ensure(rid, n)
        return True

    def _add_chunk(self, plan: Plan, req: Request, budget: int) -> int:
        n = min(budget, req.prefill_target - req.num_cached)
        if n <= 0 or not self.allocator.can_ensure(req.request_id, req.num_cached + n):
            return budget
        self.allocator.ensure(req.request_id, req.num_cached + n)
        plan.prefill.append(PrefillChunk(req, req.num_cached, req.num_cached + n))
        return budget - n

    def _make_room(self, plan: Plan, req: Request) -> bool:
        need = req.num_cached + lookahead(req, self.decode_steps)
        while not self.allocator.can_ensure(req.request_id, need):
            # Push out newer requests, and requests still in prefill whatever their age (otherwise a
            # half-prefilled old request holding pages could block every decoder forever).
            victims = [r for r in self.running
                       if r is not req and (r.arrival > req.arrival or r.needs_prefill)]
            if not victims:
                return False  # wait for an older request to finish
            self.preempt(max(victims, key=lambda r: r.arrival), plan)
        self.allocator.ensure(req.request_id, need)
        return True

    def preempt(self, req: Request, plan: Plan) -> None:
        self.allocator.free(req.request_id)
        self.running.remove(req)
        if req in plan.decode:
            plan.decode.remove(req)
        req.num_cached = 0
        req.selection = None
        req.policy_cache = {}
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        plan.preempted.append(req)
