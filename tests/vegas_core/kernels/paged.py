"""A shared test helper: block tables over a shuffled page pool, as the kernels' tests build them."""
import torch


def shuffled_tables(blocks_per: list[int], spare: int, generator: torch.Generator):
    """Request i gets `blocks_per[i]` distinct pages in shuffled (non-contiguous) order; `spare`
    further pages belong to nobody. Tables are int32 [B, max(blocks_per) + 1], padded with page 0
    (never read). Returns (tables, num_blocks)."""
    num_blocks = sum(blocks_per) + spare
    perm = torch.randperm(num_blocks, generator=generator)
    tables = torch.zeros(len(blocks_per), max(blocks_per) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per):
        tables[i, :n] = perm[used: used + n]
        used += n
    return tables, num_blocks
