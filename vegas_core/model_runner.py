"""The model runner owns the tensors: the model, the KV pool and the attention backend. It turns
lists of (request, tokens, positions) into one flat batch, builds the attention metadata once per
step, and returns logits. It makes no scheduling or sampling decisions."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionMetadata, LogitCollector, ReferenceBackend, SeqAttention
from .block_manager import BlockAllocator
from .config import ModelConfig
from .kv_cache import KVPool
from .model import CausalLM


@dataclass
class BatchEntry:
    """One request's part of a forward pass: tokens at positions [start, start + len(tokens))."""
    seq_id: int
    tokens: list[int]
    start: int
    sparse: object = None                 # a SparseView for draft steps
    collect_rows: list[int] | None = None  # verification rows whose logits to collect
    logits: str = "none"                  # "none", "last" or "all" rows of this entry


class ModelRunner:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, num_blocks: int, block_size: int):
        self.config, self.device, self.dtype = config, device, dtype
        self.block_size = block_size
        model = CausalLM(config)
        model.load_weights(weights)
        self.model = model.to(device=device, dtype=dtype).eval()
        self.model.fuse()  # .to() replaced the parameters: rebuild the fused views on the device
        self.model.rope.inv_freq = self.model.rope.inv_freq.float()
        self.model.backend = ReferenceBackend(scale=config.head_dim ** -0.5)
        self.pool = KVPool(config, num_blocks, block_size, dtype, device)

    def forward(self, entries: list[BatchEntry], allocator: BlockAllocator,
                collector: LogitCollector | None = None) -> torch.Tensor:
        """Run one batched forward. Returns float32 logits for the requested rows, in entry order."""
        dev = self.device
        ids, pos, seq_lens, slots, rows, seqs = [], [], [], [], [], []
        offset = 0
        for e in entries:
            n = len(e.tokens)
            end = e.start + n
            table = torch.as_tensor(allocator.block_table(e.seq_id), dtype=torch.long)
            p = torch.arange(0, end, dtype=torch.long)
            key_slots = table[p // self.block_size] * self.block_size + p % self.block_size
            ids.extend(e.tokens)
            pos.append(p[e.start:])
            seq_lens.append(torch.full((n,), end, dtype=torch.long))
            slots.append(key_slots[e.start:])
            seqs.append(SeqAttention(q_start=offset, q_len=n, key_slots=key_slots.to(dev), sparse=e.sparse,
                                     collect_rows=e.collect_rows, collect_upto=e.start))
            if e.logits == "last":
                rows.append(offset + n - 1)
            elif e.logits == "all":
                rows.extend(range(offset, offset + n))
            offset += n
        meta = AttentionMetadata(slot_mapping=torch.cat(slots).to(dev), seqs=seqs, collector=collector)
        return self.model(torch.tensor(ids, dtype=torch.long, device=dev), torch.cat(pos).to(dev),
                          self.pool, meta, torch.tensor(rows, dtype=torch.long, device=dev),
                          torch.cat(seq_lens).to(dev))

    def slots(self, allocator: BlockAllocator, seq_id: int, start: int, end: int) -> torch.Tensor:
        """Pool slots of positions [start, end) of one sequence."""
        table = torch.as_tensor(allocator.block_table(seq_id), dtype=torch.long)
        p = torch.arange(start, end, dtype=torch.long)
        return (table[p // self.block_size] * self.block_size + p % self.block_size).to(self.device)

    def keys(self, layer: int, allocator: BlockAllocator, seq_id: int, start: int, end: int) -> torch.Tensor:
        """Cached (rotated) keys of positions [start, end) of one sequence: [n, KVH, d]."""
        return self.pool.flat(layer)[0][self.slots(allocator, seq_id, start, end)]

    def values(self, layer: int, allocator: BlockAllocator, seq_id: int, start: int, end: int) -> torch.Tensor:
        return self.pool.flat(layer)[1][self.slots(allocator, seq_id, start, end)]
