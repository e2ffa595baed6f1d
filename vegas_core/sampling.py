"""Sampling parameters and batched sampling.

Contract:
- `SamplingParams` is validated at construction (and again by `validate()`); every bad value raises
  `InvalidRequestError` naming the field, the value and the allowed range. `temperature == 0` is greedy.
- `logits_to_probs(logits[N, V], params)` returns float32 probabilities, one row per request, after
  temperature, top-k, top-p and min-p, in that order; greedy rows are a one-hot at `torch.argmax`
  (ties: lowest index). Rows may have different parameters; the work is vectorised over rows and
  needs no host sync.
- `sample_from_probs(probs[N, V], generators)` draws one token per row with that row's generator
  (None: torch's global generator). One-hot rows always give their argmax. Seeded runs repeat exactly.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InvalidRequestError


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0              # nucleus mass in (0, 1]; 1 = disabled
    top_k: int = -1                 # -1 or 0 = disabled
    min_p: float = 0.0              # drop tokens with prob < min_p * max prob; 0 = disabled
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, list):
            self.stop = tuple(self.stop)
        self.validate()

    def validate(self) -> None:
        def bad(field: str, allowed: str):
            raise InvalidRequestError(f"{field} must be {allowed}, got {getattr(self, field)!r}")

        t = self.temperature
        if not _is_number(t) or not math.isfinite(t) or t < 0:
            bad("temperature", "a finite number >= 0 (0 = greedy)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:  # NaN fails the comparison
            bad("top_p", "a number in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "an integer >= -1 (-1 or 0 = disabled)")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "a number in [0, 1]")
        if self.seed is not None and not _is_int(self.seed):
            bad("seed", "an integer or None")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            bad("max_tokens", "an integer >= 1")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "a sequence of non-empty strings")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", "a bool")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """[N, V] logits -> [N, V] float32 probabilities; row i follows params[i]."""
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(f"logits of shape {tuple(logits.shape)} do not match {len(params)} params")
    logits = logits.float()
    vocab = logits.shape[1]
    dev = logits.device
    greedy = [p.is_greedy for p in params]
    one_hot = torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    if all(greedy):
        return one_hot

    temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], device=dev)
    x = logits / temps[:, None]
    filtered = any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params)
    if not filtered:
        probs = torch.softmax(x, dim=-1)
    else:
        # Work in sorted order (stable: ties keep the lower index first), then scatter back.
        sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
        pos = torch.arange(vocab, device=dev)
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=dev)
        sorted_x = sorted_x.masked_fill(pos >= top_k[:, None], float("-inf"))  # exactly k survive
        sp = torch.softmax(sorted_x, dim=-1)
        # Nucleus: keep token j while the mass strictly before it is < top_p; this is the smallest set
        # whose mass reaches top_p and always keeps the first token. Rows with top_p == 1 skip it, so
        # rounding in the cumulative sum never drops tail tokens there.
        top_p = torch.tensor([p.top_p for p in params], device=dev)[:, None]
        mass_before = sp.cumsum(dim=-1) - sp
        drop = (mass_before >= top_p) & (top_p < 1)
        # min-p is relative to the max prob (column 0), so renormalising after top-k/top-p doesn't change it.
        min_p = torch.tensor([p.min_p for p in params], device=dev)[:, None]
        drop |= sp < min_p * sp[:, :1]
        sp = sp.masked_fill(drop, 0.0)
        sp = sp / sp.sum(dim=-1, keepdim=True)
        probs = torch.zeros_like(sp).scatter_(1, order, sp)

    greedy_rows = torch.tensor(greedy, device=dev)[:, None]
    return torch.where(greedy_rows, one_hot, probs)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded with `seed` on `device`, or None (use torch's global RNG) when seed is None."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def sample_from_probs(probs: Tensor, generators: list[torch.Generator | None]) -> Tensor:
    """One token per row ([N] long). Row i uses generators[i] (on probs' device; None: torch's global
    RNG). One-hot rows (greedy) return their argmax whatever the draw."""
    if probs.dim() != 2 or probs.shape[0] != len(generators):
        raise ValueError(f"probs of shape {tuple(probs.shape)} do not match {len(generators)} generators")
    max_p, argmax = probs.max(dim=-1)
    if bool((max_p >= 1.0).all()):
        return argmax  # all greedy: no draw needed
    if all(g is None for g in generators):
        out = torch.multinomial(probs, 1).view(-1)
    else:
        out = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])
    # Greedy rows (one-hot from logits_to_probs) are exact without trusting the sampler.
    return torch.where(max_p >= 1.0, argmax, out)
