"""The engine core: token ids in, token ids out, one `step()` at a time.

A step is a prefill chunk step or one decode iteration over every running request:
  draft   `gamma` single-token steps, each layer attending the request's selected entries plus every
          entry written since the last verification (vanilla requests skip this);
  verify  one full-attention pass over the pending token and the drafts, collecting the logits of the
          rows the drafting policy asks for;
  accept  rejection sampling (argmax matching at temperature 0), then the cache is cut back to the
          verified prefix: rejected drafts' entries are dropped;
  select  the next draft phase's sets, from the collected logits (vegas, vegas-all, specextend) or the
          cache (stream, quest).
A request's first decode iteration has no selection yet, so it is a plain full-attention step that
collects; speculation starts from the second. The core knows nothing about text.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .attention import LogitCollector
from .block_manager import BlockAllocator
from .config import ModelConfig
from .errors import InvalidRequestError
from .kv_cache import KVPool
from .model_runner import BatchEntry, ModelRunner
from .random_streams import ACCEPT, DRAFT, stream_key, uniforms
from .rejection import RejectionResult, greedy_accept_batch, rejection_sample_batch
from .request import Request, Status
from .sampling import SamplingParams, is_filtered, logits_to_probs, sample_rows, sampling_tensors
from .scheduler import Scheduler, lookahead
from .spec import SpecParams
from .spec.batched import SelectItem, select_batch
from .spec.policy import build_selection, collect_rows
from .trace.positions import encode_positions
from .transfer import to_device, to_host_async


@dataclass
class StepOutput:
    """One iteration of one request. `num_accepted` is the drafter's count (drafts the verifier
    accepted, as vLLM counts them); `new_token_ids` is what the user got: fewer when a stop token or
    max_tokens ends the run inside the iteration."""
    request: Request
    new_token_ids: list[int]
    finished: bool
    rejected_ids: list[int] = field(default_factory=list)  # drafts rejected this iteration
    num_drafted: int = 0
    num_accepted: int = 0
    iteration: dict | None = None                           # trace record (when tracing)
    # When tracing: the set this iteration's verification chose for the next draft phase (a trace
    # Selection dict; None when the policy chooses while drafting, as quest does), and the ACCEPT
    # draws u_j its acceptance test compared with p/q (sampled requests only).
    selected: dict | None = None
    accept_draws: list[float] | None = None


@dataclass
class EngineOptions:
    block_size: int = 16
    num_blocks: int | None = None          # None: sized from kv_cache_bytes
    kv_cache_bytes: int | None = None      # None: 1 GiB on a CPU; on a GPU, from its free memory
    gpu_memory_fraction: float = 0.85      # of the GPU memory free after the weights, for the KV pool
    max_num_seqs: int = 128
    max_prefill_tokens: int = 1024
    trace: bool = False                    # record per-iteration trace dicts on each request
    attention: str = "auto"                # "auto" (Triton on a GPU), "reference" or "triton"
    cuda_graphs: str = "auto"              # "auto" (on a GPU's kernel path), "off" (eager) or "static"
    multi_step: int = 16                   # with CUDA graphs and no trace: plain decode steps a
                                           # vanilla batch runs on the GPU per host round trip (16:
                                           # the host's share per step halves from 8, and a request
                                           # that stops early wastes at most 15 steps of one row)
    run_ahead: bool = True                 # with CUDA graphs and no trace: launch the next iteration's
                                           # chain before returning (see EngineCore._run_ahead)


class EngineCore:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, options: EngineOptions | None = None,
                 spec: SpecParams | None = None):
        self.config = config
        self.device = torch.device(device)
        self.options = opts = options or EngineOptions()
        self.spec = spec or SpecParams(method="vanilla")
        num_blocks = opts.num_blocks or max(
            1, kv_pool_bytes(self.device, opts, _weights_bytes(weights, dtype))
            // KVPool.bytes_per_block(config, opts.block_size, dtype))
        self.runner = ModelRunner(config, weights, self.device, dtype, num_blocks, opts.block_size,
                                  opts.attention, opts.cuda_graphs, opts.max_num_seqs)
        self.allocator = BlockAllocator(num_blocks, opts.block_size)
        self.decode_steps = opts.multi_step if self.runner.graphs is not None and not opts.trace else 1
        self.scheduler = Scheduler(self.allocator, opts.max_num_seqs, opts.max_prefill_tokens,
                                   self.decode_steps)
        self.run_ahead = opts.run_ahead and self.runner.graphs is not None and not opts.trace
        self._ahead: _Chain | None = None         # a chain launched at the end of the last iteration
        self._chain_marks = None                  # timing marks of the chain the last take used
        self.chains = dict(launched=0, ahead=0, ahead_used=0, early=0, early_used=0)   # counters (tests, benchmarks)
        self.requests: dict[int, Request] = {}
        self.step_index = 0
        self._t0 = time.perf_counter()
        self.reset_phase_totals()

    def reset_phase_totals(self) -> None:
        """Running sums over decode iterations (benchmarks read them): draft, verify and select
        milliseconds (CUDA events on a GPU) and the number of iterations."""
        self.phase_totals = dict(iterations=0, draft_ms=0.0, verify_ms=0.0, select_ms=0.0)

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], sampling: SamplingParams | None = None,
                    spec: SpecParams | None = None) -> Request:
        sampling = sampling or SamplingParams()
        spec = spec or self.spec
        self._validate(prompt_ids, sampling, spec)
        req = Request(list(prompt_ids), sampling, spec)
        req.rng_key = stream_key(sampling.seed)
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        return req

    def _validate(self, prompt_ids, sampling: SamplingParams, spec: SpecParams) -> None:
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.config.vocab_size
        bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]!r} is outside the vocabulary [0, {vocab}) ({len(bad)} such ids)")
        ctx = self.config.max_position_embeddings
        if len(prompt_ids) + sampling.max_tokens > ctx:
            raise InvalidRequestError(
                f"prompt of {len(prompt_ids)} tokens plus max_tokens {sampling.max_tokens} is "
                f"{len(prompt_ids) + sampling.max_tokens}, beyond the context length {ctx}")
        if spec.method == "quest" and self.runner.kernels and spec.page_size != self.options.block_size:
            raise InvalidRequestError(
                f"on the kernel path a Quest page is a KV-pool block: page_size must be "
                f"{self.options.block_size}, got {spec.page_size}")
        slots = self.allocator.num_blocks * self.allocator.block_size
        need = len(prompt_ids) + sampling.max_tokens + spec.gamma + 1
        if need > slots:
            raise InvalidRequestError(
                f"request needs up to {need} KV slots but the whole KV pool holds {slots}")

    def fork(self, parent: Request, sampling: SamplingParams | None = None,
             spec: SpecParams | None = None) -> Request:
        """A new request with the parent's prompt whose KV cache starts as a copy of the parent's
        prefilled prompt, so comparing methods on one long prompt pays for its prefill once."""
        if parent.output_ids or parent.needs_prefill or parent.finished:
            raise InvalidRequestError("fork needs a parent whose prompt is prefilled and that has not generated yet")
        child = self.add_request(parent.prompt_ids, sampling, spec)
        n = parent.num_cached
        if not self.allocator.can_ensure(child.request_id, n):
            return child  # no room to copy: the child prefills normally when pages free up
        self.allocator.ensure(child.request_id, n)
        src = self.runner.slots(self.allocator, parent.request_id, 0, n)
        dst = self.runner.slots(self.allocator, child.request_id, 0, n)
        self.runner.pool.copy_slots(src, dst)
        child.num_cached = n
        return child

    def pause(self, request_id: int) -> None:
        """Hold a request between iterations: it keeps its KV pages and its place, others go on."""
        req = self.requests.get(request_id)
        if req is not None:
            req.held, req.iterations_left = True, None

    def resume(self, request_id: int, iterations: int | None = None) -> None:
        """Let a held request run again: for good, or for `iterations` decode iterations (step-through)."""
        req = self.requests.get(request_id)
        if req is not None:
            req.held, req.iterations_left = False, iterations

    def abort(self, request_id: int) -> None:
        req = self.requests.get(request_id)
        if req is not None and not req.finished:
            self._finish(req, "abort")

    def finish(self, req: Request, reason: str) -> None:
        """Used by the front end when it sees a stop string."""
        if not req.finished:
            self._finish(req, reason)

    def _finish(self, req: Request, reason: str) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.scheduler.remove(req)
        self.requests.pop(req.request_id, None)

    def next_token_logits(self, ids: list[int]) -> torch.Tensor:
        """Full-attention logits [vocab] (float32) after `ids`, computed in a scratch sequence that
        is freed again: for analysis (e.g. how close a call a divergence was), not for serving."""
        self._validate(ids, SamplingParams(max_tokens=1), SpecParams(method="vanilla", gamma=1))
        seq_id = -1 - self.step_index   # never a request id (those count up from 0)
        self.allocator.ensure(seq_id, len(ids))
        try:
            return self.runner.forward([BatchEntry(seq_id, list(ids), 0, logits="last")], self.allocator)[0]
        finally:
            self.allocator.free(seq_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        plan = self.scheduler.schedule()
        self.step_index += 1
        if plan.prefill:
            t = time.perf_counter()
            entries = [BatchEntry(c.request.request_id, c.request.token_ids[c.start:c.end], c.start)
                       for c in plan.prefill]
            self.runner.forward(entries, self.allocator)
            self._sync()
            dt = time.perf_counter() - t
            for c in plan.prefill:
                c.request.num_cached = c.end
                c.request.prefill_time_s += dt
            return []
        if plan.decode:
            return self._decode(plan.decode)
        return []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _wait(self, mark) -> None:
        """Wait until the GPU has reached `mark` (a `_mark`), not for work queued after it."""
        if self.device.type == "cuda":
            mark.synchronize()

    def _mark(self):
        """A point in time for phase timings: a CUDA event on a GPU (no synchronisation in the
        middle of the iteration), the wall clock on the CPU."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _ms(self, start, end) -> float:
        if self.device.type == "cuda":
            return start.elapsed_time(end)   # valid once `end` has completed (`_wait` first)
        return (end - start) * 1e3

    def _decode(self, reqs: list[Request]) -> list[StepOutput]:
        wall_start = time.perf_counter()
        self._chain_marks = None
        m_start = self._mark()
        drafts, qprobs, on_device = self._draft(reqs)
        m_draft = self._mark()
        draft_span, self._chain_marks = self._chain_marks or (m_start, m_draft), None
        chained, chained_ahead = (None, False) if drafts else self._decode_chained(reqs)
        bases = [req.num_cached for req in reqs]
        old_selections = [req.selection for req in reqs]
        selecting = []                      # (start, end) marks of the selection launches
        m_gpu_end = None                    # set when the next chain was launched before acceptance
        if chained is not None:
            results, m_verify = chained, self._mark()
            verify_span = self._chain_marks or (m_draft, m_verify)
            if chained_ahead:
                m_gpu_end = verify_span[1]          # the next chain starts where this one ends
        else:
            entries, logits, collector = self._verify(reqs, drafts, on_device)
            argmax = logits.argmax(dim=-1) if all(r.sampling.is_greedy for r in reqs) else None
            targets = self._targets(argmax, drafts, on_device)
            sampled = None if argmax is not None else \
                self._launch_sampled(reqs, entries, drafts, qprobs, logits, on_device)
            m_verify = self._mark()
            verify_span = (m_draft, m_verify)
            # Selections that do not depend on what is accepted are launched before the host
            # waits for the targets, so the GPU selects while the host accepts.
            if self._select_all(reqs, entries, bases, None, collector):
                selecting.append((m_verify, self._mark()))
            if self._launch_early(reqs, on_device, argmax, sampled):
                m_gpu_end = self._ahead.marks[0]    # this iteration's work ends where the chain starts
            results = self._accept_all(reqs, entries, drafts, logits, targets, sampled)
            m_late = self._mark()
            if self._select_all(reqs, entries, bases, results, collector):
                selecting.append((m_late, self._mark()))
        for req, res, base in zip(reqs, results, bases):
            # The pending token and every kept one but the last are now cached: drafts accepted,
            # or the plain steps a chained decode ran.
            req.num_cached = base + len(res.tokens)
        outputs = [self._emit(req, res, base, old, drafts.get(req.request_id, []))
                   for req, res, base, old in zip(reqs, results, bases, old_selections)]
        m_end = m_gpu_end if m_gpu_end is not None else self._mark()
        for out in outputs:
            req = out.request
            if req.iterations_left is not None:
                req.iterations_left -= 1
                req.held = req.iterations_left <= 0
        early = m_gpu_end is not None and self._keep_early(reqs)
        for out in outputs:
            req = out.request
            if not out.finished:
                # A chain launched early writes past the verified prefix: keep its pages (and
                # the next verification's), which the next iteration would reserve anyway.
                self.allocator.truncate(req.request_id,
                                        req.num_cached + (lookahead(req, self.decode_steps) if early else 0))
        if not early:
            self._run_ahead()
        self._wait(m_end)     # this iteration's GPU work, not the chain launched ahead
        wall_end = time.perf_counter()
        timings = dict(draft_ms=self._ms(*draft_span), verify_ms=self._ms(*verify_span),
                       select_ms=sum(self._ms(a, b) for a, b in selecting), start_s=wall_start - self._t0)
        totals = self.phase_totals
        totals["iterations"] += 1
        for key in ("draft_ms", "verify_ms", "select_ms"):
            totals[key] += timings[key]
        for out in outputs:
            out.request.decode_time_s += wall_end - wall_start
            if out.iteration is not None:
                out.iteration.update(timings)
        return outputs

    # -- chains: one-row steps on the GPU, maybe launched an iteration ahead -------------------
    def _run_ahead(self) -> None:
        """Launch the next iteration's chain (the drafts of a speculative batch, or a vanilla
        batch's plain steps) now, when the next batch is already certain, so the
        GPU works while the host returns this iteration's outputs and schedules the next. The
        next batch is certain when nothing waits or needs a prefill and the pool holds every
        request's next slots (`Scheduler.certain_decode_batch`, `reserve`); the chain is used only if
        the next decode has exactly this batch in this state (`_take_chain`), and a stale one
        is harmless: its K/V writes land in its requests' own reserved slots, before (in stream
        order) anything that reuses them."""
        batch = self.scheduler.certain_decode_batch() if self.run_ahead else None
        if not batch:
            return
        if all(r.spec.speculative and r.selection is not None for r in batch):
            kind = "draft"
        elif self.decode_steps > 1 and not any(r.spec.speculative for r in batch):
            kind = "decode"
        else:
            return
        if not self.scheduler.reserve(batch):
            return
        self._ahead = self._launch_chain(kind, batch)
        if self._ahead is not None:
            self.chains["ahead"] += 1

    def _launch_early(self, reqs: list[Request], on_device, argmax, sampled=None) -> bool:
        """Launch the next iteration's draft chain right behind this verification, before the
        host has read what it accepted: acceptance runs on the device (`greedy_accept_batch`, or
        the sampled batch's `rejection_sample_batch` already launched: `sampled`) and the chain
        starts from its tokens and positions, so the GPU drafts while the host accepts, emits
        and returns (instead of idling until `_run_ahead`).

        Only for a batch that drafted on the GPU this iteration, whose next batch is
        already certain to be itself (none may reach max_tokens now), with selections that do
        not depend on what is accepted (not SpecExtend's). The pages are reserved for the most
        the chain may write (every draft accepted); `_keep_early` then keeps the chain, or drops
        it when the batch changed."""
        if not self.run_ahead or on_device is None or (argmax is None and sampled is None) \
                or len(on_device[1]) != len(reqs) \
                or any(r.spec.method == "specextend" or r.selection is None for r in reqs):
            return False
        if any(r.num_generated + 1 + r.spec.gamma >= r.sampling.max_tokens for r in reqs):
            return False   # a request may reach max_tokens now: the chain would be dropped
        if not self._next_batch_is(reqs):
            return False
        rows = self.runner.graphs.verification_rows(len(reqs))
        if rows is None or not self.scheduler.reserve(reqs, extra=[1 + r.spec.gamma for r in reqs]):
            return False
        qloc, firsts = rows
        if argmax is not None:
            accepted, nxt = greedy_accept_batch(on_device[0], argmax, qloc)
        else:
            accepted, nxt = sampled.accepted, sampled.token
        limits = [r.spec.gamma for r in reqs]
        # Host-side placeholders at the furthest start (every draft accepted); the device's
        # numbers replace them.
        entries = [BatchEntry(r.request_id, [0], r.num_cached + 1 + g, sparse=r.selection, logits="last")
                   for r, g in zip(reqs, limits)]
        return self._launch_from_device("draft", reqs, entries, limits, (nxt, firsts + accepted + 1))

    def _launch_from_device(self, kind: str, reqs, entries, limits, first) -> bool:
        """Launch a chain starting from device tokens and positions (`first`) before the host
        has read them, and hold it as the next iteration's (`_keep_early` decides)."""
        start = self._mark()
        sampling = _chain_sampling(reqs)
        tokens = self.runner.chain(entries, self.allocator, max(limits), limits, to_host=False,
                                   first=first, sampling=sampling)
        if tokens is None:
            return False
        self.chains["ahead"] += 1
        self.chains["early"] += 1
        self._ahead = self._new_chain(kind, None, limits, tokens, start, reqs, sampling)
        self._ahead.early = True
        return True

    def _keep_early(self, reqs: list[Request]) -> bool:
        """After the host accepted: keep the chain launched early when the next batch is still
        exactly these requests (none finished, paused or joined), recording the state it drafts
        from (the device accepted what the host did: the same comparison of the same tokens)."""
        keep = self._next_batch_is(reqs)
        if keep:
            self._ahead.state = _chain_state(reqs)
        else:
            self._ahead = None
        return keep

    def _next_batch_is(self, reqs: list[Request]) -> bool:
        """Whether the next decode batch is certain and is exactly `reqs`, in order (a finished
        request has left the scheduler, so it is never in it)."""
        batch = self.scheduler.certain_decode_batch()
        return batch is not None and len(batch) == len(reqs) and all(a is b for a, b in zip(batch, reqs))

    def _take_chain(self, kind: str, reqs: list[Request]) -> "_Chain | None":
        """This iteration's chain: the one launched ahead if it was for exactly this batch in
        this state, else one launched now (None when no graph takes it)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.kind == kind and ahead.state == _chain_state(reqs):
            self.chains["ahead_used"] += 1
            self.chains["early_used"] += ahead.early
            chain = ahead
        else:
            chain = self._launch_chain(kind, reqs)
        if chain is not None:
            self._chain_marks = chain.marks
        return chain

    def _launch_chain(self, kind: str, reqs: list[Request]) -> "_Chain | None":
        if kind == "draft":
            limits = [r.spec.gamma for r in reqs]
            entries = [BatchEntry(r.request_id, [r.token_ids[-1]], r.num_cached, sparse=r.selection,
                                  logits="last") for r in reqs]
        else:
            limits = [lookahead(r, self.decode_steps) for r in reqs]
            entries = [BatchEntry(r.request_id, [r.token_ids[-1]], r.num_cached, logits="all") for r in reqs]
        start = self._mark()
        sampling = _chain_sampling(reqs)
        tokens = self.runner.chain(entries, self.allocator, max(limits), limits, to_host=False,
                                   sampling=sampling)
        if tokens is None:
            return None
        return self._new_chain(kind, _chain_state(reqs), limits, tokens, start, reqs, sampling)

    def _new_chain(self, kind, state, limits, tokens, start, reqs, sampling) -> "_Chain":
        """The record of a chain just launched (counted), with a sampled draft chain's
        distributions (`GraphRunner.chain_probs`)."""
        self.chains["launched"] += 1
        probs = self.runner.graphs.chain_probs(max(limits), len(reqs)) if sampling and kind == "draft" else None
        return _Chain(kind, state, limits, tokens, (start, self._mark()), [r.selection for r in reqs], probs)

    def _targets(self, argmax, drafts, on_device):
        """At temperature 0 for the whole batch (`argmax`: every row's, None for a sampled batch):
        the targets, with the drafts still on the GPU, copied to the host in one copy that work
        launched after it does not delay. Returns a callable that waits for that copy alone,
        fills the drafts' placeholder lists and gives the targets; None for a sampled batch."""
        if argmax is None:
            return None
        flat = argmax
        if on_device is not None:
            flat = torch.cat([flat, on_device[0].t().reshape(-1)])     # [n, steps] after the targets
        host, done = to_host_async(flat)
        n_rows = argmax.shape[0]

        def read():
            if done is not None:
                done.synchronize()
            values = host.tolist()
            if on_device is not None:
                steps = on_device[0].shape[0]
                for rid, col in on_device[1].items():
                    at = n_rows + col * steps
                    drafts[rid][:] = values[at:at + len(drafts[rid])]
            return values[:n_rows]
        return read

    def _accept_all(self, reqs, entries, drafts, logits, targets, sampled) -> list[RejectionResult]:
        # Temperature 0 for the whole batch: every row's argmax in one op and one host read
        # (`_targets`), instead of a probability table, a sampler call and a read per request.
        if targets is not None:
            targets, results, row = targets(), [], 0
            for req, entry in zip(reqs, entries):
                n = len(entry.tokens)
                results.append(self._accept_greedy(drafts.get(req.request_id, []), targets[row:row + n],
                                                   logits[row:row + n]))
                row += n
            return results
        return sampled.read()

    def _launch_sampled(self, reqs, entries, drafts, qprobs, logits, on_device=None) -> "_Sampled":
        """Rejection sampling for the whole batch in tensor ops (`rejection_sample_batch`, each
        request on its own counter-based stream), launched now; `read()` then makes the one host
        read and gives the results. Greedy requests in the batch have one-hot distributions,
        which it matches by argmax as the greedy path does."""
        dev = logits.device
        # Every row's target distribution in one call, not one per request (on the GPU one
        # `kernels.sampling` program per row; on the CPU one sort of the vocabulary for the batch
        # when a request filters by top-k/top-p/min-p).
        probs = logits_to_probs(logits, [r.sampling for r, e in zip(reqs, entries) for _ in e.tokens],
                                kernel=self.runner.kernels)
        lists = [drafts.get(r.request_id, []) for r in reqs]
        width = max(map(len, lists), default=0)
        n = len(reqs)
        counts = [len(d) for d in lists]
        if on_device is None:
            grid = to_device([d + [0] * (width - len(d)) for d in lists], torch.long, dev).view(n, width)
            q = torch.zeros(n, width, probs.shape[1], dtype=probs.dtype, device=dev)
            row_of = {r.request_id: i for i, r in enumerate(reqs)}
            for j, step_probs, rids in qprobs:  # a draft step's missing rows (greedy): q 0, see below
                q[to_device([row_of[rid] for rid in rids], torch.long, dev), j] = step_probs.to(probs.dtype)
        else:
            # Chained drafts: tokens [steps, column] and distributions [steps, column, V] on the
            # device; the lists are placeholders, filled from the one read below.
            tokens, columns = on_device
            rows = [i for i, r in enumerate(reqs) if r.request_id in columns]
            if rows == list(range(n)) and all(columns[r.request_id] == i for i, r in enumerate(reqs)):
                # Every request drafted, in batch order (the usual case): views, no copies.
                grid = tokens[:width].t()
                q = qprobs[:width].transpose(0, 1) if torch.is_tensor(qprobs) else \
                    torch.zeros(n, width, probs.shape[1], dtype=probs.dtype, device=dev)
            else:
                cols = to_device([columns[reqs[i].request_id] for i in rows], torch.long, dev)
                rows_t = to_device(rows, torch.long, dev)
                grid = torch.zeros(n, width, dtype=torch.long, device=dev)
                grid[rows_t] = tokens[:width].t()[cols]
                q = torch.zeros(n, width, probs.shape[1], dtype=probs.dtype, device=dev)
                if torch.is_tensor(qprobs):
                    q[rows_t] = qprobs[:width].transpose(0, 1)[cols].to(probs.dtype)
        qloc = torch.tensor([0] + [len(e.tokens) for e in entries]).cumsum(0)
        # Non-blocking uploads: a blocking one would wait out the verification queued before it.
        on_dev = to_device([counts, [r.rng_key for r in reqs], [len(r.token_ids) for r in reqs]],
                           torch.long, dev)
        accepted, token, q_d, p_d = rejection_sample_batch(
            grid, on_dev[0], q, probs, to_device(qloc, torch.long, dev), on_dev[1], on_dev[2],
            kernel=self.runner.kernels)
        packed = torch.cat([accepted[:, None].double(), token[:, None].double(), q_d.double(),
                            p_d.double(), grid.double()], dim=1)
        # Copied now, with an event of its own: `read()` then waits for this copy alone, not for
        # the next draft chain `_launch_early` queues behind it (a plain .cpu() there waited out
        # the whole chain before the host could accept and emit).
        host, done = to_host_async(packed)

        def read():
            if done is not None:
                done.synchronize()
            return self._sampled_results(reqs, entries, lists, counts, width, host.tolist(), logits)
        return _Sampled(accepted, token, read)

    def _sampled_results(self, reqs, entries, lists, counts, width, packed, logits) -> list[RejectionResult]:
        results = []
        row = 0
        for req, entry, d, k, vals in zip(reqs, entries, lists, counts, packed):
            a, tok = int(vals[0]), int(vals[1])
            d[:] = [int(x) for x in vals[2 + 2 * width:2 + 2 * width + k]]    # the drafts, as drafted
            res = RejectionResult(num_accepted=a, tokens=d[:a] + [tok], bonus=k > 0 and a == k,
                                  draft_probs=vals[2:2 + k], target_probs=vals[2 + width:2 + width + k])
            if req.sampling.is_greedy:      # as `_accept_greedy` reports it (q is one-hot)
                res.draft_probs = [1.0] * k
                if d and self.options.trace:
                    res.target_probs = _draft_confidence(logits[row:row + len(entry.tokens)], d)
            results.append(res)
            row += len(entry.tokens)
        return results

    def _decode_chained(self, reqs):
        """A vanilla batch on CUDA graphs: up to `multi_step` plain decode steps chained on the
        GPU (argmax, or sampled in the graph from each request's stream), one host round trip
        for all of them (the same tokens as one step at a time). Returns the results (None: then
        one step runs the usual way) and whether the next chain was launched behind this one
        (`_launch_decode_ahead`)."""
        if self.decode_steps <= 1 or any(r.spec.speculative for r in reqs):
            return None, False
        chain = self._take_chain("decode", reqs)
        if chain is None:
            return None, False
        # The chain's tokens are copied out before the next chain (which rewrites the history)
        # is queued behind it; the host then waits for this copy alone.
        host, done = to_host_async(chain.tokens)
        ahead = self._launch_decode_ahead(reqs, chain)
        if done is not None:
            done.synchronize()
        toks = host.numpy()
        return [RejectionResult(num_accepted=0, tokens=toks[:n, i].tolist(), bonus=False, draft_probs=[],
                                target_probs=[]) for i, n in enumerate(chain.limits)], ahead

    def _launch_decode_ahead(self, reqs: list[Request], chain: "_Chain") -> bool:
        """Queue a vanilla batch's next chain right behind this one, before the host has read its
        tokens: it starts from each request's last chained token on the device, at the position
        the host will reach (a chain runs exactly its limits, so only the token is unknown). The
        GPU then decodes while the host emits and schedules, instead of idling until
        `_run_ahead`. Only when the next batch is certain to be these requests and none reaches
        max_tokens in this chain; `_keep_early` drops it if one stopped (a stop token) or the
        batch changed."""
        if not self.run_ahead or not self._next_batch_is(reqs):
            return False
        limits = []
        for r, n in zip(reqs, chain.limits):
            left = r.sampling.max_tokens - r.num_generated - n
            if left <= 0:
                return False          # finishes with this chain: the next batch is another
            limits.append(min(self.decode_steps, left))
        if not self.scheduler.reserve(reqs, extra=limits):
            return False
        starts = [r.num_cached + n for r, n in zip(reqs, chain.limits)]
        entries = [BatchEntry(r.request_id, [0], s, logits="all") for r, s in zip(reqs, starts)]
        last = to_device([n - 1 for n in chain.limits], torch.long, self.device)
        ids = chain.tokens.gather(0, last[None])[0]
        return self._launch_from_device("decode", reqs, entries, limits,
                                        (ids, to_device(starts, torch.long, self.device)))

    def _draft(self, reqs):
        """Drafts (lists by request id), draft distributions of sampled drafts, and for drafts
        chained on the GPU (tokens [steps, n] on the device, column by request id): their lists
        are then placeholders, filled once the host reads the verification's outcome."""
        drafting = [r for r in reqs if r.spec.speculative and r.selection is not None]
        drafts = {r.request_id: [] for r in drafting}
        # Sampled drafts' distributions: (step, probabilities [active, V], their request ids) per
        # step, or a chain's [steps, chain column, V] on the device.
        qprobs = []
        if drafting:
            # Drafts chained on the GPU: every draft step with no host round trip, and the
            # verification reads them there (sampled drafts keep their distributions there too).
            chain = self._take_chain("draft", drafting)
            if chain is not None:
                for r, g in zip(drafting, chain.limits):
                    drafts[r.request_id] = [0] * g
                if chain.probs is not None:
                    qprobs = chain.probs
                return drafts, qprobs, (chain.tokens, {r.request_id: i for i, r in enumerate(drafting)})
        for j in range(max((r.spec.gamma for r in drafting), default=0)):
            active = [r for r in drafting if r.spec.gamma > j]
            entries = [BatchEntry(r.request_id, [drafts[r.request_id][-1] if j else r.token_ids[-1]],
                                  r.num_cached + j, sparse=r.selection, logits="last") for r in active]
            logits = self.runner.forward(entries, self.allocator, graph=True)
            if all(r.sampling.is_greedy for r in active):
                # Temperature 0: the draft is the argmax, one op and one host read for the batch;
                # greedy acceptance needs no draft distribution.
                for r, tok in zip(active, logits.argmax(dim=-1).tolist()):
                    drafts[r.request_id].append(tok)
                continue
            params = [r.sampling for r in active]
            where = torch.tensor([[r.rng_key for r in active], [len(r.token_ids) + j for r in active]],
                                 dtype=torch.long).to(logits.device)
            probs, tokens = sample_rows(logits, sampling_tensors(params, logits.shape[1], logits.device),
                                        where[0], where[1], DRAFT, filtered=is_filtered(params),
                                        kernel=self.runner.kernels)
            tokens = tokens.tolist()
            for r, tok in zip(active, tokens):
                drafts[r.request_id].append(int(tok))
            qprobs.append((j, probs, [r.request_id for r in active]))
        return drafts, qprobs, None

    def _verify(self, reqs, drafts, on_device=None):
        collector = LogitCollector()
        entries = []
        columns = on_device[1] if on_device is not None else {}
        for r in reqs:
            d = drafts.get(r.request_id, [])
            rows = collect_rows(r.spec.method, 1 + len(d)) if r.spec.speculative else None
            entries.append(BatchEntry(r.request_id, [r.token_ids[-1]] + d, r.num_cached,
                                      collect_rows=rows, logits="all",
                                      device_drafts=columns.get(r.request_id)))
        logits = self.runner.forward(entries, self.allocator, collector, graph=True)
        return entries, logits, collector

    def _accept_greedy(self, drafts: list[int], targets: list[int], logits: torch.Tensor) -> RejectionResult:
        """Greedy acceptance from the target's argmax per row (what `rejection_sample` does with
        one-hot distributions): drafts are accepted while they equal it, then its token follows."""
        k = len(drafts)
        n = next((i for i, (d, t) in enumerate(zip(drafts, targets)) if d != t), k)
        res = RejectionResult(num_accepted=n, tokens=drafts[:n] + [targets[n]], bonus=k > 0 and n == k,
                              draft_probs=[1.0] * k, target_probs=[float(d == t) for d, t in zip(drafts, targets)])
        if drafts and self.options.trace:
            res.target_probs = _draft_confidence(logits, drafts)
        return res

    def _select_all(self, reqs, entries, bases, results, collector: LogitCollector) -> bool:
        """Speculative requests' selections for their next draft phase. Called twice per
        iteration: with `results` None for the policies whose selection does not depend on what
        was accepted (launched before the host reads the targets), then with the results for the
        others (SpecExtend scores the last accepted row). Batched on the kernel path (one scoring
        launch for the whole batch), one request at a time otherwise. Returns whether it selected."""
        late = results is not None
        todo = [i for i, req in enumerate(reqs)
                if req.spec.speculative and (req.spec.method == "specextend") == late]
        if not todo:
            return False
        accepted = lambda i: results[i].num_accepted if late else 0   # noqa: E731
        if self.runner.kernels:
            items = [SelectItem(i, reqs[i], bases[i], accepted(i)) for i in todo]
            new = select_batch(items, collector, self.config.num_layers, self.config.num_kv_heads,
                               self.device, self.runner.page_bounds, self.allocator.block_table,
                               keep_sets=self.options.trace)
            for i in todo:
                reqs[i].selection = new[reqs[i].request_id]
            return True
        for i in todo:
            reqs[i].selection = self._select(reqs[i], i, entries[i], bases[i], accepted(i), collector)
        return True

    def _select(self, req: Request, i: int, entry: BatchEntry, base: int, num_accepted: int,
                collector: LogitCollector):
        cfg = self.config
        collected = (collector.logits[i], collector.lse[i]) if entry.collect_rows is not None else None
        return build_selection(
            req.spec, base, cfg.num_layers, cfg.num_kv_heads, collected, entry.collect_rows, num_accepted,
            lambda layer, s, e: self.runner.keys(layer, self.allocator, req.request_id, s, e), req.policy_cache)

    def _emit(self, req: Request, res: RejectionResult, base: int, selection, drafts: list[int]) -> StepOutput:
        kept = []
        for tok in res.tokens:
            req.token_ids.append(tok)
            kept.append(tok)
            reason = self._stop_reason(req, tok)
            if reason:
                self._finish(req, reason)
                break
        out = StepOutput(req, kept, req.finished, rejected_ids=drafts[res.num_accepted:],
                         num_drafted=len(drafts), num_accepted=res.num_accepted)
        if self.options.trace:
            out.iteration = self._record(req, res, base, selection, drafts, kept)
            req.iterations.append(out.iteration)
            if req.spec.speculative and req.selection is not None and req.selection.first_step_sets():
                out.selected = _selection_record(req.spec.granularity, req.selection)
            if drafts and not req.sampling.is_greedy:
                # The draws rejection_sample_batch made: a pure function of (key, position, ACCEPT).
                where = torch.arange(base + 1, base + 1 + len(drafts), dtype=torch.long)
                out.accept_draws = uniforms(torch.tensor([req.rng_key]), where[None], ACCEPT)[0].tolist()
        return out

    def _stop_reason(self, req: Request, tok: int) -> str | None:
        if not req.sampling.ignore_eos and tok in self.config.eos_token_ids:
            return "stop"
        if req.num_generated >= req.sampling.max_tokens:
            return "length"
        return None

    def _record(self, req: Request, res: RejectionResult, base: int, selection, drafts: list[int],
                kept: list[int]) -> dict:
        """`kept`: the tokens the request emitted, a prefix of `res.tokens` when the run ended inside
        the iteration; `num_accepted` and `final_token` stay what the verifier decided."""
        d = [dict(token_id=t, draft_prob=_prob(res.draft_probs[j]), target_prob=_prob(res.target_probs[j]),
                  accepted=j < res.num_accepted) for j, t in enumerate(drafts)]
        kind = "decode" if not drafts else ("bonus" if res.bonus else "correction")
        rec = dict(index=len(req.iterations), step=self.step_index, position=base, drafts=d,
                   num_accepted=res.num_accepted, emitted=list(kept), final_token=res.tokens[-1],
                   final_kind=kind, selection=None, recall=None)
        if selection is not None and drafts:
            rec["selection"] = _selection_record(req.spec.granularity, selection)
            rec["recall"] = selection.recall_per_layer(self.config.num_layers)
        return rec

    # -- convenience ---------------------------------------------------------------------------
    def run(self, progress=None) -> None:
        """Step until every request has finished."""
        while self.has_work:
            self.step()
            if progress is not None:
                progress()


@dataclass
class _Chain:
    """One-row steps chained on the GPU for a batch (`ModelRunner.chain`)."""
    kind: str                      # "draft": a speculative batch's drafts; "decode": vanilla steps
    state: tuple                   # what the launch read of each request (`_chain_state`)
    limits: list[int]              # steps per request
    tokens: torch.Tensor           # [max(limits), batch] on the device
    marks: tuple                   # timing marks around the launch
    selections: list               # held, so the state's selection ids stay unique
    probs: torch.Tensor | None = None   # sampled drafts: their distributions [steps, batch, V]
    early: bool = False            # launched before the host read the work it follows


@dataclass
class _Sampled:
    """A sampled batch's rejection sampling, launched (`EngineCore._launch_sampled`)."""
    accepted: torch.Tensor         # [n] drafts accepted, on the device
    token: torch.Tensor            # [n] the correction or bonus token, on the device
    read: Callable[[], list]       # the one host read: the results


def _chain_sampling(reqs: list[Request]):
    """What a chain over `reqs` samples with: None (argmax) for an all-greedy batch, else each
    request's sampling parameters and stream key."""
    if all(r.sampling.is_greedy for r in reqs):
        return None
    return [r.sampling for r in reqs], [r.rng_key for r in reqs]


def _chain_state(reqs: list[Request]) -> tuple:
    return tuple((r.request_id, r.num_cached, len(r.token_ids), id(r.selection)) for r in reqs)


ACTIVATION_RESERVE = 2 << 30   # GPU memory left for activations, logits and collected verification logits


def kv_pool_bytes(device: torch.device, opts: EngineOptions, weights_bytes: int,
                  free_bytes: int | None = None) -> int:
    """The KV pool's size: what the options ask for, else 1 GiB on a CPU, else on a GPU
    `gpu_memory_fraction` of the memory free once the weights are there, less a reserve for
    activations (`free_bytes` defaults to what the device reports now, before the weights load)."""
    if opts.kv_cache_bytes is not None:
        return opts.kv_cache_bytes
    if device.type != "cuda":
        return 1 << 30
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    size = int((free_bytes - weights_bytes) * opts.gpu_memory_fraction) - ACTIVATION_RESERVE
    if size <= 0:
        raise InvalidRequestError(
            f"no GPU memory left for a KV pool: {free_bytes / 2**30:.1f} GiB free, the weights take "
            f"{weights_bytes / 2**30:.1f} GiB; pass kv_cache_bytes or num_blocks explicitly")
    return size


def _weights_bytes(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(w.numel() for w in weights.values()) * itemsize


def _draft_confidence(logits: torch.Tensor, drafts: list[int]) -> list[float]:
    """Greedy probabilities are one-hot; traces show the target's softmax probability of each draft
    instead (row i of `logits` predicts draft i)."""
    k = len(drafts)
    soft = torch.softmax(logits[:k], dim=-1)
    return soft[torch.arange(k, device=soft.device), torch.tensor(drafts, device=soft.device)].tolist()


def _prob(x: float) -> float:
    return min(1.0, max(0.0, float(x)))


def _selection_record(granularity: str, selection) -> dict:
    sets = selection.first_step_sets()
    # Stream keeps one set per layer whatever the granularity asked for: record what was attended.
    if all(s.shape[0] == 1 for s in sets):
        granularity = "layer"
    rec = dict(granularity=granularity, base=selection.base, budget=selection.budget)
    if granularity == "layer":
        rec["layers"] = [encode_positions(s[0].cpu().numpy()) for s in sets]
    else:
        rec["heads"] = [[encode_positions(h.cpu().numpy()) for h in s] for s in sets]
    return rec
