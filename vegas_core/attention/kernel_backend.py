"""The kernel attention backend (the GPU path): the Triton kernels of `kernels/`, each call covering
the whole batch of a layer, instead of the reference's one request at a time.

Per forward, at the first layer, the backend sorts the requests into groups and builds their
tensors once (every layer attends the same batch): a `_Plan`. A CUDA graph (`vegas_core.graphs`)
builds its plan itself, from its static buffers, and the same code below runs it.
- dense, at most 17 rows (decode steps, verifications; prefill chunks over at most
  `PIECES_MAX_CONTEXT` keys cut into pieces of 17 rows): one `verify_attention` launch,
  collecting the logits of exactly the rows each request's policy asks for into one [layers,
  rows, heads, width] buffer (`LogitCollector.layer_logits`); when every collected row is its
  request's first or last (Collect-2-Query), through the kernel's small first/last tile;
- drafts with a fixed selection (vegas, vegas-all, specextend, stream): one `sparse_attention`
  call over their [L, B, G, K] index tensor plus each request's tail;
- Quest drafts: per granularity, page scores from the draft query against the pool's block bounds
  (`kernels.select.quest_page_scores`), the top pages (`quest_positions`), then `sparse_attention`;
- prefill chunks over longer contexts: the reference's fused SDPA, one request at a time.

Sliding-window layers (`windows`, Gemma 3's local layers) pass their window to the same kernels,
which start each row at its own window on the device and skip the pages before it: dense groups
attend windowed and collect nothing (the collected buffers hold the global layers only,
`collect_slot`), draft groups of every method attend the query's window whole (no selection, no
Quest scoring), prefill chunks over longer contexts take the reference's windowed attention.

With `KernelOptions.deterministic` (the batch-invariant mode) every call takes one launch
(`verify_attention.batch_invariant_launch` of `KernelOptions.invariant`; drafts
`sparse_attention.INVARIANT_SPLITS` splits, one program per KV head), and prefill chunks of any
context go through `verify_attention`, cut into pieces of as many rows as its tile holds (a smaller
tile's in row chunks: `invariant_piece_rows`), each program folding its splits in place: a row's
attention is then the same bits in a prefill chunk of any length, a decode step or a
verification, whatever the batch.

The maths is the reference's (`reference.py`); `tests/vegas_core/test_kernel_backend.py` runs the
engine both ways under the Triton interpreter and requires the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vegas_core.kernels.select import quest_page_scores, quest_positions, quest_sizes
from vegas_core.kernels.sparse_attention import INVARIANT_SPLITS, sparse_attention
from vegas_core.kernels.verify_attention import (MAX_Q_ROWS, batch_invariant_launch,
                                                 collected_row_slots, default_num_splits,
                                                 invariant_num_splits, invariant_piece_rows,
                                                 verify_attention_into)

from ..kv_cache import KVPool
from ..options import KernelOptions
from ..spec.select import no_selection, stream_indices
from ..spec.views import StreamSelection
from ..transfer import to_device
from .metadata import AttentionMetadata
from .reference import ReferenceBackend


# Default mode: prefill chunks whose context is at most this many keys are attended in pieces of the
# verification kernel (1.2-2x faster than SDPA per request up to SmolLM2's 8K on an H100); longer
# ones keep the reference's SDPA, which reads each key once per 128-row tile where every piece reads
# them all, and were not measured (bench/NOTES.md version 71).
PIECES_MAX_CONTEXT = 8192


@dataclass
class _Dense:
    rows: torch.Tensor | None        # flat q rows of the group (None: every row, in order)
    tables: torch.Tensor             # int32 [B, blocks]
    ctx: torch.Tensor                # int32 [B]
    qloc: torch.Tensor               # int32 [B + 1]
    max_q: int
    num_splits: int
    row_slot: torch.Tensor | None = None   # int32 [rows]: collected slot of each row, -1 if none
    c2q_tile: bool = False           # every collected row is its request's first or last
    logits: torch.Tensor | None = None     # bf16 [Lc, R, H, W]: collected logits, every collecting
    lse: torch.Tensor | None = None        # layer (`collected_layers`); float32 [Lc, rows, H]
    in_program: bool = False         # prefill: splits one after another per program (batch-invariant mode only)


@dataclass
class _Sparse:
    seqs: list[int]                  # indices into meta.seqs (empty in a CUDA graph)
    rows: torch.Tensor | None        # the draft row of each request (None: every row, in order)
    tables: torch.Tensor
    ctx: torch.Tensor
    tail: torch.Tensor               # first position attended in full (the base)
    indices: torch.Tensor | None = None   # [L, B, G, K] (fixed selections)
    counts: torch.Tensor | None = None
    # Quest only:
    num_pages: torch.Tensor | None = None
    budgets: torch.Tensor | None = None
    page_size: int = 0
    granularity: str = "layer"
    p_max: int = 0
    sizes: tuple[int, int] = (0, 0)
    host_counts: list[int] = field(default_factory=list)   # entries per request (host copy)
    sets_out: torch.Tensor | None = None   # [L, B, G, K]: the sets written here too (traces, in a graph)


@dataclass
class _Plan:
    groups: list = field(default_factory=list)   # _Dense / _Sparse, each on its own rows
    long: list[int] = field(default_factory=list)

    @property
    def whole(self):
        """The group whose output is the layer's (it covers every row, in order), or None."""
        return self.groups[0] if len(self.groups) == 1 and self.groups[0].rows is None \
            and not self.long else None


class KernelBackend:
    name = "triton"

    def __init__(self, scale: float, quest_bounds=None, options: KernelOptions | None = None,
                 windows=()):
        self.scale = scale
        options = options or KernelOptions()
        self.pdl = options.pdl
        self.deterministic = options.deterministic
        self.invariant = options.invariant      # the batch-invariant mode's launch choices
        self.windows = tuple(windows)        # per layer: its sliding window (None: global); () = all global
        self.reference = ReferenceBackend(scale, windows)
        self.quest_bounds = quest_bounds     # PageBounds beside the pool (None: no Quest support)
        self._slots = {layer: i for i, layer in enumerate(collected_layers(self.windows, len(self.windows)))}
        # Draft launches beyond the default ones: fixed splits, one program per KV head.
        self._sparse = dict(num_splits=INVARIANT_SPLITS, packed=False) if self.deterministic else {}

    def _window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    def collect_slot(self, layer: int) -> int | None:
        """The layer's row in the collected logits and lse buffers (None: a sliding layer, which
        collects nothing)."""
        return self._slots.get(layer) if self.windows else layer

    def dense_splits(self, batch: int, kv_heads: int, max_ctx: int) -> int:
        """Context splits of a dense (verification, decode, prefill) call."""
        if self.deterministic:
            return invariant_num_splits(max_ctx, self.invariant.split_keys)
        return default_num_splits(batch, kv_heads, max_ctx)

    def dense_rows(self, group: int) -> int:
        """The most rows of one request a dense call takes (prefill chunks are cut to it in the
        batch-invariant mode; longer ones take the reference's SDPA otherwise)."""
        if not self.deterministic:
            return MAX_Q_ROWS
        return invariant_piece_rows(group, self.invariant)

    def _in_pieces(self, q_len: int, ctx: int) -> bool:
        """Whether a request's dense rows go to `verify_attention` (in pieces of `dense_rows` rows,
        each a kernel request) rather than the reference's SDPA: always in the batch-invariant mode;
        else up to `PIECES_MAX_CONTEXT` keys, where one launch a layer for the whole batch beats
        SDPA's launches per request and layer."""
        return q_len <= MAX_Q_ROWS or self.deterministic or ctx <= PIECES_MAX_CONTEXT

    def invariant_launch(self, head_dim: int, group: int) -> dict:
        """The batch-invariant mode's `verify_attention_into` arguments at this shape."""
        return batch_invariant_launch(head_dim, group, self.invariant)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                pool: KVPool, meta: AttentionMetadata) -> torch.Tensor:
        if k is not None:            # None: the model's fused rotary kernel already wrote them
            pool.write(layer, meta.slot_mapping, k, v)
        if meta.plan is None:
            meta.plan = self._plan(meta, q, pool)
        plan: _Plan = meta.plan
        kc, vc = pool.k[layer], pool.v[layer]
        whole = plan.whole
        if whole is not None:
            return self._attend(whole, layer, q, kc, vc, pool, meta)
        out = torch.empty_like(q)
        for g in plan.groups:
            out[g.rows] = self._attend(g, layer, q[g.rows], kc, vc, pool, meta)
        if plan.long:
            kf, vf = pool.flat(layer)
            window = self._window(layer)
            for i in plan.long:
                seq = meta.seqs[i]
                rows = slice(seq.q_start, seq.q_start + seq.q_len)
                o = self.reference._windowed(q[rows], kf, vf, seq, window) if window else \
                    self.reference._dense(layer, i, q[rows], kf, vf, seq, meta)
                out[rows] = o.to(q.dtype)
        return out

    def _attend(self, g, layer, q, kc, vc, pool, meta) -> torch.Tensor:
        """One group's attention for its rows `q` (the group's rows, in its order)."""
        window = self._window(layer)
        if isinstance(g, _Dense):
            out = torch.empty_like(q)
            slot = self.collect_slot(layer)
            lse = g.lse[slot] if g.lse is not None and slot is not None else \
                torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
            launch = dict(c2q_tile=g.c2q_tile)
            splits = g.num_splits
            if self.deterministic:      # splits at fixed positions, windowed or not
                launch = dict(self.invariant_launch(q.shape[2], q.shape[1] // kc.shape[2]),
                              splits_in_program=g.in_program)
            elif window:
                splits = window_splits(g.num_splits, g.ctx.shape[0], kc.shape[2], window, g.max_q)
            verify_attention_into(q, kc, vc, g.tables, g.ctx, g.qloc, self.scale, out, lse,
                                  max_q=g.max_q, num_splits=splits,
                                  logits=None if g.logits is None or slot is None else g.logits[slot],
                                  row_slot=g.row_slot, window=window or 0, **launch)
            return out
        if window:      # every method drafts a sliding layer with the target's own window
            out = sparse_attention(q, kc, vc, g.tables, g.ctx, None, None, None, self.scale,
                                   pdl=self.pdl, window=window, **self._sparse)
            self._window_draft_noted(layer, meta, g, kc.shape[2])
            return out
        if g.num_pages is None:
            out = sparse_attention(q, kc, vc, g.tables, g.ctx, g.indices[layer], g.counts, g.tail,
                                   self.scale, pdl=self.pdl, **self._sparse)
            self._recall(layer, q, pool, meta, g, g.indices[layer])
            return out
        kmin, kmax = self.quest_bounds.layer(layer)
        scores = quest_page_scores(q, kmin, kmax, g.tables, g.num_pages, g.granularity, p_max=g.p_max)
        idx, counts = quest_positions(scores, g.num_pages, g.tail, g.budgets, g.page_size, sizes=g.sizes)
        out = sparse_attention(q, kc, vc, g.tables, g.ctx, idx, counts, g.tail, self.scale, pdl=self.pdl,
                               **self._sparse)
        if g.sets_out is not None:
            g.sets_out[layer, :, :, :idx.shape[2]].copy_(idx)
        for j, i in enumerate(g.seqs):
            view = meta.seqs[i].sparse
            if view.keep_sets:
                view.note_positions(layer, idx[j, :, :g.host_counts[j]].long())
        self._recall(layer, q, pool, meta, g, idx)
        return out

    @staticmethod
    def _window_draft_noted(layer, meta, g: _Sparse, kv_heads: int) -> None:
        """What the reference notes for a draft of a sliding layer: recall 1 (it sees the
        target's own window) and, for a Quest trace, an empty set."""
        for i in g.seqs:
            view = meta.seqs[i].sparse
            if view.wants_recall:
                view.record_recall(layer, 1.0)
            if getattr(view, "keep_sets", False):
                view.note_positions(layer, no_selection(view.granularity, kv_heads).to(g.ctx.device))

    def _recall(self, layer, q, pool, meta, g: _Sparse, indices) -> None:
        """Attention recall for traces (a full attention per request: trace-on-request only).
        `q` holds the group's rows."""
        kf, _ = pool.flat(layer)
        for j, i in enumerate(g.seqs):
            seq = meta.seqs[i]
            if not seq.sparse.wants_recall:
                continue
            count = g.host_counts[j]
            sel = indices[j, :, :count].long()
            tail = torch.arange(seq.sparse.base, seq.ctx_len, device=q.device).expand(sel.shape[0], -1)
            seq.sparse.record_recall(layer, self.reference._recall(q[j:j + 1], kf, seq, torch.cat([sel, tail], 1)))

    # -- the per-forward plan ------------------------------------------------------------------
    def _plan(self, meta: AttentionMetadata, q: torch.Tensor, pool: KVPool) -> _Plan:
        device = q.device
        plan = _Plan()
        dense, fixed, quest = [], [], {}
        for i, seq in enumerate(meta.seqs):
            view = seq.sparse
            if view is None:
                (dense if self._in_pieces(seq.q_len, meta.context_lens[i]) else plan.long).append(i)
            elif hasattr(view, "num_pages"):
                quest.setdefault(view.granularity, []).append(i)
            else:
                fixed.append(i)
        tables = meta.block_tables.to(torch.int32)
        if dense:
            piece = self.dense_rows(q.shape[1] // pool.k[0].shape[2])
            plan.groups.append(self._dense_group(meta, dense, tables, q, pool,
                                                 collected_layers(self.windows, len(pool.k)),
                                                 self.dense_splits, piece))
        if fixed:
            g = self._sparse_group(meta, fixed, tables, device)
            views = [meta.seqs[i].sparse for i in fixed]
            g.host_counts = [v.budget for v in views]
            g.counts = torch.tensor(g.host_counts, dtype=torch.int32, device=device)
            g.indices = stack_indices(views, device, pool.k[0].shape[2], len(pool.k))
            plan.groups.append(g)
        for gran, members in quest.items():
            g = self._sparse_group(meta, members, tables, device)
            views = [meta.seqs[i].sparse for i in members]
            g.num_pages = torch.tensor([v.num_pages for v in views], dtype=torch.int32, device=device)
            g.budgets = torch.tensor([v.budget for v in views], dtype=torch.int32, device=device)
            g.page_size, g.granularity = views[0].page_size, gran
            pages, bases, budgets = ([v.num_pages for v in views], [v.base for v in views],
                                     [v.budget for v in views])
            g.p_max = max(pages)
            g.sizes = quest_sizes(pages, bases, budgets, g.page_size)
            g.host_counts = [quest_sizes([p], [b], [k], g.page_size)[0]
                             for p, b, k in zip(pages, bases, budgets)]
            plan.groups.append(g)
        return plan

    @staticmethod
    def _sparse_group(meta, members, tables, device) -> _Sparse:
        seqs = [meta.seqs[i] for i in members]
        rows = [s.q_start for s in seqs]
        whole = len(members) == len(meta.seqs) and rows == list(range(len(rows)))
        return _Sparse(
            seqs=members,
            rows=None if whole else torch.tensor(rows, dtype=torch.long, device=device),
            tables=tables[torch.tensor(members, device=device)] if len(members) < len(meta.seqs) else tables,
            ctx=torch.tensor([meta.context_lens[i] for i in members], dtype=torch.int32, device=device),
            tail=torch.tensor([s.sparse.base for s in seqs], dtype=torch.int32, device=device))

    @staticmethod
    def _dense_group(meta, members, tables, q, pool: KVPool, layers: tuple[int, ...], splits,
                     piece: int = 0) -> _Dense:
        """`layers`: the layers that collect (the buffers' rows, `collected_layers`). `piece` > 0:
        requests of more rows are attended as pieces of at most `piece` rows, each a request of
        the kernel with the context of its last row (`splits` gives the split count from the
        batch size, KV heads and longest context)."""
        device = q.device
        seqs = [meta.seqs[i] for i in members]
        qloc, rows, collect, rows_of, c2q = [0], [], [], {}, True
        owner, ctx = [], []            # per kernel request: its index in members, its context
        for j, (i, s) in enumerate(zip(members, seqs)):
            base = qloc[-1]
            rows.extend(range(s.q_start, s.q_start + s.q_len))
            ends = list(range(piece, s.q_len, piece)) if piece else []
            if s.collect_rows is not None and meta.collector is not None:
                rows_of[i] = list(range(len(collect), len(collect) + len(s.collect_rows)))
                collect.extend(base + r for r in s.collect_rows)
                # The first/last tile takes a kernel request's first and last rows: no pieces.
                c2q = c2q and set(s.collect_rows) <= {0, s.q_len - 1} and not ends
            for end in ends + [s.q_len]:
                qloc.append(base + end)
                owner.append(j)
                ctx.append(meta.context_lens[i] - (s.q_len - end))
        whole = len(members) == len(meta.seqs) and owner == list(range(len(owner)))
        g = _Dense(
            rows=None if len(members) == len(meta.seqs) and rows == list(range(len(rows))) else
            torch.tensor(rows, dtype=torch.long, device=device),
            tables=tables if whole else
            tables[torch.tensor([members[j] for j in owner], device=device)],
            ctx=torch.tensor(ctx, dtype=torch.int32, device=device),
            qloc=torch.tensor(qloc, dtype=torch.int32, device=device),
            max_q=max(b - a for a, b in zip(qloc, qloc[1:])),
            num_splits=splits(len(ctx), pool.k[0].shape[2], max(ctx)),
            # A prefill's rows would write one partial state per split each: fold them in place.
            in_program=bool(piece) and max(s.q_len for s in seqs) > MAX_Q_ROWS)
        if collect:
            rows_t = torch.tensor(collect, dtype=torch.long)
            heads = q.shape[1]
            g.row_slot = collected_row_slots(rows_t, qloc[-1]).to(device)
            g.c2q_tile = c2q
            g.logits = torch.empty(len(layers), len(collect), heads, max(ctx), dtype=torch.bfloat16,
                                   device=device)
            g.lse = torch.empty(len(layers), qloc[-1], heads, dtype=torch.float32, device=device)
            c = meta.collector
            c.layer_logits, c.layer_lse, c.row_index = g.logits, g.lse, rows_t.to(device)
            c.layers = layers
            c.rows_of.update(rows_of)
        return g


def window_splits(num_splits: int, batch: int, kv_heads: int, window: int, max_q: int) -> int:
    """A sliding layer's split of its keys: `default_num_splits`' rule over the at most
    window + max_q - 1 keys its rows see, not the context (capped at the context's count)."""
    return min(num_splits, default_num_splits(batch, kv_heads, window + max_q - 1))


def collected_layers(windows, num_layers: int) -> tuple[int, ...]:
    """The layers whose verification logits are collected, in order: all but the sliding-window
    ones (`windows[layer]` not None; () = none), whose window is small enough to attend whole."""
    return tuple(i for i in range(num_layers) if not windows or windows[i] is None)


def stack_indices(views, device, kv_heads: int, num_layers: int) -> torch.Tensor:
    """[L, B, G, K] int32: the requests' fixed index sets side by side (G = 1 or kv_heads; a set
    per layer beside per-KV-head sets is read by every KV head). Sets the batched selection made
    in one tensor are taken from it (as is when the batch is its columns in order, else one
    gather); stream sets are made on the device for the whole batch (one set, every layer)."""
    src = [getattr(v, "source", None) for v in views]
    if all(s is not None and s[0] is src[0][0] for s in src):
        stacked = src[0][0]
        cols = [s[1] for s in src]
        if cols == list(range(stacked.shape[1])):
            return stacked
        return stacked.index_select(1, to_device(cols, torch.int64, stacked.device))
    if all(isinstance(v, StreamSelection) for v in views):
        cols = to_device([[v.base, v.budget, v.sink] for v in views], torch.int64, device).T
        pos = stream_indices(cols[0], cols[1], cols[2], max(max(v.budget for v in views), 1))
        return pos[None, :, None, :].expand(num_layers, -1, -1, -1)
    stacks = [v.stacked(device) for v in views]
    groups = max(s.shape[1] for s in stacks)
    kmax = max(max(s.shape[2] for s in stacks), 1)
    idx = torch.zeros(stacks[0].shape[0], len(stacks), groups, kmax, dtype=torch.int32,
                      device=device)
    for j, s in enumerate(stacks):
        idx[:, j, :, :s.shape[2]] = s.expand(-1, groups, -1)
    return idx
