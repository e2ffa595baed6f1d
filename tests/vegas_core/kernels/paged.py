"""A shared test helper: block tables over a shuffled page pool, as the kernels' tests build them
(`shuffled_tables` lives beside the invariance checks that `bench invariant` runs on the GPU)."""
import torch

from vegas_core.kernels.invariance import shuffled_tables  # noqa: F401 - re-exported for the tests


def poison_before(k_cache, v_cache, tables, starts) -> None:
    """NaN in every key and value at positions [0, starts[b]) of request b (in place): a kernel
    that reads any of them gets NaN in its output (a masked score still multiplies 0 by NaN)."""
    block_size = k_cache.shape[1]
    for b, start in enumerate(starts):
        pos = torch.arange(int(start))
        pages = tables[b].long().cpu()[pos // block_size]
        k_cache[pages, pos % block_size] = float("nan")
        v_cache[pages, pos % block_size] = float("nan")
