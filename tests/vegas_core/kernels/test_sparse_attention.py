"""`sparse_attention` (Triton, run by the interpreter on the CPU) against
`sparse_attention_reference` (plain PyTorch), and the reference against the engine's own maths
(`ReferenceBackend._sparse`, dense attention).

Tolerances: fp32 inputs; `out` must match the reference with atol = rtol = 1e-4 (split or not, any
block_n); the reference must match the engine's maths with atol = rtol = 1e-5. Garbage in the padding
of `indices` must leave the kernel's output bit-identical. bf16 inputs (GPU only: Triton 3.6's
interpreter multiplies bf16 bit patterns as integers in tl.dot) must match the reference, which
computes in float32 from the same bf16 inputs, with atol = rtol = 2e-2. The packed path (one program
for every KV head of a request) matches the reference as tightly, and compiled on a GPU the
per-KV-head programs within atol = rtol = 1e-2 in bf16 (one bf16 step) and 1e-5 in float32: not bit
for bit (kernels/sparse_attention.py, `_sparse_tile_packed`).
"""
import math
import os

import pytest
import torch

from vegas_core.kernels.sparse_attention import packs_kv_heads, sparse_attention, sparse_attention_reference
from tests.vegas_core.kernels.paged import poison_before, shuffled_tables
from vegas_core.attention.metadata import SeqAttention
from vegas_core.attention.reference import ReferenceBackend, dense_scores, weighted_values
from vegas_core.spec.views import FixedSelection

# CPU under the interpreter (CI); compiled on a GPU when run with TRITON_INTERPRET=0 there.
DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"

TOL = dict(atol=1e-4, rtol=1e-4)
GARBAGE = (2**31 - 1, -(2**31), 2**30, -7)     # never valid positions: reading one would go astray


def make_case(ctx_lens, tail_lens, counts, heads, kv_heads, head_dim, per_head=False,
              block_size=16, max_k=None, seed=0, pad="garbage", dtype=torch.float32):
    """Random paged pool with shuffled (non-contiguous) block tables padded with page 0, and per
    request a selection of `counts[b]` distinct shuffled positions below `tail_start = ctx - tail`
    (one set, or one per KV head when `per_head`). Padding of `indices` past each count holds
    `pad`: "garbage" (out-of-range values) or "valid" (positions of the request that are NOT
    selected, so reading them would change the result). Returns the argument tuple on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    tables, num_blocks = shuffled_tables([math.ceil(c / block_size) for c in ctx_lens], 3, g)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(len(ctx_lens), heads, head_dim, generator=g).to(dtype)
    groups = kv_heads if per_head else 1
    max_k = max_k or max(max(counts), 1)
    indices = torch.zeros(len(ctx_lens), groups, max_k, dtype=torch.int32)
    for b, (ctx, tail, n) in enumerate(zip(ctx_lens, tail_lens, counts)):
        base = ctx - tail
        assert 1 <= tail <= ctx and n <= min(base, max_k)
        for grp in range(groups):
            order = torch.randperm(base, generator=g)
            indices[b, grp, :n] = order[:n]
            if pad == "garbage":
                fill = torch.tensor(GARBAGE, dtype=torch.int32).repeat(max_k)[: max_k - n]
            else:                                                     # unselected real positions
                rest = order[n:] if base > n else torch.arange(base, ctx)
                fill = rest.repeat(max_k)[: max_k - n]
            indices[b, grp, n:] = fill
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    counts_t = torch.tensor(counts, dtype=torch.int32)
    tail_start = torch.tensor([c - t for c, t in zip(ctx_lens, tail_lens)], dtype=torch.int32)
    tensors = (q, k_cache, v_cache, tables, ctx, indices, counts_t, tail_start)
    return (*(t.to(DEVICE) for t in tensors), 1.0 / math.sqrt(head_dim))


CASES = [  # (ctx_lens, tail_lens, counts, heads, kv_heads, head_dim, per_head)
    ([37, 70, 5], [3, 9, 1], [20, 0, 4], 4, 4, 16, False),      # GQA 1, one shared set, ragged
    ([50, 23], [5, 2], [33, 21], 9, 3, 32, True),                # GQA 3, per-KV-head sets, full sel.
    ([45, 64, 19], [4, 1, 6], [9, 63, 0], 8, 1, 16, False),      # GQA 8, page multiples, empty sel.
    ([41, 30], [7, 3], [34, 5], 16, 2, 16, True),                # GQA 8, per-KV-head sets
]


@pytest.mark.parametrize("ctx_lens,tail_lens,counts,heads,kv_heads,head_dim,per_head", CASES)
def test_matches_reference(ctx_lens, tail_lens, counts, heads, kv_heads, head_dim, per_head):
    args = make_case(ctx_lens, tail_lens, counts, heads, kv_heads, head_dim, per_head=per_head)
    torch.testing.assert_close(sparse_attention(*args), sparse_attention_reference(*args), **TOL)


def test_empty_selection_is_tail_only():
    """Count 0 everywhere: only the tail is attended (a one-key tail gives that key's value)."""
    args = make_case([20, 33], [1, 6], [0, 0], 6, 2, 16, per_head=True, max_k=8)
    q, k_cache, v_cache, tables, ctx, indices, counts, tail_start, scale = args
    out = sparse_attention(*args)
    torch.testing.assert_close(out, sparse_attention_reference(*args), **TOL)
    pos = 19                                                           # request 0: only its query
    page, off = int(tables[0, pos // 16]), pos % 16
    want = v_cache[page, off].repeat_interleave(3, dim=0)             # [H, d]
    torch.testing.assert_close(out[0], want, **TOL)


def test_full_selection_equals_dense_attention():
    """Every prefix position selected (count == K == tail_start): dense attention over the context."""
    ctx_lens, tails = [29, 40], [4, 8]
    args = make_case(ctx_lens, tails, [25, 32], 6, 3, 16, per_head=True, max_k=32, seed=5)
    q, k_cache, v_cache, tables, ctx, indices, counts, tail_start, scale = args
    out = sparse_attention(*args)
    torch.testing.assert_close(out, sparse_attention_reference(*args), **TOL)
    kf, vf = k_cache.reshape(-1, 3, 16), v_cache.reshape(-1, 3, 16)
    for b, c in enumerate(ctx_lens):
        pos = torch.arange(c, device=q.device)
        slots = tables[b].long()[pos // 16] * 16 + pos % 16
        p = torch.softmax(dense_scores(q[b:b + 1], kf[slots], scale), dim=-1)
        torch.testing.assert_close(out[b:b + 1], weighted_values(p, vf[slots]), **TOL)


@pytest.mark.parametrize("per_head", [False, True])
def test_padding_is_never_read(per_head):
    """Padding past each count holds out-of-range garbage, or real but unselected positions (which
    would change the result if read): output bit-identical, and equal to the reference."""
    shape = ([40, 26], [3, 5], [7, 0], 6, 2, 16)
    garbage = make_case(*shape, per_head=per_head, max_k=24, seed=2, pad="garbage")
    real = make_case(*shape, per_head=per_head, max_k=24, seed=2, pad="valid")
    assert not torch.equal(garbage[5], real[5])
    out = sparse_attention(*garbage)
    assert torch.equal(out, sparse_attention(*real))
    torch.testing.assert_close(out, sparse_attention_reference(*garbage), **TOL)
    torch.testing.assert_close(sparse_attention_reference(*real),
                               sparse_attention_reference(*garbage), atol=0, rtol=0)


def test_block_n_and_splits_independent():
    """The entry tile (block_n) need not equal the pool's page size (8 here), and splitting the key
    list over several programs with a merge gives the same result (also with empty splits)."""
    args = make_case([61, 22, 9], [5, 3, 9], [50, 11, 0], 6, 2, 16, per_head=True,
                     block_size=8, seed=3)
    ref = sparse_attention_reference(*args)
    for block_n, splits in ((16, 1), (64, 1), (16, 3), (32, 4)):
        out = sparse_attention(*args, block_n=block_n, num_splits=splits)
        torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("heads,kv_heads,packed", [(6, 3, True), (6, 3, False), (4, 1, False)])
def test_sliding_window_attends_the_querys_window_only(heads, kv_heads, packed):
    """A sliding-window layer's draft step: no selection (None), the last `window` positions of
    each request (all of a shorter context), read from the device's context lengths. The keys
    before the window are NaN, so reading any would show; split and not; and it equals a
    one-row verification with the same window (the target's own attention)."""
    from vegas_core.kernels.verify_attention import verify_attention_reference
    window, ctx_lens = 12, [40, 9, 27]
    q, k_cache, v_cache, tables, ctx, _, _, _, scale = make_case(
        ctx_lens, [1, 1, 1], [0, 0, 0], heads, kv_heads, 16, seed=8)
    loc = torch.arange(len(ctx_lens) + 1, dtype=torch.int32, device=q.device)
    want, _, _ = verify_attention_reference(q, k_cache, v_cache, tables, ctx, loc, scale,
                                            window=window)
    args = (q, k_cache, v_cache, tables, ctx, None, None, None, scale)
    torch.testing.assert_close(sparse_attention_reference(*args, window=window), want,
                               atol=1e-5, rtol=1e-5)
    poison_before(k_cache, v_cache, tables, [max(0, c - window) for c in ctx_lens])
    for splits in (1, 3):
        out = sparse_attention(*args, window=window, num_splits=splits, block_n=16, packed=packed)
        torch.testing.assert_close(out, want, **TOL)


PACKED_CASES = [  # (ctx_lens, tail_lens, counts, heads, kv_heads, head_dim): one shared selection
    ([37, 70, 5], [3, 9, 1], [20, 0, 4], 6, 3, 16),        # GQA 2, ragged, an empty selection
    ([50, 23], [5, 2], [33, 21], 9, 3, 32),                 # SmolLM2's grouping, full selection
    ([45, 64, 19], [4, 1, 6], [9, 63, 0], 8, 2, 16),        # GQA 4, page multiples
    ([41, 30], [7, 3], [34, 5], 4, 4, 16),                  # GQA 1: every row its own KV head
]


@pytest.mark.parametrize("ctx_lens,tail_lens,counts,heads,kv_heads,head_dim", PACKED_CASES)
def test_packed_matches_reference(ctx_lens, tail_lens, counts, heads, kv_heads, head_dim):
    """All KV heads of a request in one program: each row must take its own KV head's keys and
    values only (a row reading another head's would be far off), split or not, any tile."""
    args = make_case(ctx_lens, tail_lens, counts, heads, kv_heads, head_dim, seed=4)
    ref = sparse_attention_reference(*args)
    for block_n, splits in ((16, 1), (32, 1), (16, 3)):
        out = sparse_attention(*args, block_n=block_n, num_splits=splits, packed=True)
        torch.testing.assert_close(out, ref, **TOL)


def test_packing_rule():
    """Packed exactly for a shared selection over several KV heads whose query heads fit one tile;
    never for per-KV-head selections."""
    assert packs_kv_heads(9, 3, 1) and packs_kv_heads(16, 4, 1)
    assert not packs_kv_heads(9, 3, 3)              # a set per KV head
    assert not packs_kv_heads(8, 1, 1)              # one KV head: nothing to pack
    assert not packs_kv_heads(32, 8, 1)             # 32 rows: more than MAX_PACKED_HEADS


def test_packed_rejects_per_head_selections():
    args = make_case([20], [2], [5], 6, 3, 16, per_head=True, max_k=8)
    with pytest.raises(ValueError, match="shared"):
        sparse_attention(*args, packed=True)


def test_rejects_bad_group_count():
    args = list(make_case([20], [2], [5], 6, 3, 16, max_k=8))
    args[5] = args[5].expand(1, 2, 8).contiguous()                    # G = 2, neither 1 nor KVH = 3
    with pytest.raises(ValueError):
        sparse_attention(*args)


@pytest.mark.parametrize("per_head", [False, True])
def test_reference_matches_engine_maths(per_head):
    """Tie the reference to ReferenceBackend._sparse: the same draft query, pool and selection (a
    FixedSelection view over key slots from the block table), request by request."""
    ctx_lens, tails, counts = [37, 21], [5, 2], [12, 19]
    kvh, heads, d = 3, 9, 16
    args = make_case(ctx_lens, tails, counts, heads, kvh, d, per_head=per_head, max_k=24, seed=7)
    args = tuple(t.cpu() if torch.is_tensor(t) else t for t in args)
    q, k_cache, v_cache, tables, ctx, indices, counts_t, tail_start, scale = args
    out = sparse_attention_reference(*args)
    backend = ReferenceBackend(scale)
    kf, vf = k_cache.reshape(-1, kvh, d), v_cache.reshape(-1, kvh, d)
    bs = k_cache.shape[1]
    for b, (c, n) in enumerate(zip(ctx_lens, counts)):
        pos = torch.arange(c)
        key_slots = tables[b].long()[pos // bs] * bs + pos % bs
        view = FixedSelection(int(tail_start[b]), n, [indices[b, :, :n].long()])
        seq = SeqAttention(q_start=0, q_len=1, key_slots=key_slots, sparse=view)
        want = backend._sparse(0, q[b:b + 1], kf, vf, seq)
        torch.testing.assert_close(out[b:b + 1], want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter's tl.dot is wrong for bf16")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_realistic_shapes_on_gpu(dtype):
    """Model-sized heads (d = 64 and 128), a 2k-entry selection, automatic and forced splits."""
    tol = TOL if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for heads, kv_heads, d, per_head in ((9, 3, 64, True), (9, 3, 64, False), (32, 8, 128, False)):
        args = make_case([4100, 2600, 700], [9, 17, 3], [2048, 1500, 0], heads, kv_heads, d,
                         per_head=per_head, max_k=2048, seed=11, dtype=dtype)
        ref = sparse_attention_reference(*args)
        for splits in (None, 1, 8):
            out = sparse_attention(*args, num_splits=splits)
            assert out.dtype == dtype
            torch.testing.assert_close(out, ref, **tol)


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter's tl.dot is wrong for bf16")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_packed_is_close_to_the_per_kv_head_programs_on_gpu(dtype):
    """Compiled, the packed program and the per-KV-head ones differ only in rounding (the latter's
    values go into the rescaled accumulator inside the dot): within one bf16 step, or float32
    rounding, of each other at every tile and split count."""
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    args = make_case([4100, 2600, 700, 33], [9, 17, 3, 1], [2048, 1500, 0, 20], 9, 3, 64,
                     max_k=2048, seed=12, dtype=dtype)
    for block_n, splits in ((32, 1), (32, 6), (16, 12), (64, 3)):
        packed = sparse_attention(*args, block_n=block_n, num_splits=splits, packed=True)
        single = sparse_attention(*args, block_n=block_n, num_splits=splits, packed=False)
        torch.testing.assert_close(packed, single, **tol)


def test_split_count_fills_about_one_wave_of_resident_programs():
    """The device rule behind `_auto_splits` (and `bench sass`'s offline launches): about 6
    programs an SM at head dim 64 (4 above), at least two tiles of the index capacity a split."""
    from vegas_core.kernels.sparse_attention import split_count
    assert split_count(64, 1, 8192, 32, 64, 132) == 12     # packed, the CUDA graphs' 12 at batch 64
    assert split_count(64, 3, 8192, 32, 64, 132) == 4      # a program per KV head
    assert split_count(64, 8, 8192, 32, 128, 132) == 1     # 512 programs already fill the GPU
    assert split_count(1, 1, 100, 32, 64, 132) == 2        # capped: 100 entries = 2 splits of 2 tiles
    assert split_count(1, 1, 1 << 20, 32, 64, 132) == 64   # never more than 64
