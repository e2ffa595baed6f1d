"""Page allocator for the paged KV cache: plain Python, no tensors, so it is unit-tested alone.

Contract: the pool has `num_blocks` pages of `block_size` token slots. Each sequence owns an ordered
block table; `ensure(seq, n)` makes it cover `n` slots (allocating pages), `truncate(seq, n)` gives
back pages past `n` slots (speculation drops rejected tokens), `free(seq)` gives back all of them.
A page is owned by at most one sequence at a time. Running out is reported, never half-done:
`ensure` either allocates everything it needs or nothing. `version(seq)` changes whenever the
sequence's table does, so a caller may keep a copy of the table (e.g. on a GPU) until it changes.
"""
from __future__ import annotations


class OutOfBlocks(Exception):
    """Raised by `ensure` when the free list cannot cover the request; nothing was allocated."""


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Hand out low page numbers first so a fresh pool fills from the start (easier to read in traces).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}
        self._versions: dict[int, int] = {}
        self._clock = 0

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, seq_id: int) -> list[int]:
        return self._tables.get(seq_id, [])

    def version(self, seq_id: int) -> int:
        """A number that differs from every earlier one of this sequence once its table changed."""
        return self._versions.get(seq_id, 0)

    def _touch(self, seq_id: int) -> None:
        self._clock += 1
        self._versions[seq_id] = self._clock

    def capacity(self, seq_id: int) -> int:
        return len(self.block_table(seq_id)) * self.block_size

    def can_ensure(self, seq_id: int, num_tokens: int) -> bool:
        extra = self.blocks_needed(num_tokens) - len(self.block_table(seq_id))
        return extra <= len(self._free)

    def adjacency(self, seq_ids) -> float | None:
        """Of the given sequences' consecutive table entries, the fraction whose pages are also
        consecutive in the pool (1.0: every table one run; None: no pair to judge). A locality
        measure: attention kernels read a request's pages in table order."""
        pairs = adjacent = 0
        for seq_id in seq_ids:
            table = self._tables.get(seq_id, [])
            pairs += max(len(table) - 1, 0)
            adjacent += sum(b == a + 1 for a, b in zip(table, table[1:]))
        return adjacent / pairs if pairs else None

    def owners(self) -> dict[int, int]:
        """page -> owning sequence (for checks: a page appears at most once)."""
        out: dict[int, int] = {}
        for seq_id, table in self._tables.items():
            for page in table:
                if page in out:
                    raise AssertionError(f"page {page} owned by {out[page]} and {seq_id}")
                out[page] = seq_id
        return out

    # -- changes -------------------------------------------------------------------------------
    def ensure(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow `seq_id`'s table to cover `num_tokens` slots; returns the table."""
        table = self._tables.setdefault(seq_id, [])
        extra = self.blocks_needed(num_tokens) - len(table)
        if extra > len(self._free):
            if not table:
                del self._tables[seq_id]
            raise OutOfBlocks(f"sequence {seq_id} needs {extra} more pages, {len(self._free)} free")
        for _ in range(max(extra, 0)):
            table.append(self._free.pop())
        if extra > 0:
            self._touch(seq_id)
        return table

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the pages needed for the first `num_tokens` slots."""
        table = self._tables.get(seq_id)
        if table is None:
            return
        keep = self.blocks_needed(num_tokens)
        if len(table) > keep:
            self._touch(seq_id)
        while len(table) > keep:
            self._free.append(table.pop())

    def free(self, seq_id: int) -> None:
        self._touch(seq_id)
        for page in reversed(self._tables.pop(seq_id, [])):
            self._free.append(page)
