"""The engine's options: one object, validated at construction, that flows Engine -> EngineCore ->
ModelRunner -> the model, the attention backend and the kernels. Nothing else switches behaviour:
no module globals, no attributes set on the model after it is built."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace

from .errors import InvalidRequestError

ATTENTION_CHOICES = ("auto", "reference", "triton")
GRAPH_CHOICES = ("auto", "off", "static")

LinearShape = tuple[int, int, bool]                  # (N, K, silu_mul) of a fused_linear product
LinearConfig = tuple[int, int, int, int, int]        # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)


@dataclass(frozen=True)
class InvariantConfig:
    """The batch-invariant mode's launch configuration (`KernelOptions.invariant`): one fixed choice
    per model shape that every call takes (decode step, verification, prefill piece), so a row's
    reductions run in one order whatever the batch. Any values keep that promise in principle;
    whether a compiled choice also keeps a row's bits identical on a GPU is what
    `python -m vegas_core.bench invariant` checks before it proposes one (its result file is what
    `from_file` reads). A 0 (or None) takes the per-shape default that
    `kernels.verify_attention.batch_invariant_launch` and `kernels.fused_linear` give."""
    # verify_attention (kernels/verify_attention.py, `verify_attention_into`'s arguments):
    block_m: int = 0         # score tile rows (query rows x GQA group); 0: the tile 17 rows need.
    #                          Smaller: a request's rows in chunks of block_m // group, a program each
    block_n: int = 0         # keys per tile; 0: 128 at head dim <= 64, 64 above
    num_warps: int = 0       # 0: 8 for a tile of 128 rows or more, else 4
    num_stages: int = 2
    split_keys: int = 1024   # keys per split, splits at fixed positions (a multiple of block_n)
    max_registers: int = 0   # per thread (maxnreg); 0: the compiler's choice
    page_ahead: int = 0      # tiles ahead whose block-table entries are loaded (0, 1 or 2)
    fused_merge: bool = False      # the last split merges (in split order), not a merge kernel
    unmasked_tiles: bool = False   # tiles every row sees whole skip the masks
    # kernels/fused_linear.py (every projection and the head): (N, K, silu_mul) -> config pairs;
    # shapes not listed take fused_linear.CONFIGS / DEFAULT_CONFIG.
    linear: tuple[tuple[LinearShape, LinearConfig], ...] = ()
    head: LinearConfig | None = None   # the head's product; None: fused_linear.HEAD_CONFIG
    source: str = field(default="", compare=False)   # where it was read from (recorded only)

    ATTENTION_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "split_keys",
                        "max_registers", "page_ahead", "fused_merge", "unmasked_tiles")

    def __post_init__(self):
        for name in self.ATTENTION_FIELDS:
            value = getattr(self, name)
            if name in ("fused_merge", "unmasked_tiles"):
                if not isinstance(value, bool):
                    raise InvalidRequestError(f"invariant {name} must be True or False, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequestError(f"invariant {name} must be an integer >= 0, got {value!r}")
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value and (value < 16 or value & (value - 1)):
                raise InvalidRequestError(f"invariant {name} must be 0 or a power of two >= 16, got {value}")
        if self.num_warps not in (0, 1, 2, 4, 8, 16):
            raise InvalidRequestError(f"invariant num_warps must be 0 or a power of two <= 16, got {self.num_warps}")
        if self.num_stages < 1 or self.split_keys < 1:
            raise InvalidRequestError("invariant num_stages and split_keys must be >= 1")
        if self.page_ahead > 2:
            raise InvalidRequestError(f"invariant page_ahead must be 0, 1 or 2, got {self.page_ahead}")
        linear = tuple((_linear_shape(s), _linear_config(c)) for s, c in self.linear)
        object.__setattr__(self, "linear", linear)
        if self.head is not None:
            object.__setattr__(self, "head", _linear_config(self.head))

    def linear_table(self) -> dict[LinearShape, LinearConfig]:
        """{(N, K, silu_mul): config} of the products this configuration sets."""
        return dict(self.linear)

    def to_dict(self) -> dict:
        """JSON-ready: `linear` as {"NxK" or "NxK silu": [5 ints]} (as bench e2e names them)."""
        d = {name: getattr(self, name) for name in self.ATTENTION_FIELDS}
        d["linear"] = {linear_key(s): list(c) for s, c in self.linear}
        d["head"] = None if self.head is None else list(self.head)
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "InvariantConfig":
        known = {f.name for f in fields(cls)} - {"linear", "head", "source"}
        unknown = set(d) - known - {"linear", "head", "source"}
        if unknown:
            raise InvalidRequestError(f"unknown invariant configuration fields: {sorted(unknown)}")
        linear = tuple((parse_linear_key(k), tuple(c)) for k, c in (d.get("linear") or {}).items())
        head = d.get("head")
        return cls(**{k: d[k] for k in known if k in d}, linear=linear,
                   head=None if head is None else tuple(head), source=source or d.get("source", ""))

    @classmethod
    def from_file(cls, path: str, heads: int, kv_heads: int, head_dim: int) -> "InvariantConfig":
        """The configuration a JSON file holds for a model of this attention shape: a `bench
        invariant` result (its `best`, one entry per shape) or a bare `to_dict` object."""
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise InvalidRequestError(f"cannot read the invariant configuration {path}: {e}") from e
        if "best" not in doc:
            return cls.from_dict(doc, source=path)
        want = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim)
        for name, entry in (doc.get("best") or {}).items():
            shape = entry.get("shape", {})
            if all(shape.get(k) == v for k, v in want.items()) and entry.get("config"):
                return cls.from_dict(entry["config"], source=f"{path}#{name}")
        raise InvalidRequestError(f"{path} has no invariant configuration for {heads} query heads, "
                                  f"{kv_heads} KV heads and head dim {head_dim}")

    def record(self) -> dict:
        """What a result file records: the fields and where they came from."""
        return dict(self.to_dict(), source=self.source or "built-in defaults")


# The batch-invariant launches measured fastest on a GPU for a model's attention shape (query heads,
# KV heads, head dim), each checked bit-invariant there by `bench invariant`; an engine whose options
# leave the defaults takes them (`with_measured_invariant`). SmolLM2: +4 % / +11 % over the default
# mode's attention against +15 % / +62 % for the built-in choice (bench/NOTES.md).
MEASURED_INVARIANT = {
    (9, 3, 64): ("bench/results/invariant-2026-12-06-h100-smollm2.json",
                 dict(block_m=32, block_n=64, num_warps=4, unmasked_tiles=True)),
}


def with_measured_invariant(options: "EngineOptions", heads: int, kv_heads: int, head_dim: int) -> "EngineOptions":
    """`options` with `MEASURED_INVARIANT`'s launches for this attention shape where its invariant
    configuration is the built-in default; as given otherwise (a tuned file, another shape)."""
    entry = MEASURED_INVARIANT.get((heads, kv_heads, head_dim))
    if entry is None or options.kernels.invariant != InvariantConfig():
        return options
    source, values = entry
    return replace(options, kernels=replace(options.kernels, invariant=InvariantConfig(**values, source=source)))


def linear_key(shape: LinearShape) -> str:
    n, k, silu = shape
    return f"{n}x{k}{' silu' if silu else ''}"


def parse_linear_key(key: str) -> LinearShape:
    try:
        nk, _, silu = key.partition(" ")
        n, k = (int(x) for x in nk.split("x"))
    except ValueError:
        raise InvalidRequestError(f"a linear shape is 'NxK' or 'NxK silu', got {key!r}") from None
    if silu not in ("", "silu"):
        raise InvalidRequestError(f"a linear shape is 'NxK' or 'NxK silu', got {key!r}")
    return n, k, silu == "silu"


def _linear_shape(shape) -> LinearShape:
    if isinstance(shape, str):
        return parse_linear_key(shape)
    n, k, silu = shape
    return int(n), int(k), bool(silu)


def _linear_config(config) -> LinearConfig:
    config = tuple(config)
    if len(config) != 5 or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0
                                   for c in config):
        raise InvalidRequestError(f"a fused_linear configuration is 5 positive integers "
                                  f"(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), got {config!r}")
    return config


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
    # Those launches (read only with `deterministic`): the defaults, or a tuned choice
    # (`InvariantConfig.from_file` on a `bench invariant` result).
    invariant: InvariantConfig = field(default_factory=InvariantConfig)

    def __post_init__(self):
        for name in ("pdl", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.invariant, InvariantConfig):
            raise InvalidRequestError(f"invariant must be an InvariantConfig, got {self.invariant!r}")
        if isinstance(self.fused_linear_rows, bool) or not isinstance(self.fused_linear_rows, int) \
                or self.fused_linear_rows < 0:
            raise InvalidRequestError(
                f"fused_linear_rows must be an integer >= 0, got {self.fused_linear_rows!r}")


PREFILL_TOKENS_GPU = 8192
PREFILL_TOKENS_CPU = 1024


def prefill_budget(options: "EngineOptions", device_type: str) -> int:
    """The tokens a prefill step takes: `options.max_prefill_tokens`, else the default of the
    device type ("cuda", "cpu")."""
    if options.max_prefill_tokens is not None:
        return options.max_prefill_tokens
    return PREFILL_TOKENS_GPU if device_type == "cuda" else PREFILL_TOKENS_CPU


@dataclass(frozen=True)
class EngineOptions:
    block_size: int = 16
    num_blocks: int | None = None          # None: sized from kv_cache_bytes
    kv_cache_bytes: int | None = None      # None: 1 GiB on a CPU; on a GPU, from its free memory
    gpu_memory_fraction: float = 0.85      # of the GPU memory free after the weights, for the KV pool
    max_num_seqs: int = 128
    # Tokens a prefill step takes (`prefill_budget`); None: 8192 on a GPU, 1024 on a CPU. On a GPU a
    # step costs mostly the host's launches (~20 ms for SmolLM2 from 300 to 4,400 tokens, H100), so
    # fewer steps start a burst of requests sooner; on a CPU it costs its tokens, which streaming
    # requests wait for.
    max_prefill_tokens: int | None = None
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
            if value is None and name == "max_prefill_tokens":
                continue
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
