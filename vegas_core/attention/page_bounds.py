"""Quest's page metadata on the kernel path: per layer, the element-wise min and max key of every
KV-pool block ([num_blocks, KVH, d] each, beside the pool), so a Quest page is a pool block.

A block's bounds are written once all its entries are verified (`update`), which is the only time
they can change for good: drafts past the verified prefix are truncated before they ever reach a
complete verified page. A preempted request's blocks are recomputed (its policy cache is reset)."""
from __future__ import annotations

import torch

from kernels.select import update_page_bounds

from ..kv_cache import KVPool


class PageBounds:
    def __init__(self, pool: KVPool):
        self.pool = pool
        self.kmin: list[torch.Tensor] | None = None
        self.kmax: list[torch.Tensor] | None = None

    def _allocate(self) -> None:
        # Allocated on first use: 2/block_size of the pool's size, paid only when Quest runs.
        shape = (self.pool.num_blocks, *self.pool.k[0].shape[2:])
        like = self.pool.k[0]
        self.kmin = [torch.empty(shape, dtype=like.dtype, device=like.device) for _ in self.pool.k]
        self.kmax = [torch.empty(shape, dtype=like.dtype, device=like.device) for _ in self.pool.k]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kmin is None:
            self._allocate()
        return self.kmin[layer], self.kmax[layer]

    def update(self, blocks: list[int]) -> None:
        """(Re)compute the bounds of these physical blocks, whose entries are all final."""
        if not blocks:
            return
        if self.kmin is None:
            self._allocate()
        idx = torch.tensor(blocks, dtype=torch.long, device=self.pool.k[0].device)
        for layer, k in enumerate(self.pool.k):
            update_page_bounds(k, self.kmin[layer], self.kmax[layer], idx)
