"""The kernel attention backend (the GPU path): the Triton kernels of `kernels/`, each call covering
the whole batch of a layer, instead of the reference's one request at a time.

Per forward, at the first layer, the backend sorts the requests into groups and builds their
tensors once (every layer attends the same batch): a `_Plan`. A CUDA graph (`vegas_core.graphs`)
builds its plan itself, from its static buffers, and the same code below runs it.
- dense, at most 17 rows (decode steps, verifications, short prefill chunks): one
  `verify_attention` launch, collecting the logits of exactly the rows each request's policy asks
  for into one [layers, rows, heads, width] buffer (`LogitCollector.layer_logits`); when every
  collected row is its request's first or last (Collect-2-Query), through the kernel's small
  first/last tile;
- drafts with a fixed selection (vegas, vegas-all, specextend, stream): one `sparse_attention`
  call over their [L, B, G, K] index tensor plus each request's tail;
- Quest drafts: per granularity, page scores from the draft query against the pool's block bounds
  (`kernels.select.quest_page_scores`), the top pages (`quest_positions`), then `sparse_attention`;
- longer prefill chunks: the reference's fused SDPA, one request at a time.

The maths is the reference's (`reference.py`); `tests/vegas_core/test_kernel_backend.py` runs the
engine both ways under the Triton interpreter and requires the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vegas_core.kernels.select import quest_page_scores, quest_positions, quest_sizes
from vegas_core.kernels.sparse_attention import sparse_attention
from vegas_core.kernels.verify_attention import (MAX_Q_ROWS, collected_row_slots,
                                                 default_num_splits, verify_attention_into)

from ..kv_cache import KVPool
from ..options import KernelOptions
from ..spec.select import stream_indices
from ..spec.views import StreamSelection
from ..transfer import to_device
from .metadata import AttentionMetadata
from .reference import ReferenceBackend


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
    logits: torch.Tensor | None = None     # bf16 [L, R, H, W]: collected logits, every layer
    lse: torch.Tensor | None = None        # float32 [L, rows, H], kept when collecting


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

    def __init__(self, scale: float, quest_bounds=None, options: KernelOptions | None = None):
        self.scale = scale
        self.pdl = (options or KernelOptions()).pdl
        self.reference = ReferenceBackend(scale)
        self.quest_bounds = quest_bounds     # PageBounds beside the pool (None: no Quest support)

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
            for i in plan.long:
                seq = meta.seqs[i]
                rows = slice(seq.q_start, seq.q_start + seq.q_len)
                out[rows] = self.reference._dense(layer, i, q[rows], kf, vf, seq, meta).to(q.dtype)
        return out

    def _attend(self, g, layer, q, kc, vc, pool, meta) -> torch.Tensor:
        """One group's attention for its rows `q` (the group's rows, in its order)."""
        if isinstance(g, _Dense):
            out = torch.empty_like(q)
            lse = g.lse[layer] if g.lse is not None else \
                torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
            verify_attention_into(q, kc, vc, g.tables, g.ctx, g.qloc, self.scale, out, lse,
                                  max_q=g.max_q, num_splits=g.num_splits,
                                  logits=None if g.logits is None else g.logits[layer],
                                  row_slot=g.row_slot, c2q_tile=g.c2q_tile)
            return out
        if g.num_pages is None:
            out = sparse_attention(q, kc, vc, g.tables, g.ctx, g.indices[layer], g.counts, g.tail,
                                   self.scale, pdl=self.pdl)
            self._recall(layer, q, pool, meta, g, g.indices[layer])
            return out
        kmin, kmax = self.quest_bounds.layer(layer)
        scores = quest_page_scores(q, kmin, kmax, g.tables, g.num_pages, g.granularity, p_max=g.p_max)
        idx, counts = quest_positions(scores, g.num_pages, g.tail, g.budgets, g.page_size, sizes=g.sizes)
        out = sparse_attention(q, kc, vc, g.tables, g.ctx, idx, counts, g.tail, self.scale, pdl=self.pdl)
        if g.sets_out is not None:
            g.sets_out[layer, :, :, :idx.shape[2]].copy_(idx)
        for j, i in enumerate(g.seqs):
            view = meta.seqs[i].sparse
            if view.keep_sets:
                view.note_positions(layer, idx[j, :, :g.host_counts[j]].long())
        self._recall(layer, q, pool, meta, g, idx)
        return out

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
                (dense if seq.q_len <= MAX_Q_ROWS else plan.long).append(i)
            elif hasattr(view, "num_pages"):
                quest.setdefault(view.granularity, []).append(i)
            else:
                fixed.append(i)
        tables = meta.block_tables.to(torch.int32)
        if dense:
            plan.groups.append(self._dense_group(meta, dense, tables, q, pool))
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
    def _dense_group(meta, members, tables, q, pool: KVPool) -> _Dense:
        device = q.device
        seqs = [meta.seqs[i] for i in members]
        everything = len(members) == len(meta.seqs)
        qloc, rows, collect, rows_of, c2q = [0], [], [], {}, True
        for i, s in zip(members, seqs):
            base = qloc[-1]
            rows.extend(range(s.q_start, s.q_start + s.q_len))
            if s.collect_rows is not None and meta.collector is not None:
                rows_of[i] = list(range(len(collect), len(collect) + len(s.collect_rows)))
                collect.extend(base + r for r in s.collect_rows)
                c2q = c2q and set(s.collect_rows) <= {0, s.q_len - 1}
            qloc.append(base + s.q_len)
        ctx = [meta.context_lens[i] for i in members]
        g = _Dense(
            rows=None if everything and rows == list(range(len(rows))) else
            torch.tensor(rows, dtype=torch.long, device=device),
            tables=tables if everything else tables[torch.tensor(members, device=device)],
            ctx=torch.tensor(ctx, dtype=torch.int32, device=device),
            qloc=torch.tensor(qloc, dtype=torch.int32, device=device),
            max_q=max(s.q_len for s in seqs),
            num_splits=default_num_splits(len(members), pool.k[0].shape[2], max(ctx)))
        if collect:
            rows_t = torch.tensor(collect, dtype=torch.long)
            layers, heads = len(pool.k), q.shape[1]
            g.row_slot = collected_row_slots(rows_t, qloc[-1]).to(device)
            g.c2q_tile = c2q
            g.logits = torch.empty(layers, len(collect), heads, max(ctx), dtype=torch.bfloat16,
                                   device=device)
            g.lse = torch.empty(layers, qloc[-1], heads, dtype=torch.float32, device=device)
            c = meta.collector
            c.layer_logits, c.layer_lse, c.row_index = g.logits, g.lse, rows_t.to(device)
            c.rows_of.update(rows_of)
        return g


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
