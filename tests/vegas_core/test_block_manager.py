import pytest

from vegas_core.block_manager import BlockAllocator, OutOfBlocks


def test_ensure_allocates_whole_pages_and_is_idempotent():
    a = BlockAllocator(num_blocks=8, block_size=4)
    assert a.ensure(1, 5) == [0, 1]
    assert a.ensure(1, 8) == [0, 1]          # still covered
    assert a.ensure(1, 9) == [0, 1, 2]
    assert a.capacity(1) == 12 and a.num_free == 5


def test_free_returns_every_page():
    a = BlockAllocator(8, 4)
    a.ensure(1, 10)
    a.ensure(2, 7)
    a.free(1)
    assert a.num_free == 6 and a.block_table(1) == []
    a.free(2)
    assert a.num_free == 8
    a.free(3)  # unknown sequence: nothing happens
    assert a.num_free == 8


def test_truncate_keeps_only_needed_pages():
    a = BlockAllocator(8, 4)
    a.ensure(1, 16)
    a.truncate(1, 9)
    assert a.block_table(1) == [0, 1, 2] and a.num_free == 5
    a.truncate(1, 8)
    assert a.block_table(1) == [0, 1]
    a.truncate(1, 0)
    assert a.block_table(1) == [] and a.num_free == 8


def test_exhaustion_allocates_nothing():
    a = BlockAllocator(4, 4)
    a.ensure(1, 12)
    assert not a.can_ensure(2, 8)
    with pytest.raises(OutOfBlocks):
        a.ensure(2, 8)
    assert a.block_table(2) == [] and a.num_free == 1
    with pytest.raises(OutOfBlocks):
        a.ensure(1, 20)                       # growing an existing table: also all or nothing
    assert a.block_table(1) == [0, 1, 2]


def test_no_page_owned_twice_under_churn():
    import random
    rng = random.Random(0)
    a = BlockAllocator(64, 16)
    lengths, seen = {}, {}
    for _ in range(2000):
        seq = rng.randrange(10)
        op = rng.random()
        if op < 0.5:
            n = lengths.get(seq, 0) + rng.randrange(1, 40)
            if a.can_ensure(seq, n):
                a.ensure(seq, n)
                lengths[seq] = n
        elif op < 0.8 and seq in lengths:
            lengths[seq] = rng.randrange(0, lengths[seq] + 1)
            a.truncate(seq, lengths[seq])
        else:
            a.free(seq)
            lengths.pop(seq, None)
        owners = a.owners()                   # raises if a page is in two tables
        assert len(owners) + a.num_free == 64
        for s, n in lengths.items():
            assert a.capacity(s) >= n
        # A table seen before under the same version must be the same table (copies stay valid).
        key = (seq, a.version(seq))
        assert seen.setdefault(key, list(a.block_table(seq))) == a.block_table(seq)


def test_adjacency_counts_consecutive_pages_in_table_order():
    alloc = BlockAllocator(16, 4)
    assert alloc.adjacency([0]) is None                    # nothing to judge
    alloc.ensure(0, 12)                                    # pages 0, 1, 2: one run
    assert alloc.adjacency([0]) == 1.0
    for step in range(2):                                  # two sequences growing in turn
        alloc.ensure(1, 4 * (step + 1))
        alloc.ensure(2, 4 * (step + 1))
    assert alloc.block_table(1) == [3, 5] and alloc.block_table(2) == [4, 6]
    assert alloc.adjacency([1, 2]) == 0.0
    assert alloc.adjacency([0, 1, 2]) == 2 / 4
