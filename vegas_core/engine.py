"""The front end: text in, text out. Loads a model, tokenizes (with the model's chat template when
asked), drives the `EngineCore`, detokenizes incrementally and applies stop strings.

    engine = Engine()                                   # embedded SmolLM2-135M-Instruct on CPU/GPU
    [result] = engine.generate(["What is 2+2?"], SamplingParams(max_tokens=32), chat=True)
    for event in engine.stream("Tell me a story", spec=SpecParams(method="vegas")):
        print(event.text_delta, end="")

Threads: one `Engine` may be shared. Every public method takes the engine's lock, so concurrent
callers are served one at a time, never interleaved inside a step: `generate` holds the lock for the
whole call; `stream` holds it while it steps. A stream suspended between the events it yields keeps
its request running (so a lone stream keeps the GPU's chains launched ahead) until another caller
steps the engine: that caller holds (pauses) it first, and the stream resumes it when iterated
again. So a stream whose consumer is elsewhere neither decodes inside other callers' steps nor
blocks them. A stream owns its request's pause state.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .engine_core import EngineCore, StepOutput
from .options import EngineOptions
from .errors import InvalidRequestError
from .loader import load_model
from .request import Request
from .sampling import SamplingParams
from .spec import SpecParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("--device cuda was asked for, but no CUDA GPU is available")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InvalidRequestError(f"unknown device {device!r}; use cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


@dataclass
class StreamEvent:
    request_id: int
    text_delta: str
    new_token_ids: list[int]
    rejected_ids: list[int]
    finished: bool
    finish_reason: str | None
    iteration: dict | None
    selected: dict | None = None              # `StepOutput.selected`: the set chosen for the next drafts
    accept_draws: list[float] | None = None   # `StepOutput.accept_draws`: the acceptance test's u_j


@dataclass
class GenerationResult:
    request_id: int
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    prompt_tokens: int
    generated_tokens: int
    finish_reason: str | None
    decode_time_s: float
    prefill_time_s: float
    iterations: list[dict] = field(default_factory=list)   # trace records, when tracing
    num_iterations: int = 0
    spec_iterations: int = 0
    accepted: int = 0
    per_position_accepted: list[int] = field(default_factory=list)
    gamma: int = 0
    num_preemptions: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_time_s if self.decode_time_s > 0 else 0.0

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.spec_iterations if self.spec_iterations else None

    @property
    def per_position_acceptance(self) -> list[float] | None:
        if not self.spec_iterations:
            return None
        return [a / self.spec_iterations for a in self.per_position_accepted]


class _Tracker:
    """Per request: incremental text, stop strings and acceptance counters. The text grows by
    what the new tokens add (`IncrementalDecoder`: a short window re-decoded per step, not the whole
    output, which at batch 64 would cost milliseconds per step on the host)."""

    def __init__(self, req: Request, tokenizer):
        self.req, self.tok = req, tokenizer
        self.text = ""
        self.decoder = tokenizer.incremental_decoder()
        self.longest_stop = max((len(s) for s in req.sampling.stop), default=0)
        self.spec_iterations = self.accepted = self.iterations = 0
        self.per_position = [0] * req.spec.gamma

    def update(self, out: StepOutput, end: int) -> tuple[str, int | None]:
        """(text delta, None) or, when a stop string appeared, (delta up to the stop, how many of
        this step's new tokens to keep). `end`: the output's length after this step's tokens."""
        self.iterations += 1
        if out.num_drafted:
            self.spec_iterations += 1
            self.accepted += out.num_accepted
            for i in range(out.num_accepted):
                self.per_position[i] += 1
        # The decoder holds back an incomplete UTF-8 sequence until its next byte (or the end).
        delta = self.decoder.step(self.req.output_ids[:end])
        if out.finished:
            delta += self.decoder.flush()
        full = self.text + delta
        if self._find_stop(full, len(self.text)) is None:
            self.text = full
            return delta, None
        return self._cut_at_stop(len(out.new_token_ids), end)

    def _find_stop(self, text: str, old_len: int) -> int | None:
        """Where the first stop string (in the order given) starts, looking from where one could
        straddle the old text and the new."""
        start = max(0, old_len - self.longest_stop + 1)
        for stop in self.req.sampling.stop:
            at = text.find(stop, start)
            if at != -1:
                return at
        return None

    def _cut_at_stop(self, num_new: int, end: int) -> tuple[str, int]:
        """A speculative iteration (or a chained GPU decode) emits several tokens at once: keep
        only those up to the one that completed the stop string, as one-token steps would have."""
        ids, before = self.req.output_ids, end - num_new
        emitted = previous = self.text
        for keep in range(1, num_new + 1):
            text = self.tok.decode(ids[:before + keep])
            at = self._find_stop(text, len(previous))
            if at is not None:
                self.text = text[:at]
                return self.text[len(emitted):], keep
            previous = text
        raise AssertionError("a stop string found in the streamed text is not in the decoded text")


class Engine:
    def __init__(self, model: str | None = None, device: str | None = None, dtype: str | None = None,
                 spec: SpecParams | None = None, options: EngineOptions | None = None, loaded=None):
        """`loaded`: an already loaded model (`loader.load_model`), e.g. shared by tests."""
        t = time.perf_counter()
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        loaded = loaded or load_model(model)
        self.config, self.tokenizer, self.source = loaded.config, loaded.tokenizer, loaded.source
        self.core = EngineCore(loaded.config, loaded.weights, self.device, self.dtype, options,
                               spec or SpecParams(method="vanilla"))
        self.load_time_s = time.perf_counter() - t
        self._trackers: dict[int, _Tracker] = {}
        self._lock = threading.RLock()   # see the module docstring: callers are served one at a time
        # Requests of streams suspended between events -> whether another caller has paused it.
        self._suspended: dict[int, bool] = {}

    @property
    def mode(self) -> str:
        """How this engine computes: "deterministic" (the Triton kernels, batch-invariant:
        `EngineOptions.deterministic`; every method's greedy output equals vanilla's bit for bit),
        "default" (the kernels' fastest launches; in bf16 near-ties may break differently from one
        batch to another) or "reference" (the PyTorch reference path, which has no
        batch-invariant mode: in float32 its outputs have matched without one). A model whose
        layers run PyTorch's ops around the kernels (Gemma 3: `gemma.py`) is "default" even so."""
        runner = self.core.runner
        if not runner.kernels:
            return "reference"
        return "deterministic" if runner.model.deterministic else "default"

    # -- prompts -------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int], chat: bool = False,
                      system: str | None = None) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        if not isinstance(prompt, str):
            raise InvalidRequestError(
                f"the prompt must be text or a list of token ids, got {type(prompt).__name__}")
        if not prompt.strip():
            raise InvalidRequestError("the prompt is empty")
        check_unicode(prompt, "the prompt")
        if chat:
            if system is not None:
                check_unicode(system, "the system prompt")
            messages = ([{"role": "system", "content": system}] if system else []) + \
                       [{"role": "user", "content": prompt}]
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        # A plain prompt gets the BOS the tokenizer asks for (Gemma's); a chat template writes its own.
        return self.tokenizer.encode(prompt, add_special_tokens=not chat)

    # -- requests ------------------------------------------------------------------------------
    def add(self, prompt: str | list[int], sampling: SamplingParams | None = None,
            spec: SpecParams | None = None, chat: bool = False, trace: bool | None = None) -> Request:
        """Queue a request; `trace`: record its iterations (None: `EngineOptions.trace`)."""
        ids = self.encode_prompt(prompt, chat)
        with self._lock:
            return self._add_ids(ids, sampling, spec, trace)

    def _add_ids(self, ids: list[int], sampling: SamplingParams | None, spec: SpecParams | None,
                 trace: bool | None = None) -> Request:
        req = self.core.add_request(ids, sampling or SamplingParams(), spec, trace)
        self._trackers[req.request_id] = _Tracker(req, self.tokenizer)
        return req

    def fork(self, parent: Request, sampling: SamplingParams | None = None,
             spec: SpecParams | None = None, trace: bool | None = None) -> Request:
        """A request with `parent`'s prompt whose KV cache starts as a copy of the parent's
        (`EngineCore.fork`): comparing settings on one prompt pays for its prefill once."""
        with self._lock:
            req = self.core.fork(parent, sampling or SamplingParams(), spec, trace)
            self._trackers[req.request_id] = _Tracker(req, self.tokenizer)
            return req

    def pause(self, request_id: int) -> None:
        with self._lock:
            self.core.pause(request_id)

    def resume(self, request_id: int, iterations: int | None = None) -> None:
        with self._lock:
            self.core.resume(request_id, iterations)

    def abort(self, request_id: int) -> None:
        """Stop a request and free its pages and bookkeeping (a finished one: its bookkeeping)."""
        with self._lock:
            self.core.abort(request_id)
            self._trackers.pop(request_id, None)

    def step(self) -> list[StreamEvent]:
        with self._lock:
            for rid, paused in self._suspended.items():
                if not paused:                 # a suspended stream's request sits this step out
                    self.core.pause(rid)
                    self._suspended[rid] = True
            return [ev for out in self.core.step() for ev in self._events(out)]

    def _events(self, out: StepOutput) -> list[StreamEvent]:
        """The step's event for one request; a traced chained decode (one record per plain step)
        gives one event per step, as one step at a time does, up to a stop string."""
        if len(out.iterations) <= 1:
            ev = self._event(out, len(out.request.output_ids))
            return [] if ev is None else [ev]
        events, end = [], len(out.request.output_ids) - len(out.new_token_ids)
        last = len(out.iterations) - 1
        for j, (tok, rec) in enumerate(zip(out.new_token_ids, out.iterations)):
            end += 1
            part = dataclasses.replace(out, new_token_ids=[tok], finished=out.finished and j == last,
                                       iterations=[rec])
            ev = self._event(part, end)
            if ev is not None:
                events.append(ev)
            if ev is None or ev.finished:
                break
        return events

    def _event(self, out: StepOutput, end: int) -> StreamEvent | None:
        """`end`: the request's output length after `out`'s tokens."""
        req = out.request
        tracker = self._trackers.get(req.request_id)
        if tracker is None:
            return None
        delta, keep = tracker.update(out, end)
        new_ids, finished = out.new_token_ids, out.finished
        record = out.iterations[0] if out.iterations else None
        if keep is not None:
            cut = req.num_prompt + end - len(new_ids) + keep
            if cut < len(req.token_ids):      # tokens past the stop string: not part of the output
                del req.token_ids[cut:]
                new_ids = new_ids[:keep]
                req.finish_reason = "stop"
                if record is not None:      # the trace's emitted tokens are the output's
                    record["emitted"] = record["emitted"][:keep]
                    del req.iterations[record["index"] + 1:]
            self.core.finish(req, "stop")
            finished = True
        if finished:
            # The request keeps its result; the engine keeps nothing of a finished request.
            req.result = self._result(req, self._trackers.pop(req.request_id))
        return StreamEvent(req.request_id, delta, new_ids, out.rejected_ids, finished, req.finish_reason,
                           record, out.selected, out.accept_draws)

    def result(self, req: Request) -> GenerationResult:
        """The request's result: its final one once it has finished (kept on the request, so the
        engine holds nothing of it), else what it has generated so far."""
        with self._lock:
            tracker = self._trackers.get(req.request_id)
        if tracker is None and req.result is not None:
            return req.result
        if tracker is None:
            raise InvalidRequestError(f"request {req.request_id} is not this engine's, or was aborted")
        return self._result(req, tracker)

    @staticmethod
    def _result(req: Request, tr: "_Tracker") -> GenerationResult:
        return GenerationResult(
            request_id=req.request_id, text=tr.text, token_ids=req.output_ids, prompt_ids=req.prompt_ids,
            prompt_tokens=req.num_prompt,
            generated_tokens=len(req.output_ids), finish_reason=req.finish_reason,
            decode_time_s=req.decode_time_s, prefill_time_s=req.prefill_time_s, iterations=req.iterations,
            num_iterations=tr.iterations,
            spec_iterations=tr.spec_iterations, accepted=tr.accepted, per_position_accepted=tr.per_position,
            gamma=req.spec.gamma if req.spec.speculative else 0, num_preemptions=req.num_preemptions)

    def _release(self, req: Request) -> None:
        """However a call ends (result, exception, `break`, garbage collection): the request
        stops, its pages go back and its tracker is dropped."""
        with self._lock:
            self.core.abort(req.request_id)
            self._trackers.pop(req.request_id, None)
            self._suspended.pop(req.request_id, None)

    def _step_checked(self) -> list[StreamEvent]:
        """One step; raises when it changed nothing, since the next would not either (every
        runnable request held, or waiting for pages that held requests keep)."""
        before = self.core.progress_mark()
        events = self.step()
        if not events and self.core.progress_mark() == before:
            raise InvalidRequestError("no request can make progress: the rest are paused, or wait for "
                                      "KV pages that paused requests hold")
        return events

    def warm_up(self, prompt: str | list[int], sampling: SamplingParams | None = None,
                spec: SpecParams | None = None, batch: int = 1) -> float | None:
        """On CUDA graphs: a short generation with these settings (every kind of step once: decode,
        draft, verification), `batch` copies of the prompt at once (graphs are captured per batch
        bucket), so that graph capture and kernel compilation stay out of a timed run that
        follows. Returns its seconds, or None where nothing is captured (CPU, eager)."""
        if self.core.runner.graphs is None:
            return None
        spec = spec or self.core.spec
        sampling = sampling or SamplingParams()
        steps = 3 * (spec.gamma + 1) if spec.speculative else 2 * self.core.options.multi_step
        short = dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, steps), ignore_eos=True,
                                    stop=())
        t = time.perf_counter()
        self.generate([prompt] * batch, short, spec)
        return time.perf_counter() - t

    # -- batch and stream ----------------------------------------------------------------------
    def generate(self, prompts: list[str | list[int]], sampling: SamplingParams | list[SamplingParams] | None = None,
                 spec: SpecParams | None = None, chat: bool = False, progress=None) -> list[GenerationResult]:
        """Every prompt is checked before any is queued; however the call ends, none of its
        requests stays queued."""
        if not isinstance(prompts, (list, tuple)):
            raise InvalidRequestError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
        samplings = sampling if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        if len(samplings) != len(prompts):
            raise InvalidRequestError(f"{len(samplings)} sampling parameters for {len(prompts)} prompts: "
                                      "give one, or one per prompt")
        samplings = [s or SamplingParams() for s in samplings]
        with self._lock:
            encoded = []
            for i, (p, s) in enumerate(zip(prompts, samplings)):
                try:
                    encoded.append(self.encode_prompt(p, chat))
                    self.core._validate(encoded[-1], s, spec or self.core.spec)
                except InvalidRequestError as e:
                    raise InvalidRequestError(f"prompt {i}: {e}") from None
            reqs = []
            try:
                for ids, s in zip(encoded, samplings):
                    reqs.append(self._add_ids(ids, s, spec))
                while any(not r.finished for r in reqs):
                    events = self._step_checked()
                    if progress is not None:
                        progress(events)
                return [self.result(r) for r in reqs]
            finally:
                for r in reqs:
                    self._release(r)

    def stream(self, prompt: str | list[int], sampling: SamplingParams | None = None,
               spec: SpecParams | None = None, chat: bool = False) -> Iterator[StreamEvent]:
        """Events of one request as it decodes. It decodes only while this generator is being
        iterated or nobody else steps the engine (see the module docstring); closing or dropping
        the generator frees it."""
        with self._lock:   # suspended from the start: no other caller's step may decode it unseen
            req = self.add(prompt, sampling, spec, chat)
            rid = req.request_id
            self._suspended[rid] = False
        try:
            while not req.finished:
                with self._lock:
                    if self._suspended.pop(rid, False):   # another caller held it meanwhile
                        self.core.resume(rid)
                    events = []
                    while not req.finished and not events:
                        events = [ev for ev in self._step_checked() if ev.request_id == rid]
                    if not req.finished:
                        self._suspended[rid] = False
                yield from events
            self.last_result = self.result(req)
        finally:
            self._release(req)


def check_unicode(text: str, what: str) -> None:
    """Text that cannot be UTF-8 (a lone surrogate, e.g. a non-UTF-8 byte in a command-line
    argument, which Python keeps as U+DC80..U+DCFF) is refused before the tokenizer sees it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        what_char = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"lone surrogate U+{ch:04X}"
        raise InvalidRequestError(f"{what} is not valid UTF-8 text: {what_char} at character {e.start}") from None
