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


def poison_before(k_cache, v_cache, tables, starts) -> None:
    """NaN in every key and value at positions [0, starts[b]) of request b (in place): a kernel
    that reads any of them gets NaN in its output (a masked score still multiplies 0 by NaN)."""
    block_size = k_cache.shape[1]
    for b, start in enumerate(starts):
        pos = torch.arange(int(start))
        pages = tables[b].long().cpu()[pos // block_size]
        k_cache[pages, pos % block_size] = float("nan")
        v_cache[pages, pos % block_size] = float("nan")
