"""The kernel attention backend (the GPU path): the Triton kernels of `kernels/`, each call covering
the whole batch of a layer, instead of the reference's one request at a time.

Per forward, at the first layer, the backend sorts the requests into groups and builds their
tensors once (every layer attends the same batch):
- dense, at most 17 rows (decode steps, verifications, short prefill chunks): one
  `verify_attention` call, collecting the logits of exactly the rows each request's policy asks
  for (`LogitCollector.batched`);
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

from kernels.select import quest_page_scores, quest_positions, quest_sizes
from kernels.sparse_attention import sparse_attention
from kernels.verify_attention import MAX_Q_ROWS, collected_row_slots, verify_attention

from ..kv_cache import KVPool
from .metadata import AttentionMetadata
from .reference import ReferenceBackend


@dataclass
class _Dense:
    seqs: list[int]
    rows: torch.Tensor | None        # flat q rows of the group (None: every row, in order)
    tables: torch.Tensor
    ctx: torch.Tensor
    qloc: torch.Tensor
    max_ctx: int
    max_q: int
    collect: object = "none"         # explicit flat rows (within the group) or "none"
    row_slot: torch.Tensor | None = None
    collected_rows: torch.Tensor | None = None   # device: the group's rows that were collected


@dataclass
class _Sparse:
    seqs: list[int]
    rows: torch.Tensor               # the draft row of each request (flat q index)
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


@dataclass
class _Plan:
    dense: _Dense | None = None
    fixed: _Sparse | None = None
    quest: list[_Sparse] = field(default_factory=list)
    long: list[int] = field(default_factory=list)


class KernelBackend:
    name = "triton"

    def __init__(self, scale: float, quest_bounds=None):
        self.scale = scale
        self.reference = ReferenceBackend(scale)
        self.quest_bounds = quest_bounds     # PageBounds beside the pool (None: no Quest support)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                pool: KVPool, meta: AttentionMetadata) -> torch.Tensor:
        pool.write(layer, meta.slot_mapping, k, v)
        if meta.plan is None:
            meta.plan = self._plan(meta, q.device, pool)
        plan: _Plan = meta.plan
        kc, vc = pool.k[layer], pool.v[layer]
        if plan.dense is not None and plan.dense.rows is None:
            return self._dense(layer, q, None, kc, vc, plan.dense, meta)   # every row is the group's
        out = torch.empty_like(q)
        if plan.dense is not None:
            self._dense(layer, q, out, kc, vc, plan.dense, meta)
        if plan.fixed is not None:
            g = plan.fixed
            o = sparse_attention(q[g.rows], kc, vc, g.tables, g.ctx, g.indices[layer], g.counts,
                                 g.tail, self.scale)
            out[g.rows] = o
            self._recall(layer, q, pool, meta, g, g.indices[layer])
        for g in plan.quest:
            kmin, kmax = self.quest_bounds.layer(layer)
            qq = q[g.rows]
            scores = quest_page_scores(qq, kmin, kmax, g.tables, g.num_pages, g.granularity, p_max=g.p_max)
            idx, counts = quest_positions(scores, g.num_pages, g.tail, g.budgets, g.page_size, sizes=g.sizes)
            out[g.rows] = sparse_attention(qq, kc, vc, g.tables, g.ctx, idx, counts, g.tail,
                                           self.scale)
            for j, i in enumerate(g.seqs):
                view = meta.seqs[i].sparse
                if view.keep_sets:
                    view.note_positions(layer, idx[j, :, :g.host_counts[j]].long())
            self._recall(layer, q, pool, meta, g, idx)
        if plan.long:
            kf, vf = pool.flat(layer)
            for i in plan.long:
                seq = meta.seqs[i]
                rows = slice(seq.q_start, seq.q_start + seq.q_len)
                out[rows] = self.reference._dense(layer, i, q[rows], kf, vf, seq, meta).to(q.dtype)
        return out

    def _dense(self, layer, q, out, kc, vc, g: _Dense, meta: AttentionMetadata) -> torch.Tensor:
        """One verify_attention call for the group; its rows of `out` are filled (or, when the
        group is the whole batch in order, its output is returned as the layer's)."""
        qd = q if g.rows is None else q[g.rows]
        o, lse, coll = verify_attention(qd, kc, vc, g.tables, g.ctx, g.qloc, self.scale,
                                        collect=g.collect, max_ctx=g.max_ctx, max_q=g.max_q,
                                        row_slot=g.row_slot)
        if coll is not None and meta.collector is not None:
            meta.collector.batched[layer] = (coll.logits, lse[g.collected_rows])
        if g.rows is None:
            return o
        out[g.rows] = o
        return out

    def _recall(self, layer, q, pool, meta, g: _Sparse, indices) -> None:
        """Attention recall for traces (a full attention per request: trace-on-request only)."""
        kf, _ = pool.flat(layer)
        for j, i in enumerate(g.seqs):
            seq = meta.seqs[i]
            if not seq.sparse.wants_recall:
                continue
            count = g.host_counts[j]
            sel = indices[j, :, :count].long()
            tail = torch.arange(seq.sparse.base, seq.ctx_len, device=q.device).expand(sel.shape[0], -1)
            qs = q[seq.q_start: seq.q_start + 1]
            seq.sparse.record_recall(layer, self.reference._recall(qs, kf, seq, torch.cat([sel, tail], 1)))

    # -- the per-forward plan ------------------------------------------------------------------
    def _plan(self, meta: AttentionMetadata, device, pool: KVPool) -> _Plan:
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
            plan.dense = self._dense_group(meta, dense, tables, device)
        if fixed:
            plan.fixed = self._sparse_group(meta, fixed, tables, device)
            views = [meta.seqs[i].sparse for i in fixed]
            plan.fixed.indices = self._stack_indices(views, device, pool.k[0].shape[2])
            plan.fixed.host_counts = [v.budget for v in views]
            plan.fixed.counts = torch.tensor(plan.fixed.host_counts, dtype=torch.int32, device=device)
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
            plan.quest.append(g)
        return plan

    @staticmethod
    def _stack_indices(views, device, kv_heads: int) -> torch.Tensor:
        """[L, B, G, K] int32: the requests' index sets side by side. When the batch is exactly the
        one the batched selection produced (same tensor, same order), that tensor is used as is."""
        src = [getattr(v, "source", None) for v in views]
        if src[0] is not None and all(s is not None and s[0] is src[0][0] and s[1] == j
                                      for j, s in enumerate(src)) \
                and src[0][0].shape[1] == len(views):
            return src[0][0]
        stacks = [v.stacked(device) for v in views]
        groups = max(s.shape[1] for s in stacks)
        kmax = max(max(s.shape[2] for s in stacks), 1)
        idx = torch.zeros(stacks[0].shape[0], len(stacks), groups, kmax, dtype=torch.int32,
                          device=device)
        for j, s in enumerate(stacks):
            if groups > 1 and s.shape[1] == 1:
                s = s.expand(-1, kv_heads, -1)     # one set per layer, read by every KV head
            idx[:, j, :, :s.shape[2]] = s
        return idx

    @staticmethod
    def _sparse_group(meta, members, tables, device) -> _Sparse:
        seqs = [meta.seqs[i] for i in members]
        return _Sparse(
            seqs=members,
            rows=torch.tensor([s.q_start for s in seqs], dtype=torch.long, device=device),
            tables=tables[torch.tensor(members, device=device)] if len(members) < len(meta.seqs) else tables,
            ctx=torch.tensor([meta.context_lens[i] for i in members], dtype=torch.int32, device=device),
            tail=torch.tensor([s.sparse.base for s in seqs], dtype=torch.int32, device=device))

    @staticmethod
    def _dense_group(meta, members, tables, device) -> _Dense:
        seqs = [meta.seqs[i] for i in members]
        everything = len(members) == len(meta.seqs)
        qloc, rows, collect, rows_of = [0], [], [], {}
        for i, s in zip(members, seqs):
            base = qloc[-1]
            rows.extend(range(s.q_start, s.q_start + s.q_len))
            if s.collect_rows is not None and meta.collector is not None:
                rows_of[i] = list(range(len(collect), len(collect) + len(s.collect_rows)))
                collect.extend(base + r for r in s.collect_rows)
            qloc.append(base + s.q_len)
        ctx = [meta.context_lens[i] for i in members]
        g = _Dense(
            seqs=members,
            rows=None if everything and rows == list(range(len(rows))) else
            torch.tensor(rows, dtype=torch.long, device=device),
            tables=tables if everything else tables[torch.tensor(members, device=device)],
            ctx=torch.tensor(ctx, dtype=torch.int32, device=device),
            qloc=torch.tensor(qloc, dtype=torch.int32, device=device),
            max_ctx=max(ctx), max_q=max(s.q_len for s in seqs))
        if collect:
            rows_t = torch.tensor(collect, dtype=torch.long)
            g.collect = rows_t
            g.row_slot = collected_row_slots(rows_t, qloc[-1]).to(device)
            g.collected_rows = rows_t.to(device)
            meta.collector.rows_of.update(rows_of)
        return g
