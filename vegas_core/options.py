"""The engine's options: one object, validated at construction, that flows Engine -> EngineCore ->
ModelRunner -> the model, the attention backend and the kernels. Nothing else switches behaviour:
no module globals, no attributes set on the model after it is built."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import InvalidRequestError

ATTENTION_CHOICES = ("auto", "reference", "triton")
GRAPH_CHOICES = ("auto", "off", "static")


@dataclass(frozen=True)
class KernelOptions:
    """How the GPU path (Triton kernels) runs a step; the CPU reference path ignores it."""
    # Programmatic dependent launch (Hopper and later, `kernels/pdl.py`): a kernel's start-up
    # overlaps the tail of the one before it. Never under the interpreter or before sm_90.
    pdl: bool = True
    # Forwards of up to this many rows (decode and draft steps) run their projections through
    # `kernels/fused_linear.py` with the norms, SiLU * up and residual adds inside; longer ones
    # (verification, prefill) keep cuBLAS, faster there. 0: cuBLAS everywhere.
    fused_linear_rows: int = 128
    # Batch-invariant kernels (`EngineOptions.deterministic` sets it): each kernel has one launch
    # configuration whatever the forward's rows and batch, so a row's reductions run in one order:
    # every projection and the head through `fused_linear` (fused_linear_rows is then moot),
    # attention with one score tile and key splits at fixed positions, merged without atomics
    # (`verify_attention.batch_invariant_launch`; prefill too, in pieces of verification size),
    # drafts with a fixed split count (`sparse_attention.INVARIANT_SPLITS`).
    deterministic: bool = False

    def __post_init__(self):
        for name in ("pdl", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.fused_linear_rows, bool) or not isinstance(self.fused_linear_rows, int) \
                or self.fused_linear_rows < 0:
            raise InvalidRequestError(
                f"fused_linear_rows must be an integer >= 0, got {self.fused_linear_rows!r}")


@dataclass(frozen=True)
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
    # With CUDA graphs: plain decode steps a vanilla batch runs on the GPU per host round trip (a
    # request that stops early wastes at most multi_step - 1 steps of one row).
    multi_step: int = 16
    # With CUDA graphs: launch the next iteration's chain before returning (`overlap.Overlap`),
    # so the GPU works while the host emits, schedules and records the trace.
    run_ahead: bool = True
    # Batch-invariant mode: on the kernel path a position's logits do not depend on the batch, the
    # rows of its forward, or whether a decode step or a verification computed them, so every
    # method's greedy output equals vanilla's bit for bit in bf16 and a seeded request samples the
    # same text alone or in a batch (`KernelOptions.deterministic` says how). It costs throughput.
    # The CPU reference path has no such mode (in float32 its outputs match without it).
    deterministic: bool = False
    kernels: KernelOptions = field(default_factory=KernelOptions)

    def __post_init__(self):
        if self.attention not in ATTENTION_CHOICES:
            raise InvalidRequestError(
                f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {self.attention!r}")
        if self.cuda_graphs not in GRAPH_CHOICES:
            raise InvalidRequestError(
                f"cuda_graphs must be one of {', '.join(GRAPH_CHOICES)}, got {self.cuda_graphs!r}")
        for name in ("block_size", "max_num_seqs", "max_prefill_tokens", "multi_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequestError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 < self.gpu_memory_fraction <= 1:
            raise InvalidRequestError(
                f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction!r}")
        if not isinstance(self.kernels, KernelOptions):
            raise InvalidRequestError(f"kernels must be a KernelOptions, got {self.kernels!r}")
        if not isinstance(self.deterministic, bool):
            raise InvalidRequestError(f"deterministic must be True or False, got {self.deterministic!r}")
        if self.kernels.deterministic != self.deterministic:
            # The kernels read their own options; this switch is the one that counts (so that
            # `dataclasses.replace(options, deterministic=...)` works), copied there.
            object.__setattr__(self, "kernels", replace(self.kernels, deterministic=self.deterministic))
