"""The model runner owns the tensors: the model, the KV pool and the attention backend. It turns
lists of (request, tokens, positions) into one flat batch, builds the attention metadata once per
step, and returns logits. It makes no scheduling or sampling decisions."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .architectures import build_causal_lm
from .attention import AttentionMetadata, DecodeBatch, LogitCollector, ReferenceBackend, SeqAttention
from .block_manager import BlockAllocator
from .config import ModelConfig
from .errors import InvalidRequestError
from .kv_cache import KVPool, slot_index
from .model import CausalLM
from .options import ATTENTION_CHOICES, EngineOptions, KernelOptions


@dataclass
class BatchEntry:
    """One request's part of a forward pass: tokens at positions [start, start + len(tokens))."""
    seq_id: int
    tokens: list[int]
    start: int
    sparse: object = None                 # a SparseView for draft steps
    collect_rows: list[int] | None = None  # verification rows whose logits to collect
    logits: str = "none"                  # "none", "last" or "all" rows of this entry
    device_drafts: int | None = None      # tokens[1:] are placeholders: the drafts are column
                                          # `device_drafts` of the last chain, still on the GPU


def resolve_attention(choice: str, device: torch.device) -> str:
    """"auto" takes the Triton kernels on a GPU and the PyTorch reference on the CPU; "reference"
    forces the reference anywhere (debugging); "triton" forces the kernels, which on a CPU only
    runs under Triton's interpreter (TRITON_INTERPRET=1, how the tests compare the two paths)."""
    if choice not in ATTENTION_CHOICES:
        raise InvalidRequestError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {choice!r}")
    if choice == "auto":
        return "triton" if device.type == "cuda" and _triton_available() else "reference"
    if choice == "triton":
        if not _triton_available():
            raise InvalidRequestError("attention='triton' needs the triton package (pip install triton)")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise InvalidRequestError(
                "attention='triton' on a CPU runs only under Triton's interpreter: set TRITON_INTERPRET=1 "
                "before starting (slow; meant for tests), or use attention='reference'")
    return choice


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def build_model(config: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype, backend, kernels: KernelOptions | None) -> CausalLM:
    """The model on `device` in `dtype` (rotary frequencies stay float32), attending through
    `backend`; `kernels`: the GPU path's fused kernels, None for plain PyTorch ops."""
    model = build_causal_lm(config, backend, kernels)
    model.load_weights(weights)
    model = model.to(device=device, dtype=dtype).eval()
    model.fuse()  # .to() replaced the parameters: rebuild the fused views on the device
    model.rope.inv_freq = model.rope.inv_freq.float()
    return model


class ModelRunner:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, num_blocks: int, options: EngineOptions | None = None):
        options = options or EngineOptions()
        self.config, self.device, self.dtype = config, device, dtype
        self.options = options
        self.block_size = options.block_size
        self.pool = KVPool(config, num_blocks, self.block_size, dtype, device)
        self.attention = resolve_attention(options.attention, torch.device(device))
        self.page_bounds = None
        if self.attention == "triton":
            from .attention.kernel_backend import KernelBackend
            from .attention.page_bounds import PageBounds
            self.page_bounds = PageBounds(self.pool)
            backend = KernelBackend(config.attention_scale, self.page_bounds, options.kernels,
                                    windows=config.layer_windows)
            kernels = options.kernels
        else:
            backend, kernels = ReferenceBackend(scale=config.attention_scale, windows=config.layer_windows), None
        self.model = build_model(config, weights, device, dtype, backend, kernels)
        self.graphs = self._graph_runner(options.cuda_graphs, options.max_num_seqs)

    def _graph_runner(self, choice: str, max_batch: int):
        """CUDA graphs for decode-time forwards: "auto" captures them on a GPU with the kernels,
        "off" runs every forward eagerly (debugging), "static" runs the graphs' static buffers
        without capturing (how CPU tests check that path under Triton's interpreter)."""
        if choice == "off" or not self.kernels or (choice == "auto" and self.device.type != "cuda"):
            return None
        from .graphs import GraphRunner
        return GraphRunner(self, max_batch, capture=choice == "auto")

    @property
    def kernels(self) -> bool:
        return self.attention == "triton"

    def forward(self, entries: list[BatchEntry], allocator: BlockAllocator,
                collector: LogitCollector | None = None, graph: bool = False) -> torch.Tensor:
        """Run one batched forward. Returns float32 logits for the requested rows, in entry order.
        `graph`: a decode-time forward (decode, draft, verification) that a CUDA graph may run;
        its logits are then valid until the next forward."""
        if graph and self.graphs is not None:
            logits = self.graphs.run(entries, allocator, collector)
            if logits is not None:
                return logits
        if any(e.device_drafts is not None for e in entries):
            entries = self.graphs.with_host_drafts(entries)   # this forward needs them on the host
        dev, bs = self.device, self.block_size
        ends = [e.start + len(e.tokens) for e in entries]
        # Every request's pool slots by position, padded to the longest: built once, on the device,
        # and shared by all layers (per-request views of it are the key slots).
        nblk = -(-max(ends) // bs)
        rows = []
        for e in entries:   # padded on the host, one tensor for the batch (not one per request)
            t = allocator.block_table(e.seq_id)[:nblk]
            rows.append(t + [0] * (nblk - len(t)))
        tables = torch.tensor(rows, dtype=torch.long)
        pos = torch.arange(max(ends), device=dev)
        tables_dev = tables.to(dev)
        all_slots = slot_index(tables_dev, pos, bs)                            # [B, Lmax]
        ids, row_of, tok_pos, seq_lens, rows, seqs, batched = [], [], [], [], [], [], []
        offset = 0
        for i, (e, end) in enumerate(zip(entries, ends)):
            n = len(e.tokens)
            ids.extend(e.tokens)
            row_of.extend([i] * n)
            tok_pos.extend(range(e.start, end))
            seq_lens.extend([end] * n)
            seqs.append(SeqAttention(q_start=offset, q_len=n, key_slots=all_slots[i, :end], sparse=e.sparse,
                                     collect_rows=e.collect_rows, collect_upto=e.start))
            if n == 1 and e.sparse is None and e.collect_rows is None:
                batched.append(i)
            if e.logits == "last":
                rows.append(offset + n - 1)
            elif e.logits == "all":
                rows.extend(range(offset, offset + n))
            offset += n
        positions = torch.tensor(tok_pos, dtype=torch.long).to(dev)
        slot_mapping = all_slots[torch.tensor(row_of, dtype=torch.long).to(dev), positions]
        dense = None
        if batched and not self.kernels:
            idx = torch.tensor(batched, dtype=torch.long)
            ends_t = torch.tensor(ends, dtype=torch.long)[idx].to(dev)
            dense = DecodeBatch(seq_indices=set(batched), q_rows=torch.tensor([seqs[i].q_start for i in batched]).to(dev),
                                slots=all_slots[idx.to(dev)], valid=pos[None, :] < ends_t[:, None])
        meta = AttentionMetadata(slot_mapping=slot_mapping, seqs=seqs, collector=collector, decode_batch=dense,
                                 block_tables=tables_dev, context_lens=ends)
        return self.model(torch.tensor(ids, dtype=torch.long).to(dev), positions, self.pool, meta,
                          torch.tensor(rows, dtype=torch.long).to(dev), torch.tensor(seq_lens).to(dev))

    def chain(self, entries: list[BatchEntry], allocator: BlockAllocator, steps: int,
              limits: list[int], to_host: bool = True, first=None, sampling=None):
        """Tokens [steps, len(entries)] of `steps` one-row forwards chained on the GPU
        (`GraphRunner.run_chain`; numpy, or with `to_host=False` a device view valid until the next
        chain; `first`: device tokens and positions to start from; `sampling`: (params, stream
        keys) to sample instead of taking the argmax), or None when CUDA graphs cannot run them
        (the caller then steps one forward at a time)."""
        if self.graphs is None:
            return None
        return self.graphs.run_chain(entries, allocator, steps, limits, to_host, first, sampling)

    def slots(self, allocator: BlockAllocator, seq_id: int, start: int, end: int) -> torch.Tensor:
        """Pool slots of positions [start, end) of one sequence."""
        table = torch.as_tensor(allocator.block_table(seq_id), dtype=torch.long)
        return slot_index(table, torch.arange(start, end), self.block_size).to(self.device)

    def keys(self, layer: int, allocator: BlockAllocator, seq_id: int, start: int, end: int) -> torch.Tensor:
        """Cached (rotated) keys of positions [start, end) of one sequence: [n, KVH, d]."""
        return self.pool.flat(layer)[0][self.slots(allocator, seq_id, start, end)]

    def values(self, layer: int, allocator: BlockAllocator, seq_id: int, start: int, end: int) -> torch.Tensor:
        return self.pool.flat(layer)[1][self.slots(allocator, seq_id, start, end)]
