"""The paged KV pool: per layer, K and V tensors of shape [num_blocks, block_size, kv_heads, head_dim].

The layout is vLLM's flash layout, which the Triton kernels read too. Token slot `s` of the flat
view [num_blocks * block_size, kv_heads, head_dim] is page `s // block_size`, offset `s % block_size`.

All layers live in one tensor `kv` [2, layers, num_blocks + 1, block_size, kv_heads, head_dim]
(`k[layer]`, `v[layer]` are views of it), so whole-model operations (Quest's page bounds, copying
a prefix) are one call, not one per layer. The extra block past `num_blocks` belongs to no
sequence: a CUDA graph's padding rows write their K/V to `scratch_slot` in it.

Sliding-window layers (Gemma 3's local layers) keep every position too, not just their window:
one block table per request serves every layer (one slot mapping a step, one copy on fork, one
truncation on rejection, one table on the kernel path), and a window-only store would need a
second pool with its own per-request ring (at least window + the largest forward's rows, since a
forward writes all its rows before attending) and its own slots in the metadata, an engine-core
change. What it costs: Gemma-3-270M keeps 18,432 bf16 bytes a token where the window-only store
would average about 3,320 at 32K (5.5x less: a 32K request 604 MB instead of ~109 MB). What it
does not cost: reads. Attention gathers only the window's keys of a sliding layer, and the e2e
bandwidth bound counts those (`ModelConfig.kv_bytes_read`).
"""
from __future__ import annotations

import torch

from .config import ModelConfig
from .errors import InvalidRequestError


class KVPool:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (2, config.num_layers, num_blocks + 1, block_size, config.num_kv_heads, config.head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.k = list(self.kv[0].unbind(0))
        self.v = list(self.kv[1].unbind(0))
        self.scratch_slot = num_blocks * block_size

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[slots, kv_heads, head_dim] views of one layer's K and V."""
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kf, vf = self.flat(layer)
        kf.index_copy_(0, slots, k.to(kf.dtype))
        vf.index_copy_(0, slots, v.to(vf.dtype))

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        return block_size * config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every layer's K and V at flat slots `dst` = those at `src` (one gather, one scatter)."""
        flat = self.kv.view(2, self.kv.shape[1], -1, *self.kv.shape[4:])
        flat[:, :, dst] = flat[:, :, src]


def slot_index(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat pool slots of token positions through block tables: tables [..., max_blocks] (one table,
    or a padded batch of them) and positions [L] -> [..., L]."""
    return tables[..., positions // block_size] * block_size + positions % block_size


ACTIVATION_RESERVE = 2 << 30   # GPU memory left for activations, logits and collected verification logits


def kv_pool_bytes(device: torch.device, opts, weight_bytes: int,
                  free_bytes: int | None = None) -> int:
    """The KV pool's size: what the options ask for, else 1 GiB on a CPU, else on a GPU
    `gpu_memory_fraction` (of the `EngineOptions` `opts`) of the memory free once the weights
    (`weight_bytes`) are there, less a reserve for
    activations (`free_bytes` defaults to what the device reports now, before the weights load)."""
    if opts.kv_cache_bytes is not None:
        return opts.kv_cache_bytes
    if device.type != "cuda":
        return 1 << 30
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    size = int((free_bytes - weight_bytes) * opts.gpu_memory_fraction) - ACTIVATION_RESERVE
    if size <= 0:
        raise InvalidRequestError(
            f"no GPU memory left for a KV pool: {free_bytes / 2**30:.1f} GiB free, the weights take "
            f"{weight_bytes / 2**30:.1f} GiB; pass kv_cache_bytes or num_blocks explicitly")
    return size


def weights_bytes(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(w.numel() for w in weights.values()) * itemsize
