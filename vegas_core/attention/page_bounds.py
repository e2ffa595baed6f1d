"""Quest's page metadata on the kernel path: per layer, the element-wise min and max key of every
KV-pool block ([num_blocks, KVH, d] each, beside the pool), so a Quest page is a pool block.

A block's bounds are written once all its entries are verified (`update`), which is the only time
they can change for good: drafts past the verified prefix are truncated before they ever reach a
complete verified page. A preempted request's blocks are recomputed (its policy cache is reset)."""
from __future__ import annotations

import torch

from vegas_core.kernels.select import update_page_bounds

from ..kv_cache import KVPool
from ..transfer import to_device


class PageBounds:
    def __init__(self, pool: KVPool):
        self.pool = pool
        self.kmin: torch.Tensor | None = None     # [layers, blocks, KVH, d], like the pool's keys
        self.kmax: torch.Tensor | None = None

    def _allocate(self) -> None:
        # Allocated on first use: 2/block_size of the pool's size, paid only when Quest runs.
        keys = self.pool.kv[0]
        shape = (keys.shape[0], keys.shape[1], *keys.shape[3:])
        self.kmin = torch.empty(shape, dtype=keys.dtype, device=keys.device)
        self.kmax = torch.empty(shape, dtype=keys.dtype, device=keys.device)

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
        idx = to_device(blocks, torch.long, self.pool.kv.device)
        update_page_bounds(self.pool.kv[0], self.kmin, self.kmax, idx)   # every layer at once
