"""Sampling parameters and batched sampling.

Contract:
- `SamplingParams` is validated at construction (and again by `validate()`); every bad value raises
  `InvalidRequestError` naming the field, the value and the allowed range. `temperature == 0` is greedy.
- `logits_to_probs(logits[N, V], params)` returns float32 probabilities, one row per request, after
  temperature, top-k, top-p and min-p, in that order, each a threshold on the scaled logits, so
  entries tied at a threshold are kept together (top-k may keep more than k; `_filter` states the
  rule); greedy rows are a one-hot at `torch.argmax` (ties: lowest index). Rows may have different parameters; the work is vectorised over rows and
  needs no host sync.
- `sample_from_probs(probs[N, V], generators)` draws one token per row with that row's generator
  (None: torch's global generator). One-hot rows always give their argmax. Seeded runs repeat exactly.
  The per-request reference (one draw per row, a host read to spot greedy rows).
- `sample_rows(logits, params, keys, positions, tag)`: filter and race in one call, the form the
  engine uses (`kernel=True` on its GPU path: `kernels.sampling`, no sort).
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
from .transfer import to_device


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
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 1 << 64):
            bad("seed", "an integer in [0, 2**64) or None")   # larger ones would collide mod 2**64
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            bad("max_tokens", "an integer >= 1")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "a sequence of non-empty strings")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", "a bool")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: Tensor, params: list[SamplingParams], kernel: bool = False) -> Tensor:
    """[N, V] logits -> [N, V] float32 probabilities; row i follows params[i]. `kernel`: through
    `kernels.sampling` (the GPU path; see `sample_rows`)."""
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(f"logits of shape {tuple(logits.shape)} do not match {len(params)} params")
    if all(p.is_greedy for p in params):
        return _one_hot(logits.float())
    t = sampling_tensors(params, logits.shape[1], logits.device)
    return sample_rows(logits, t, None, None, 0, filtered=is_filtered(params), kernel=kernel,
                       sample=False)[0]


def sample_rows(logits: Tensor, params: Tensor, keys: Tensor | None, positions: Tensor | None, tag: int,
                filtered: bool = True, kernel: bool = False, sample: bool = True):
    """(probs, tokens) for a batch: `probs_from_tensors` on `params` (`sampling_tensors`), then
    without ``sample`` nothing more, else one token per row by `sample_keyed` from (keys,
    positions, tag). ``kernel``: both in one Triton launch (`kernels.sampling.sample_rows`, no
    sort of the vocabulary; it has one form, so ``filtered`` does not apply there): the engine's
    GPU path, as the attention kernels are (`ModelRunner.kernels`)."""
    if kernel:
        from vegas_core.kernels.sampling import sample_rows as sample_rows_kernel
        return sample_rows_kernel(logits, params, keys, positions, tag, sample=sample)
    probs = probs_from_tensors(logits, *params, filtered=filtered)
    return probs, (sample_keyed(probs, keys, positions, tag) if sample else None)


def is_filtered(params: list[SamplingParams]) -> bool:
    """Whether any row filters (top-k, top-p or min-p): `probs_from_tensors` then looks for
    thresholds."""
    return any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params)


def sampling_tensors(params: list[SamplingParams], vocab: int, device) -> Tensor:
    """float32 [4, N]: per row temperature (0: greedy), top-k (vocab when off), top-p, min-p;
    what `probs_from_tensors` takes (a CUDA graph keeps them in a static buffer). Uploaded
    without waiting for the GPU (`transfer.to_device`): a verification's targets are filtered
    while its forward may still be queued."""
    return to_device([[p.temperature for p in params],
                      [p.top_k if p.top_k > 0 else vocab for p in params],
                      [p.top_p for p in params], [p.min_p for p in params]], torch.float32, device)


def _one_hot(x: Tensor) -> Tensor:
    return torch.zeros_like(x).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)


def probs_from_tensors(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor,
                       filtered: bool = True) -> Tensor:
    """`logits_to_probs` on per-row tensors [N] (see `sampling_tensors`), with no host read, so it
    can be captured in a CUDA graph. `filtered` False skips the top-k/top-p/min-p work (valid when
    no row filters); the two forms round differently, so callers that must agree choose alike.
    `kernels.sampling.sample_rows` is the GPU form of the filtered one (no sort)."""
    x = logits.float()
    greedy = (temperature == 0)[:, None]
    one_hot = _one_hot(x)
    # + 0.0 turns -0.0 into +0.0, as the kernel does for its order-preserving keys.
    x = x / torch.where(greedy[:, 0], 1.0, temperature)[:, None] + 0.0
    probs = _filter(x, top_k, top_p, min_p) if filtered else torch.softmax(x, dim=-1)
    return torch.where(greedy, one_hot, probs)


def _filter(x: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """Probabilities of the scaled logits x after top-k, top-p and min-p, renormalised. Each filter
    is a threshold on x (so ties at a threshold are all kept or all dropped, whatever their index):
    - top-k: x >= the k-th largest x;
    - top-p: x >= the largest value t at which the mass of the top-k survivors with x >= t
      reaches top_p of theirs: the smallest nucleus reaching top_p, always keeping the max;
      rows with top_p == 1 skip it, so rounding never drops tail tokens there;
    - min-p: exp(x - max) >= min_p, i.e. prob >= min_p * max prob (the max survives top-k, so
      renormalising after top-k/top-p does not change it).
    The sort here only finds the thresholds; `kernels.sampling` searches for them instead."""
    vocab = x.shape[1]
    sorted_x = x.sort(dim=-1, descending=True).values
    m = sorted_x[:, :1]
    t = sorted_x.gather(1, top_k.long().clamp(1, vocab)[:, None] - 1)          # top-k
    mass = torch.exp(sorted_x - m).masked_fill(sorted_x < t, 0.0).cumsum(dim=-1)
    first = (mass < top_p[:, None] * mass[:, -1:]).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
    t = torch.where(top_p[:, None] < 1, torch.maximum(t, sorted_x.gather(1, first)), t)  # top-p
    e = torch.exp(x - m)
    e = e.masked_fill((x < t) | (e < min_p[:, None]), 0.0)
    return e / e.sum(dim=-1, keepdim=True)


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


def sample_keyed(weights: Tensor, keys: Tensor, positions: Tensor, tag: int, kernel: bool = False) -> Tensor:
    """One token per row ([N] long) by the exponential race over `weights` (see the module
    docstring): row i draws from stream (keys[i], positions[i], tag). ``kernel``: in one Triton
    launch (`kernels.sampling.race`, the same uniforms)."""
    if weights.dim() != 2 or keys.shape != (weights.shape[0],) or positions.shape != keys.shape:
        raise ValueError(f"weights [N, V] need keys and positions [N], got {tuple(weights.shape)}, "
                         f"{tuple(keys.shape)} and {tuple(positions.shape)}")
    if kernel:
        from vegas_core.kernels.sampling import race
        return race(weights, keys, positions, tag)
    u = uniforms(keys, positions, tag, weights.shape[1])
    race = weights.float() / -torch.log(u)          # w / E: the largest is the first to arrive
    return race.argmax(dim=-1)
