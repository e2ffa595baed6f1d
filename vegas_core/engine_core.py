"""The engine core: token ids in, token ids out, one `step()` at a time.

A step is a prefill chunk step or one decode iteration over every running request:
  draft   `gamma` single-token steps, each layer attending the request's selected entries plus every
          entry written since the last verification (vanilla requests skip this);
  verify  one full-attention pass over the pending token and the drafts, collecting the logits of the
          rows the drafting policy asks for (`spec.proposers`);
  accept  rejection sampling (argmax matching at temperature 0), then the cache is cut back to the
          verified prefix: rejected drafts' entries are dropped;
  select  the next draft phase's sets, from the collected logits (vegas, vegas-all, specextend) or the
          cache (stream, quest).
A request's first decode iteration has no selection yet, so it is a plain full-attention step that
collects; speculation starts from the second. The core knows nothing about text.

On CUDA graphs, `overlap.Overlap` keeps the GPU busy between these steps (draft chains launched
ahead, plain decode steps chained); the iteration below reads the same either way. Tracing changes
neither: its records are made from what the iteration reads anyway, after its GPU work is done
(`_trace`).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .acceptance import Drafts, launch_acceptance
from .attention import LogitCollector
from .block_manager import BlockAllocator
from .clock import DeviceClock, PhaseTimes
from .config import ModelConfig
from .errors import InvalidRequestError
from .kv_cache import KVPool, kv_pool_bytes, weights_bytes
from .model_runner import BatchEntry, ModelRunner
from .options import EngineOptions, prefill_budget, with_measured_invariant
from .overlap import Overlap
from .random_streams import ACCEPT, DRAFT, stream_key, uniforms
from .rejection import RejectionResult
from .request import Request, Status
from .sampling import SamplingParams, is_filtered, sample_rows, sampling_tensors
from .scheduler import Scheduler, lookahead
from .spec import SpecParams

STEP_LOG_STEPS = 512      # steps `EngineCore.step_log` keeps
from .spec.batched import SelectItem, select_batch
from .spec.proposers import SelectContext
from .trace.record import decode_step_records, iteration_record, selection_record, selection_records


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
    # Trace records (when tracing): the iteration's, or a chained decode's one per plain step.
    iterations: list[dict] = field(default_factory=list)
    # When tracing: the set this iteration's verification chose for the next draft phase (a trace
    # Selection dict; None when the policy chooses while drafting, as quest does), and the ACCEPT
    # draws u_j its acceptance test compared with p/q (sampled requests only).
    selected: dict | None = None
    accept_draws: list[float] | None = None


class EngineCore:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, options: EngineOptions | None = None,
                 spec: SpecParams | None = None):
        self.config = config
        self.device = torch.device(device)
        opts = with_measured_invariant(options or EngineOptions(), config.num_heads, config.num_kv_heads,
                                       config.head_dim)
        self.options = opts
        self.spec = spec or SpecParams(method="vanilla")
        num_blocks = opts.num_blocks or max(
            1, kv_pool_bytes(self.device, opts, weights_bytes(weights, dtype))
            // KVPool.bytes_per_block(config, opts.block_size, dtype))
        self.runner = ModelRunner(config, weights, self.device, dtype, num_blocks, opts)
        self.allocator = BlockAllocator(num_blocks, opts.block_size)
        graphs = self.runner.graphs is not None
        self.decode_steps = opts.multi_step if graphs else 1
        self.scheduler = Scheduler(self.allocator, opts.max_num_seqs, prefill_budget(opts, self.device.type),
                                   self.decode_steps)
        self.clock = DeviceClock(self.device)
        self.overlap = Overlap(self, enabled=opts.run_ahead and graphs)
        self.requests: dict[int, Request] = {}
        self.step_index = 0
        # The last steps as (start, end, kind, rows, tokens), wall clock: where a request's wait
        # went, read beside the app's own time stamps (`recent_steps`).
        self.step_log: deque[tuple[float, float, str, int, int]] = deque(maxlen=STEP_LOG_STEPS)
        self._t0 = time.perf_counter()
        self.reset_phase_totals()

    def recent_steps(self, last: int = STEP_LOG_STEPS) -> list[dict]:
        """The last `last` steps of `step_log`, oldest first: {start, end, kind, rows, tokens}."""
        return [dict(start=a, end=b, kind=k, rows=r, tokens=n) for a, b, k, r, n in list(self.step_log)[-last:]]

    @property
    def chains(self) -> dict:
        """Counters of GPU chains launched, ahead, early and used (tests, benchmarks)."""
        return self.overlap.counters

    def reset_phase_totals(self) -> None:
        """Running sums over decode iterations (benchmarks read them): draft, verify and select
        milliseconds (CUDA events on a GPU) and the number of iterations."""
        self.phase_totals = dict(iterations=0, draft_ms=0.0, verify_ms=0.0, select_ms=0.0)

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], sampling: SamplingParams | None = None,
                    spec: SpecParams | None = None, trace: bool | None = None) -> Request:
        """`trace`: record this request's iterations (None: `EngineOptions.trace`). An untraced
        request in a traced batch costs nothing of the recording (a load test through the app)."""
        sampling = sampling or SamplingParams()
        spec = spec or self.spec
        self._validate(prompt_ids, sampling, spec)
        req = Request(list(prompt_ids), sampling, spec, trace=self.options.trace if trace is None else bool(trace))
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
                f"prompt of {len(prompt_ids):,} tokens plus max_tokens {sampling.max_tokens:,} is "
                f"{len(prompt_ids) + sampling.max_tokens:,}, beyond the model's context of {ctx:,} tokens: "
                f"shorten the prompt or lower max_tokens")
        spec.proposer.check(spec, self.runner.kernels, self.options.block_size)
        slots = self.allocator.num_blocks * self.allocator.block_size
        need = len(prompt_ids) + sampling.max_tokens + spec.gamma + 1
        if need > slots:
            raise InvalidRequestError(
                f"request needs up to {need} KV slots but the whole KV pool holds {slots}")

    def fork(self, parent: Request, sampling: SamplingParams | None = None,
             spec: SpecParams | None = None, trace: bool | None = None) -> Request:
        """A new request with the parent's prompt whose KV cache starts as a copy of the parent's
        prefilled prompt, so comparing methods on one long prompt pays for its prefill once."""
        if parent.output_ids or parent.needs_prefill or parent.finished:
            raise InvalidRequestError("fork needs a parent whose prompt is prefilled and that has not generated yet")
        child = self.add_request(parent.prompt_ids, sampling, spec, trace)
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
        if iterations is not None and (not isinstance(iterations, int) or isinstance(iterations, bool)
                                       or iterations < 1):
            raise InvalidRequestError(f"iterations must be None (run on) or an integer >= 1, got {iterations!r}")
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
        t = time.time()
        plan = self.scheduler.schedule()
        self.step_index += 1
        if plan.prefill:
            self._prefill(plan.prefill)
            self.step_log.append((t, time.time(), "prefill", len(plan.prefill),
                                  sum(c.end - c.start for c in plan.prefill)))
            return []
        if plan.decode:
            outputs = self._decode(plan.decode)
            self.step_log.append((t, time.time(), "decode", len(plan.decode),
                                  sum(len(o.new_token_ids) for o in outputs)))
            return outputs
        return []

    def _prefill(self, chunks) -> None:
        t = time.perf_counter()
        entries = [BatchEntry(c.request.request_id, c.request.token_ids[c.start:c.end], c.start) for c in chunks]
        self.runner.forward(entries, self.allocator)
        self.clock.sync()
        dt = time.perf_counter() - t
        for c in chunks:
            c.request.num_cached = c.end
            c.request.prefill_time_s += dt

    def _decode(self, reqs: list[Request]) -> list[StepOutput]:
        """One iteration of the batch: draft -> verify -> accept -> select, then emit."""
        wall_start = time.perf_counter()
        traced = any(r.trace for r in reqs)
        clock, times = self.clock, PhaseTimes(self.clock)
        self.overlap.begin_iteration()
        bases = [r.num_cached for r in reqs]              # each verification starts here
        old_selections = [r.selection for r in reqs]      # what this iteration's drafts attend
        m_start = clock.mark()
        drafts = self._draft(reqs)                                                    # 1. draft
        m_draft = clock.mark()
        times.add("draft", self.overlap.pop_marks() or (m_start, m_draft))
        # A vanilla batch on CUDA graphs runs several plain decode steps in one chain instead.
        results = None if drafts.lists else self.overlap.decode_chained(reqs)
        if results is not None:
            times.add("verify", self.overlap.pop_marks() or (m_draft, clock.mark()))
        else:
            entries, logits, collector = self._verify(reqs, drafts)                  # 2. verify
            acceptance = launch_acceptance(reqs, entries, drafts, logits, self.runner.kernels, traced)
            times.add("verify", (m_draft, clock.mark()))
            # Selections that do not depend on what is accepted are launched before the host
            # waits for the acceptance, so the GPU selects while the host accepts.
            self._select(reqs, entries, bases, collector, times, traced)             # 4. select
            self.overlap.launch_early(reqs, drafts, acceptance)
            results = acceptance.read()                                               # 3. accept
            self._select(reqs, entries, bases, collector, times, traced, results)    # 4'. (SpecExtend)
        for req, res, base in zip(reqs, results, bases):
            # The pending token and every kept one but the last are now cached: accepted drafts,
            # or the plain steps a chained decode ran. Rejected drafts' entries are dropped below.
            req.num_cached = base + len(res.tokens)
        outputs = [self._emit(req, res, drafts.of(req)) for req, res in zip(reqs, results)]
        timings = self._end_iteration(reqs, outputs, times, wall_start)
        if traced:
            self._trace(outputs, results, bases, old_selections, drafts, timings)
        wall = time.perf_counter() - wall_start
        for out in outputs:
            out.request.decode_time_s += wall
        return outputs

    def _draft(self, reqs: list[Request]) -> Drafts:
        """`gamma` one-token steps for every request that has a selection, each attending its
        selected prefix entries plus everything after them."""
        drafting = [r for r in reqs if r.spec.speculative and r.selection is not None]
        drafts = Drafts({r.request_id: [] for r in drafting})
        if not drafting:
            return drafts
        chain = self.overlap.take("draft", drafting)
        if chain is not None:
            # Every draft step on the GPU with no host round trip; the verification reads them
            # there, and the lists are filled once the host reads the acceptance.
            for r, g in zip(drafting, chain.limits):
                drafts.lists[r.request_id] = [0] * g
            if chain.probs is not None:
                drafts.qprobs = chain.probs
            drafts.on_device = (chain.tokens, {r.request_id: i for i, r in enumerate(drafting)})
            return drafts
        for j in range(max(r.spec.gamma for r in drafting)):
            active = [r for r in drafting if r.spec.gamma > j]
            entries = [BatchEntry(r.request_id, [drafts.lists[r.request_id][-1] if j else r.token_ids[-1]],
                                  r.num_cached + j, sparse=r.selection, logits="last") for r in active]
            logits = self.runner.forward(entries, self.allocator, graph=True)
            if all(r.sampling.is_greedy for r in active):
                # Temperature 0: the draft is the argmax; greedy acceptance needs no distribution.
                for r, tok in zip(active, logits.argmax(dim=-1).tolist()):
                    drafts.lists[r.request_id].append(tok)
                continue
            params = [r.sampling for r in active]
            where = torch.tensor([[r.rng_key for r in active], [len(r.token_ids) + j for r in active]],
                                 dtype=torch.long).to(logits.device)
            probs, tokens = sample_rows(logits, sampling_tensors(params, logits.shape[1], logits.device),
                                        where[0], where[1], DRAFT, filtered=is_filtered(params),
                                        kernel=self.runner.kernels)
            for r, tok in zip(active, tokens.tolist()):
                drafts.lists[r.request_id].append(int(tok))
            drafts.qprobs.append((j, probs, [r.request_id for r in active]))
        return drafts

    def _verify(self, reqs: list[Request], drafts: Drafts):
        """One full-attention forward over each request's pending token and drafts: logits of
        every row, and the attention logits of the rows each proposer collects."""
        collector = LogitCollector()
        columns = drafts.on_device[1] if drafts.on_device is not None else {}
        entries = [BatchEntry(r.request_id, [r.token_ids[-1]] + drafts.of(r), r.num_cached,
                              collect_rows=r.spec.proposer.collect_rows(1 + len(drafts.of(r))),
                              logits="all", device_drafts=columns.get(r.request_id))
                   for r in reqs]
        logits = self.runner.forward(entries, self.allocator, collector, graph=True)
        return entries, logits, collector

    def _select(self, reqs, entries, bases, collector: LogitCollector, times: PhaseTimes, traced: bool,
                results: list[RejectionResult] | None = None) -> None:
        """The next draft phase's selections: with `results` None for the proposers that do not
        need the accepted count, with the results for those that do. Batched on the kernel path
        (one scoring launch for the whole batch), one request at a time on the reference path."""
        late = results is not None
        todo = [i for i, r in enumerate(reqs)
                if r.spec.speculative and r.spec.proposer.selects_after_accept == late]
        if not todo:
            return
        start = self.clock.mark()
        accepted = [results[i].num_accepted if late else 0 for i in range(len(reqs))]
        if self.runner.kernels:
            items = [SelectItem(i, reqs[i], bases[i], accepted[i], entries[i].collect_rows) for i in todo]
            new = select_batch(items, collector, self.config.num_layers, self.config.num_kv_heads,
                               self.device, self.runner.page_bounds, self.allocator.block_table,
                               trace=traced)
            for i in todo:
                reqs[i].selection = new[reqs[i].request_id]
        else:
            for i in todo:
                reqs[i].selection = self._select_one(reqs[i], i, entries[i], bases[i], accepted[i], collector)
        times.add("select", (start, self.clock.mark()))

    def _select_one(self, req: Request, i: int, entry: BatchEntry, base: int, num_accepted: int,
                    collector: LogitCollector):
        cfg = self.config
        collected = (collector.logits[i], collector.lse[i]) if entry.collect_rows is not None else None
        keys = lambda layer, s, e: self.runner.keys(layer, self.allocator, req.request_id, s, e)  # noqa: E731
        return req.spec.proposer.select(SelectContext(
            req.spec, base, cfg.num_layers, cfg.num_kv_heads, collected, entry.collect_rows, num_accepted,
            keys, req.policy_cache))

    def _emit(self, req: Request, res: RejectionResult, drafts: list[int]) -> StepOutput:
        kept = []
        for tok in res.tokens:
            req.token_ids.append(tok)
            kept.append(tok)
            reason = self._stop_reason(req, tok)
            if reason:
                self._finish(req, reason)
                break
        return StepOutput(req, kept, req.finished, rejected_ids=drafts[res.num_accepted:],
                          num_drafted=len(drafts), num_accepted=res.num_accepted)

    def _trace(self, outputs: list[StepOutput], results: list[RejectionResult], bases: list[int],
               selections: list, drafts: Drafts, timings: dict) -> None:
        """The iteration's trace records, made after its GPU work is done (the next chain may be
        running): from the results, the drafts and sets already on the host, and the timings of
        the batched step. A chained decode records each plain step, as one step at a time would."""
        layers = self.config.num_layers
        keep = [i for i, o in enumerate(outputs) if o.request.trace]      # untraced requests: nothing
        outputs, results = [outputs[i] for i in keep], [results[i] for i in keep]
        bases, selections = [bases[i] for i in keep], [selections[i] for i in keep]
        # The sets each request drafted with, and those chosen for its next drafts (Quest chooses
        # while drafting): encoded in one call for the whole batch (made once per view).
        attended = [old if drafts.of(o.request) else None for o, old in zip(outputs, selections)]
        chosen = [o.request.selection if o.request.spec.speculative and o.request.selection is not None
                  and o.request.selection.chosen_before_drafting else None for o in outputs]
        selection_records([(o.request.spec.granularity, v) for o, v in zip(outputs + outputs, attended + chosen)
                           if v is not None])
        for out, res, base, old, new in zip(outputs, results, bases, selections, chosen):
            req, d = out.request, drafts.of(out.request)
            if d or len(res.tokens) == 1:
                records = [iteration_record(len(req.iterations), self.step_index, base, d, res,
                                            out.new_token_ids, old, req.spec.granularity, layers)]
            else:
                records = decode_step_records(len(req.iterations), self.step_index, base, out.new_token_ids)
            for rec in records:
                rec.update(timings)
            req.iterations.extend(records)
            out.iterations = records
            if new is not None:
                out.selected = selection_record(req.spec.granularity, new)
            if d and not req.sampling.is_greedy:
                # The draws rejection_sample_batch made: a pure function of (key, position, ACCEPT).
                where = torch.arange(base + 1, base + 1 + len(d), dtype=torch.long)
                out.accept_draws = uniforms(torch.tensor([req.rng_key]), where[None], ACCEPT)[0].tolist()

    def _stop_reason(self, req: Request, tok: int) -> str | None:
        if not req.sampling.ignore_eos and tok in self.config.eos_token_ids:
            return "stop"
        if req.num_generated >= req.sampling.max_tokens:
            return "length"
        return None

    def _end_iteration(self, reqs, outputs: list[StepOutput], times: PhaseTimes, wall_start: float) -> dict:
        """Step-through holds, the cache cut back to each verified prefix, the next chain
        launched ahead, then this iteration's timings (returned)."""
        m_end = self.overlap.gpu_end if self.overlap.gpu_end is not None else self.clock.mark()
        for out in outputs:
            req = out.request
            if req.iterations_left is not None:
                # A chained decode ran one plain step per token (never more than were left).
                req.iterations_left -= 1 if req.spec.speculative else len(out.new_token_ids)
                req.held = req.iterations_left <= 0
        early = self.overlap.keep_early(reqs)
        for out in outputs:
            if not out.finished:
                # A chain launched early writes past the verified prefix: keep its pages (and the
                # next verification's), which the next iteration would reserve anyway.
                req = out.request
                self.allocator.truncate(req.request_id,
                                        req.num_cached + (lookahead(req, self.decode_steps) if early else 0))
        if not early:
            self.overlap.run_ahead()
        self.clock.wait(m_end)     # this iteration's GPU work, not a chain launched after it
        timings = dict(times.ms(), start_s=wall_start - self._t0)
        totals = self.phase_totals
        totals["iterations"] += 1
        for key in ("draft_ms", "verify_ms", "select_ms"):
            totals[key] += timings[key]
        return timings

    # -- convenience ---------------------------------------------------------------------------
    def run(self, progress=None) -> None:
        """Step until every request has finished, or until a step changes nothing: then every
        request left is held (paused) or waits for pages held ones keep, and only `resume` or
        `abort` can change that (stepping on would spin)."""
        while self.has_work:
            before = self.progress_mark()
            outputs = self.step()
            if progress is not None:
                progress()
            if not outputs and self.progress_mark() == before:
                return

    def progress_mark(self) -> tuple:
        """What a step can change besides emitting tokens: prefill, admission, preemption, holds.
        A step that emits nothing and leaves this unchanged will be followed by the same."""
        return tuple((r.request_id, r.num_cached, r.status, r.held) for r in self.requests.values())
