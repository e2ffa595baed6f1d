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
  The per-request reference (one draw per row, a host read to spot greedy rows).
- `sample_keyed(weights[N, V], keys, positions, tag)`: the engine's batched form, one token per row
  from that row's counter-based stream (`random_streams`): the exponential race, argmax_j
  w_j / E_j with E_j = -log(u_j) exponential, which picks j with probability w_j / sum(w). The
  weights need not be normalised (a residual max(0, p - q) works as is); zero weights are never
  picked; a one-hot row gives its token. One vectorised call, no host read.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InvalidRequestError
from .random_streams import uniforms


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
    if all(p.is_greedy for p in params):
        return _one_hot(logits.float())
    t = sampling_tensors(params, logits.shape[1], logits.device)
    return probs_from_tensors(logits, *t, filtered=is_filtered(params))


def is_filtered(params: list[SamplingParams]) -> bool:
    """Whether any row filters (top-k, top-p or min-p): `probs_from_tensors` then sorts."""
    return any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params)


def sampling_tensors(params: list[SamplingParams], vocab: int, device) -> Tensor:
    """float32 [4, N]: per row temperature (0: greedy), top-k (vocab when off), top-p, min-p;
    what `probs_from_tensors` takes (a CUDA graph keeps them in a static buffer)."""
    return torch.tensor([[p.temperature for p in params],
                         [p.top_k if p.top_k > 0 else vocab for p in params],
                         [p.top_p for p in params], [p.min_p for p in params]],
                        dtype=torch.float32, device=device)


def _one_hot(x: Tensor) -> Tensor:
    return torch.zeros_like(x).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)


def probs_from_tensors(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor,
                       filtered: bool = True) -> Tensor:
    """`logits_to_probs` on per-row tensors [N] (see `sampling_tensors`), with no host read, so it
    can be captured in a CUDA graph. `filtered` False skips the top-k/top-p/min-p work (valid when
    no row filters); the two forms round differently, so callers that must agree choose alike."""
    x = logits.float()
    greedy = (temperature == 0)[:, None]
    one_hot = _one_hot(x)
    x = x / torch.where(greedy[:, 0], 1.0, temperature)[:, None]
    if not filtered:
        probs = torch.softmax(x, dim=-1)
    else:
        # Work in sorted order (stable: ties keep the lower index first), then scatter back.
        sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
        probs = torch.zeros_like(x).scatter_(1, order, _filter_sorted(sorted_x, top_k, top_p, min_p))
    return torch.where(greedy, one_hot, probs)


def _filter_sorted(sorted_x: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """Probabilities of scaled logits given in descending order, after top-k, top-p and min-p,
    renormalised (the same order)."""
    pos = torch.arange(sorted_x.shape[1], device=sorted_x.device)
    sorted_x = sorted_x.masked_fill(pos >= top_k[:, None], float("-inf"))  # exactly k survive
    sp = torch.softmax(sorted_x, dim=-1)
    # Nucleus: keep token j while the mass strictly before it is < top_p; this is the smallest set
    # whose mass reaches top_p and always keeps the first token. Rows with top_p == 1 skip it, so
    # rounding in the cumulative sum never drops tail tokens there.
    tp = top_p[:, None]
    mass_before = sp.cumsum(dim=-1) - sp
    drop = (mass_before >= tp) & (tp < 1)
    # min-p is relative to the max prob (column 0), so renormalising after top-k/top-p doesn't change it.
    drop |= sp < min_p[:, None] * sp[:, :1]
    sp = sp.masked_fill(drop, 0.0)
    return sp / sp.sum(dim=-1, keepdim=True)


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


def sample_keyed(weights: Tensor, keys: Tensor, positions: Tensor, tag: int) -> Tensor:
    """One token per row ([N] long) by the exponential race over `weights` (see the module
    docstring): row i draws from stream (keys[i], positions[i], tag)."""
    if weights.dim() != 2 or keys.shape != (weights.shape[0],) or positions.shape != keys.shape:
        raise ValueError(f"weights [N, V] need keys and positions [N], got {tuple(weights.shape)}, "
                         f"{tuple(keys.shape)} and {tuple(positions.shape)}")
    u = uniforms(keys, positions, tag, weights.shape[1])
    race = weights.float() / -torch.log(u)          # w / E: the largest is the first to arrive
    return race.argmax(dim=-1)
