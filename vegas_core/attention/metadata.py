"""Per-step attention metadata (built once, read by every layer)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class SparseView(Protocol):
    """What a draft step of one request attends to in each layer: the positions `positions(layer, q)`
    (sorted, all < `base`, shape [G, k] with G = 1 for one set per layer or G = kv_heads for one set per
    KV head) plus every position >= `base` (written since the last verification)."""
    base: int

    def positions(self, layer: int, q: torch.Tensor) -> torch.Tensor: ...

    def record_recall(self, layer: int, value: float) -> None: ...

    @property
    def wants_recall(self) -> bool: ...


@dataclass
class SeqAttention:
    q_start: int                   # first row of this request in the flat token batch
    q_len: int                     # query rows (1 = decode/draft, gamma + 1 = verify, many = prefill)
    key_slots: torch.Tensor        # [ctx_len] pool slots of every key the last query may see, by position
    sparse: SparseView | None = None
    collect_rows: list[int] | None = None  # rows whose pre-softmax logits over keys [0, collect_upto) to keep
    collect_upto: int = 0

    @property
    def ctx_len(self) -> int:
        return int(self.key_slots.shape[0])


@dataclass
class LogitCollector:
    """Collected verification logits, per request index and layer: `logits[i][layer]` is
    [rows, heads, collect_upto] (scaled QK products, i.e. the softmax inputs) and `lse[i][layer]` is
    [rows, heads], the log-sum-exp over each row's whole visible context (so
    exp(logit - lse) is the true full-attention weight)."""
    logits: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    lse: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    # The kernel path keeps one tensor for every layer and the whole batch instead:
    # `layer_logits` bf16 [L, R, H, W] over R collected rows (valid below each request's context;
    # W >= the longest), `layer_lse` float32 [L, T, H] over the verification's T rows,
    # `row_index` int64 [R] on the device (row r of the logits is row row_index[r] of the lse),
    # and `rows_of[i]`: which of the R rows belong to request index i (in its row order).
    # `layers`: the model layers those L rows are (None: every layer; a sliding-window layer
    # collects nothing, so a hybrid model's buffers hold its global layers only).
    layer_logits: torch.Tensor | None = None
    layer_lse: torch.Tensor | None = None
    row_index: torch.Tensor | None = None
    rows_of: dict[int, list[int]] = field(default_factory=dict)
    layers: tuple[int, ...] | None = None

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [L, R, H, W], lse [L, R, H]) of the collected rows, for the batched selection."""
        return self.layer_logits, self.layer_lse.index_select(1, self.row_index)

    def put(self, seq_index: int, layer: int, logits: torch.Tensor, lse: torch.Tensor) -> None:
        self.logits.setdefault(seq_index, {})[layer] = logits
        self.lse.setdefault(seq_index, {})[layer] = lse


@dataclass
class DecodeBatch:
    """The requests of a step that decode one token with plain full attention (vanilla decode, the
    first step of a speculative request): attended together in one padded batch, not one by one."""
    seq_indices: set[int]          # indices into AttentionMetadata.seqs
    q_rows: torch.Tensor           # [B] their query row in the flat token batch
    slots: torch.Tensor            # [B, Lmax] pool slots by position (padding past each length)
    valid: torch.Tensor            # [B, Lmax] True where the position exists


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor     # [T] pool slot each new token's K/V is written to
    seqs: list[SeqAttention]
    collector: LogitCollector | None = None
    decode_batch: DecodeBatch | None = None
    block_tables: torch.Tensor | None = None   # [B, max_blocks] long on the device, per request
    context_lens: list[int] | None = None      # keys each request's last row sees
    plan: object = None                        # backend-private, built at the first layer
