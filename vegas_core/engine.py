"""The front end: text in, text out. Loads a model, tokenizes (with the model's chat template when
asked), drives the `EngineCore`, detokenizes incrementally and applies stop strings.

    engine = Engine()                                   # embedded SmolLM2-135M-Instruct on CPU/GPU
    [result] = engine.generate(["What is 2+2?"], SamplingParams(max_tokens=32), chat=True)
    for event in engine.stream("Tell me a story", spec=SpecParams(method="vegas")):
        print(event.text_delta, end="")
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .engine_core import EngineCore, EngineOptions, StepOutput
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

    def update(self, out: StepOutput) -> tuple[str, bool]:
        self.iterations += 1
        if out.num_drafted:
            self.spec_iterations += 1
            self.accepted += out.num_accepted
            for i in range(out.num_accepted):
                self.per_position[i] += 1
        # The decoder holds back an incomplete UTF-8 sequence until its next byte (or the end).
        delta = self.decoder.step(self.req.output_ids)
        if out.finished:
            delta += self.decoder.flush()
        full = self.text + delta
        start = max(0, len(self.text) - self.longest_stop + 1)   # a stop may straddle old and new text
        for stop in self.req.sampling.stop:
            at = full.find(stop, start)
            if at != -1:
                full = full[:at]
                delta, self.text = full[len(self.text):], full
                return delta, True
        self.text = full
        return delta, False


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

    # -- prompts -------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int], chat: bool = False,
                      system: str | None = None) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRequestError("the prompt is empty")
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + \
                       [{"role": "user", "content": prompt}]
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(prompt)

    # -- requests ------------------------------------------------------------------------------
    def add(self, prompt: str | list[int], sampling: SamplingParams | None = None,
            spec: SpecParams | None = None, chat: bool = False) -> Request:
        ids = self.encode_prompt(prompt, chat)
        req = self.core.add_request(ids, sampling or SamplingParams(), spec)
        self._trackers[req.request_id] = _Tracker(req, self.tokenizer)
        return req

    def fork(self, parent: Request, sampling: SamplingParams | None = None,
             spec: SpecParams | None = None) -> Request:
        """A request with `parent`'s prompt whose KV cache starts as a copy of the parent's
        (`EngineCore.fork`): comparing settings on one prompt pays for its prefill once."""
        req = self.core.fork(parent, sampling or SamplingParams(), spec)
        self._trackers[req.request_id] = _Tracker(req, self.tokenizer)
        return req

    def pause(self, request_id: int) -> None:
        self.core.pause(request_id)

    def resume(self, request_id: int, iterations: int | None = None) -> None:
        self.core.resume(request_id, iterations)

    def abort(self, request_id: int) -> None:
        self.core.abort(request_id)
        self._trackers.pop(request_id, None)

    def step(self) -> list[StreamEvent]:
        events = []
        for out in self.core.step():
            tracker = self._trackers.get(out.request.request_id)
            if tracker is None:
                continue
            delta, stopped = tracker.update(out)
            if stopped and not out.finished:
                self.core.finish(out.request, "stop")
            events.append(StreamEvent(out.request.request_id, delta, out.new_token_ids, out.rejected_ids,
                                      out.request.finished, out.request.finish_reason, out.iteration,
                                      out.selected, out.accept_draws))
        return events

    def result(self, req: Request) -> GenerationResult:
        tr = self._trackers[req.request_id]
        return GenerationResult(
            request_id=req.request_id, text=tr.text, token_ids=req.output_ids, prompt_ids=req.prompt_ids,
            prompt_tokens=req.num_prompt,
            generated_tokens=len(req.output_ids), finish_reason=req.finish_reason,
            decode_time_s=req.decode_time_s, prefill_time_s=req.prefill_time_s, iterations=req.iterations,
            num_iterations=tr.iterations,
            spec_iterations=tr.spec_iterations, accepted=tr.accepted, per_position_accepted=tr.per_position,
            gamma=req.spec.gamma if req.spec.speculative else 0, num_preemptions=req.num_preemptions)

    # -- batch and stream ----------------------------------------------------------------------
    def generate(self, prompts: list[str | list[int]], sampling: SamplingParams | list[SamplingParams] | None = None,
                 spec: SpecParams | None = None, chat: bool = False, progress=None) -> list[GenerationResult]:
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        reqs = [self.add(p, s, spec, chat) for p, s in zip(prompts, samplings)]
        while any(not r.finished for r in reqs):
            events = self.step()
            if progress is not None:
                progress(events)
        results = [self.result(r) for r in reqs]
        for r in reqs:
            self._trackers.pop(r.request_id, None)
        return results

    def stream(self, prompt: str | list[int], sampling: SamplingParams | None = None,
               spec: SpecParams | None = None, chat: bool = False) -> Iterator[StreamEvent]:
        req = self.add(prompt, sampling, spec, chat)
        try:
            while not req.finished:
                for ev in self.step():
                    if ev.request_id == req.request_id:
                        yield ev
        finally:
            if not req.finished:
                self.core.abort(req.request_id)
        self.last_result = self.result(req)
        self._trackers.pop(req.request_id, None)

