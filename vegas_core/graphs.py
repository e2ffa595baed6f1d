"""CUDA graphs for the decode-time forwards of the kernel path.

At batch 64 a forward of a small model is hundreds of short kernels, and launching them one by one
from Python costs far more than running them. So each forward *shape* is captured once as a CUDA
graph over static buffers and then replayed: the host only writes the step's numbers into the
buffers (one copy to the device) and launches the graph.

A graph is keyed by `GraphKey`:
- ``dense``: decode steps and verifications, ``batch`` requests (a batch-size bucket) of up to
  ``rows`` query rows each, flat, padding after them; ``collect`` 0 (none), 1 (any rows, through
  the attention kernel's main tile) or 2 (only first / last rows: its Collect-2-Query tile);
- ``fixed``: draft steps over fixed selections (vegas, vegas-all, specextend, stream), with
  ``groups`` sets per layer (1, or one per KV head);
- ``quest``: Quest draft steps, scoring pages in the graph, up to ``pages`` selected pages.

Buffers (`_Buffers`): every per-step number lives in one int64 device buffer filled by a single
copy from a host staging copy (pinned on a GPU); the block tables in an int32 buffer copied only
when the batch's tables changed (once per iteration: the draft steps and the verification of one
iteration share them); the selections in an [L, B, G, W] buffer copied when the selections changed
(once per iteration); collected logits and log-sum-exps in whole-model buffers that the selection
reads after the replay. Padding rows write their K/V to the pool's scratch slot; padding requests
have no rows and no context, so every kernel skips them.

Chains (`run_chain`): for one-row-per-request steps (draft steps; plain decode steps of a vanilla
batch) the graph also advances itself: its argmax, or for a sampled batch a sample from each
request's counter-based stream (`random_streams`; the draft distributions are kept for the
rejection sampling), becomes the next step's input, positions
and contexts move on by one and each request's K/V slot follows its table, writing to the scratch
slot past the request's own number of steps. Replayed `steps` times with no host round trip in
between; the tokens are read back once, or not at all: a verification whose entries name a chain
column (`BatchEntry.device_drafts`) takes its draft tokens from the chain's history on the GPU
(the ``src`` field maps its rows there), so drafting and verifying need no host read in between.

`capture=False` runs exactly the same static-buffer code without capturing: how the CPU tests
check this path under Triton's interpreter. Engines that trace attention recall, or mix draft kinds
in one step, take the dynamic path for that forward (`run` returns None); a traced Quest chain's
first step replays a graph that also writes its sets out (`GraphKey.keep_sets`).
`EngineOptions(cuda_graphs="off")` (the CLI's ``--eager``) turns graphs off.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from vegas_core.kernels.argmax import argmax_rows
from vegas_core.kernels.select import quest_sizes
from vegas_core.kernels.verify_attention import MAX_Q_ROWS

from .attention import AttentionMetadata, LogitCollector
from .attention.kernel_backend import _Dense, _Plan, _Sparse, stack_indices
from .random_streams import DRAFT, TOKEN
from .sampling import is_filtered, sample_rows, sampling_tensors
from .spec.params import MAX_GAMMA
from .spec.views import BlockQuestSelection, FixedSelection
from .transfer import to_host_async

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
MAX_CHAIN = 16            # steps of one chain: gamma <= 16 drafts, or that many decode steps


@dataclass(frozen=True)
class GraphKey:
    kind: str            # "dense", "fixed" or "quest"
    batch: int           # requests, a bucket (padding requests after the real ones)
    rows: int = 1        # dense: query rows per request at most (flat rows: batch * rows)
    collect: int = 0     # dense: 0 none, 1 main-tile rows, 2 first/last tile
    groups: int = 1      # drafts: sets per layer
    pages: int = 0       # quest: selected pages at most
    chain: bool = False  # one row per request, advancing itself (see `GraphRunner.run_chain`)
    sampled: int = 0     # chain: 0 argmax, 1 sampled, 2 sampled with top-k/top-p/min-p filters
    keep_sets: bool = False   # quest chain's first step: also writes its sets out (`_kept_sets`)

    @property
    def tokens(self) -> int:
        return self.batch * self.rows


def bucket(n: int, largest: int) -> int | None:
    """The smallest batch bucket holding n requests, at most `largest` (None past it)."""
    if n > largest:
        return None
    return min(next(b for b in BATCH_BUCKETS + (largest,) if b >= n), largest)


class _Graph:
    """One captured forward (or, without capture, the same function run each time)."""

    def __init__(self, fn, capture: bool, pool):
        self.fn, self.graph, self.out = fn, None, None
        if not capture:
            return
        # Warm up outside the capture (Triton compiles, cuBLAS picks and allocates); the inputs
        # are the real step's, and a forward is idempotent on them (it rewrites the same K/V).
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def replay(self) -> torch.Tensor:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


class _Buffers:
    """The static inputs, at the largest batch. Regions of the int64 buffer (each of its own
    length, at fixed offsets): ids, pos, slots, seq_lens, collected rows, each row's source in a
    chain's history (-1: the host's id) [T each], a chain's step limits [B] and step counter [1];
    then the fields the kernels read as int32 (converted in the graph): ctx, tail, counts,
    pages [B each], qloc [B + 1], row_slot [T]."""

    I64 = ("ids", "pos", "slots", "seq_lens", "crow", "src", "limit", "step", "key")
    I32 = ("ctx", "tail", "counts", "pages", "qloc", "row_slot")

    def __init__(self, max_batch: int, blocks: int, device: torch.device):
        self.max_batch, self.max_tokens = max_batch, max_batch * MAX_Q_ROWS
        sizes = {name: self.max_tokens for name in self.I64}
        sizes.update(limit=max_batch, step=1, key=max_batch, ctx=max_batch, tail=max_batch, counts=max_batch,
                     pages=max_batch, qloc=max_batch + 1, row_slot=self.max_tokens)
        self.offsets, at = {}, 0
        for name in self.I64 + self.I32:
            self.offsets[name] = at
            at += sizes[name]
        self.i32_start = self.offsets[self.I32[0]]
        pin = device.type == "cuda"
        self.host = torch.zeros(at, dtype=torch.int64, pin_memory=pin)
        self.dev = torch.zeros(at, dtype=torch.int64, device=device)
        self.host_tables = torch.zeros(max_batch, blocks, dtype=torch.int32, pin_memory=pin)
        self.dev_tables = torch.zeros(max_batch, blocks, dtype=torch.int32, device=device)
        self.np = self.host.numpy()
        self.np_tables = self.host_tables.numpy()
        # A sampled chain's per-request sampling (`sampling.sampling_tensors`: temperature,
        # top-k, top-p, min-p), float32 [4, B].
        self.host_sampling = torch.zeros(4, max_batch, dtype=torch.float32, pin_memory=pin)
        self.dev_sampling = torch.zeros(4, max_batch, dtype=torch.float32, device=device)
        self.copied = torch.cuda.Event() if pin else None

    def field(self, name: str, n: int) -> np.ndarray:
        """Host view of the first n entries of a field (write the step's numbers here)."""
        at = self.offsets[name]
        return self.np[at:at + n]

    def wait_for_copy(self) -> None:
        """The staging copy may be rewritten once the last copy from it has completed."""
        if self.copied is not None:
            self.copied.synchronize()

    def upload(self) -> None:
        self.dev.copy_(self.host, non_blocking=True)
        self.dev_sampling.copy_(self.host_sampling, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def device_views(self, key: GraphKey) -> dict[str, torch.Tensor]:
        """Device tensors a graph reads (made inside the graph, so replays see new values)."""
        t, b = key.tokens, key.batch
        i32 = self.dev[self.i32_start:].to(torch.int32)
        out = {}
        for name in self.I64:
            at = self.offsets[name]
            out[name] = self.dev[at:at + {"limit": b, "step": 1, "key": b}.get(name, t)]
        at = self.offsets["ctx"]
        out["ctx64"] = self.dev[at:at + b]          # the int64 source of ctx (a chain advances it)
        for name in self.I32:
            at = self.offsets[name] - self.i32_start
            n = {"qloc": b + 1, "row_slot": t}.get(name, b)
            out[name] = i32[at:at + n]
        out["tables"] = self.dev_tables[:b]
        out["sampling"] = self.dev_sampling[:, :b]
        return out


class GraphRunner:
    """Replays captured forwards for the model runner (see the module docstring)."""

    def __init__(self, runner, max_batch: int, capture: bool):
        self.runner, self.capture = runner, capture
        cfg, pool = runner.config, runner.pool
        self.block_size = pool.block_size
        # Widest context a graph attends: the model's, plus the drafts past its end; no more than
        # the pool holds.
        width = min(cfg.max_position_embeddings + MAX_GAMMA + 1, pool.num_blocks * self.block_size)
        self.blocks = -(-width // self.block_size)
        self.width = self.blocks * self.block_size
        self.max_batch = min(max_batch, BATCH_BUCKETS[-1])
        self.buf = _Buffers(self.max_batch, self.blocks, runner.device)
        self.graphs: dict[GraphKey, _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0                    # graphs made so far (benchmarks skip those steps)
        self._indices: torch.Tensor | None = None          # [L, B, kv_heads, W] int32
        self._logits: torch.Tensor | None = None           # [global layers, R, H, W] bf16
        self._lse: torch.Tensor | None = None              # [global layers, T, H] float32
        self._hist = torch.zeros(MAX_CHAIN, self.max_batch, dtype=torch.int64, device=runner.device)
        self._qhist: torch.Tensor | None = None    # [MAX_CHAIN, B, V]: sampled drafts' distributions
        self._kept: dict[GraphKey, torch.Tensor] = {}     # quest first steps' sets, [L, B, G, K]
        self._tables_sig = self._indices_sig = None
        self._seq_tables: dict[int, tuple[int, np.ndarray]] = {}
        self._last: GraphKey | None = None       # the last forward's graph (None: not a graph)

    # -- entry point ---------------------------------------------------------------------------
    def run(self, entries, allocator, collector: LogitCollector | None) -> torch.Tensor | None:
        """Logits of the entries (all rows of dense entries, the one row of each draft entry), or
        None when this forward is not one a graph takes. Valid until the next forward."""
        key = self._key(entries, collector)
        self._last = key
        if key is None:
            return None
        total = self._fill(entries, allocator, key, collector)
        self.buf.upload()
        logits = self._graph(key).replay()
        return logits[:total]

    def verification_rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where the last forward's rows were, as device views of its buffers: qloc [n + 1]
        (request i's rows start at qloc[i]) and each request's first position [n]. Work queued
        now reads the values that forward read (the next upload is queued after it). None
        unless the last forward was a dense graph (a verification) of at least n requests."""
        key = self._last
        if key is None or key.kind != "dense" or key.chain or key.batch < n:
            return None
        dev, off = self.buf.dev, self.buf.offsets
        qloc = dev[off["qloc"]:off["qloc"] + n + 1]
        return qloc, dev[off["pos"]:off["pos"] + key.tokens][qloc[:-1]]

    def run_chain(self, entries, allocator, steps: int, limits: list[int], to_host: bool = True,
                  first: tuple[torch.Tensor, torch.Tensor] | None = None, sampling=None):
        """Tokens [steps, len(entries)] of `steps` chained one-row forwards: step 0 feeds the
        entries' tokens, step j the token step j - 1 chose; request i runs `limits[i]` steps
        (1..steps), its later rows are garbage. Numpy, or with `to_host=False` a view of the
        history on the device (valid until the next chain). None when no graph takes these entries.

        A step chooses the argmax, or with `sampling` (a `SamplingParams` and a stream key per
        entry) samples in the graph from each request's own stream (`sampling.sample_rows`, at the
        position the token will take): a draft step with the DRAFT draws, keeping its
        distribution for the verification's rejection sampling (`chain_probs`), a plain decode
        step with the TOKEN draws, what one step at a time draws.

        `first` (ids [n], positions [n] on the device) replaces the entries' tokens and starts,
        so a chain can start from numbers the host has not seen (greedy acceptance on the
        device); the entries' starts are then the largest those positions may be."""
        key = self._key(entries, None, chain=True)
        self._last = None
        if key is None or key.tokens != key.batch or not 1 <= steps <= MAX_CHAIN \
                or any(e.start + steps > self.width for e in entries):
            return None
        mode = 0 if sampling is None else 2 if is_filtered(sampling[0]) else 1
        key = replace(key, chain=True, sampled=mode)
        self._fill(entries, allocator, key, None)
        if mode:
            self._fill_sampling(*sampling, key)
        limit = self.buf.field("limit", key.batch)
        limit[:len(entries)], limit[len(entries):] = limits, 0
        self.buf.field("step", 1)[0] = 0
        self.buf.upload()
        keep = key.kind == "quest" and any(e.sparse.keep_sets for e in entries)
        graph = self._graph(key)
        # A trace keeps the first draft step's sets: that step replays a graph that writes them out.
        first_graph = self._graph(replace(key, keep_sets=True)) if keep else graph
        if first is not None:
            self._start_at(len(entries), *first)
        for step in range(steps):
            (first_graph if step == 0 else graph).replay()
        if keep:
            self._copy_kept_sets(replace(key, keep_sets=True), entries)
        tokens = self._hist[:steps, :len(entries)]
        return tokens.cpu().numpy() if to_host else tokens

    def _copy_kept_sets(self, key: GraphKey, entries) -> None:
        """Queue the host copy of the sets a quest chain's first step wrote (before any later
        chain rewrites them); each view reads its column once the copy is done."""
        host, done = to_host_async(self._kept[key][:, :len(entries)])
        for j, e in enumerate(entries):
            v = e.sparse
            count = quest_sizes([v.num_pages], [v.base], [v.budget], v.page_size)[0]
            v.host_copy = (host, done, j, count)

    def chain_probs(self, steps: int, n: int) -> torch.Tensor:
        """[steps, n, V] on the device: the distributions the last sampled draft chain drew from
        (valid until the next chain)."""
        return self._qhist[:steps, :n]

    def _fill_sampling(self, params, keys, key: GraphKey) -> None:
        n, vocab = len(params), self.runner.config.vocab_size
        f = self.buf.host_sampling[:, :key.batch]
        f[:, :n] = sampling_tensors(params, vocab, "cpu")
        f[0, n:], f[1, n:], f[2, n:], f[3, n:] = 0.0, vocab, 1.0, 0.0     # padding: greedy
        field = self.buf.field("key", key.batch)
        field[:n], field[n:] = keys, 0
        if key.kind != "dense" and self._qhist is None:   # before any graph writes it
            self._qhist = torch.zeros(MAX_CHAIN, self.max_batch, vocab, dtype=torch.float32,
                                      device=self.runner.device)

    def _start_at(self, n: int, ids: torch.Tensor, pos: torch.Tensor) -> None:
        """Overwrite the uploaded first-step numbers of a chain's n requests on the device: their
        tokens, positions, lengths and contexts, and each K/V write's slot from its table."""
        dev, off, bs = self.buf.dev, self.buf.offsets, self.block_size
        page = self.buf.dev_tables[:n].gather(1, (pos // bs)[:, None].to(torch.int64))[:, 0].long()
        for name, values in (("ids", ids), ("pos", pos), ("seq_lens", pos + 1), ("ctx", pos + 1),
                             ("slots", page * bs + pos % bs)):
            dev[off[name]:off[name] + n].copy_(values)

    def with_host_drafts(self, entries):
        """Entries whose chained drafts are read back into their token lists (for a forward that
        no graph takes)."""
        if all(e.device_drafts is None for e in entries):
            return entries
        hist = self._hist.cpu().numpy()
        return [e if e.device_drafts is None else
                replace(e, tokens=[e.tokens[0]] + hist[:len(e.tokens) - 1, e.device_drafts].tolist(),
                        device_drafts=None) for e in entries]

    def _graph(self, key: GraphKey) -> _Graph:
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = _Graph(lambda: self._forward(key), self.capture, self.mempool)
            self.captures += 1
            if graph.graph is not None:
                self.buf.upload()   # the warm-up run may have advanced a chain: start it again
        return graph

    # -- which graph ---------------------------------------------------------------------------
    def _key(self, entries, collector, chain: bool = False) -> GraphKey | None:
        """The graph for these entries, or None. Quest views keeping their sets (traces) are taken
        only by a chain (`run_chain` records its first step's)."""
        batch = bucket(len(entries), self.max_batch)
        if batch is None or not entries:
            return None
        if any(e.start + len(e.tokens) > self.width for e in entries):
            return None
        views = [e.sparse for e in entries]
        if all(v is None for v in views):
            if any(e.logits != "all" for e in entries) or max(len(e.tokens) for e in entries) > MAX_Q_ROWS:
                return None
            collects = [e.collect_rows for e in entries if e.collect_rows is not None]
            if collects and collector is None:
                return None
            first_last = all(set(c) <= {0, len(e.tokens) - 1}
                             for e in entries if (c := e.collect_rows) is not None)
            mode = 0 if not collects else 2 if first_last else 1
            return GraphKey("dense", batch, rows=max(len(e.tokens) for e in entries), collect=mode)
        if any(v is None or len(e.tokens) != 1 or e.logits != "last" or v.wants_recall
               for v, e in zip(views, entries)):
            return None
        if all(isinstance(v, FixedSelection) for v in views):
            return GraphKey("fixed", batch, groups=max(v.groups for v in views))
        if all(isinstance(v, BlockQuestSelection) and (chain or not v.keep_sets) for v in views) \
                and len({v.granularity for v in views}) == 1:
            pages = quest_sizes([v.num_pages for v in views], [v.base for v in views],
                                [v.budget for v in views], views[0].page_size)[1]
            groups = 1 if views[0].granularity == "layer" else self.runner.config.num_kv_heads
            pages = min(1 << max(0, pages - 1).bit_length(), self.blocks)   # few distinct graphs
            return GraphKey("quest", batch, groups=groups, pages=pages)
        return None

    # -- the step's numbers --------------------------------------------------------------------
    def _fill(self, entries, allocator, key: GraphKey, collector) -> int:
        """Write the step's numbers into the host staging (once the last copy from it is done);
        returns the number of real rows. The caller uploads."""
        self.buf.wait_for_copy()
        self._fill_tables(entries, allocator, key.batch)
        total = self._fill_rows(entries, key)
        if key.kind == "dense":
            self._fill_dense(entries, key, collector)
        else:
            self._fill_draft(entries, key)
        return total

    def _fill_tables(self, entries, allocator, batch: int) -> None:
        """Block tables, when the batch (or one of its tables) changed since the last forward."""
        sig = (batch, tuple((e.seq_id, allocator.version(e.seq_id)) for e in entries))
        if sig == self._tables_sig:
            return
        tables = self.buf.np_tables
        for i, e in enumerate(entries):
            tables[i] = self._table_row(e.seq_id, allocator)
        tables[len(entries):batch] = 0
        self.buf.dev_tables[:batch].copy_(self.buf.host_tables[:batch], non_blocking=True)
        self._tables_sig = sig

    def _table_row(self, seq_id: int, allocator) -> np.ndarray:
        version = allocator.version(seq_id)
        cached = self._seq_tables.get(seq_id)
        if cached is None or cached[0] != version:
            row = np.zeros(self.blocks, dtype=np.int32)
            table = allocator.block_table(seq_id)[:self.blocks]
            row[:len(table)] = table
            cached = self._seq_tables[seq_id] = (version, row)
            if len(self._seq_tables) > 4 * self.max_batch:     # forget finished sequences
                self._seq_tables = {s: v for s, v in self._seq_tables.items()
                                    if allocator.block_table(s)}
        return cached[1]

    def _fill_rows(self, entries, key: GraphKey) -> int:
        """ids, positions, K/V slots and lengths of every row (padding rows: the scratch slot);
        contexts; returns the number of real rows."""
        b, t = key.batch, key.tokens
        lens = np.fromiter((len(e.tokens) for e in entries), dtype=np.int64, count=len(entries))
        starts = np.fromiter((e.start for e in entries), dtype=np.int64, count=len(entries))
        total = int(lens.sum())
        req = np.repeat(np.arange(len(entries)), lens)
        first = np.repeat(np.cumsum(lens) - lens, lens)
        pos = starts[req] + (np.arange(total) - first)
        ids, p, slots, seq_lens = (self.buf.field(n, t) for n in ("ids", "pos", "slots", "seq_lens"))
        ids[:total] = np.fromiter((tok for e in entries for tok in e.tokens), dtype=np.int64, count=total)
        p[:total] = pos
        bs = self.block_size
        slots[:total] = self.buf.np_tables[req, pos // bs].astype(np.int64) * bs + pos % bs
        seq_lens[:total] = (starts + lens)[req]
        ids[total:], p[total:], seq_lens[total:] = 0, 0, 1
        slots[total:] = self.runner.pool.scratch_slot
        if key.kind == "dense" and not key.chain:
            src = self.buf.field("src", t)
            src[:] = -1
            at = 0
            for e in entries:
                if e.device_drafts is not None:   # row 1 + j is the chain's step j of this column
                    src[at + 1:at + len(e.tokens)] = np.arange(len(e.tokens) - 1) * self.max_batch + e.device_drafts
                at += len(e.tokens)
        ctx = self.buf.field("ctx", b)
        ctx[:len(entries)] = starts + lens
        ctx[len(entries):] = 0
        return total

    def _fill_dense(self, entries, key: GraphKey, collector) -> None:
        b, t = key.batch, key.tokens
        lens = [len(e.tokens) for e in entries]
        qloc = self.buf.field("qloc", b + 1)
        qloc[0] = 0
        qloc[1:len(entries) + 1] = np.cumsum(lens)
        qloc[len(entries) + 1:] = qloc[len(entries)]
        if not key.collect:
            return
        row_slot, crow = self.buf.field("row_slot", t), self.buf.field("crow", t)
        row_slot[:] = -1
        rows, at = [], 0
        for i, e in enumerate(entries):
            if e.collect_rows is not None:
                collector.rows_of[i] = list(range(len(rows), len(rows) + len(e.collect_rows)))
                rows.extend(at + r for r in e.collect_rows)
            at += len(e.tokens)
        row_slot[rows] = np.arange(len(rows))
        crow[:len(rows)] = rows
        logits, lse = self._collect_buffers(key)
        at = self.buf.offsets["crow"]
        collector.layer_logits, collector.layer_lse = logits[:, :len(rows)], lse[:, :t]
        collector.layers = self.runner.config.global_layers
        collector.row_index = self.buf.dev[at:at + len(rows)]      # uploaded with this step

    def _fill_draft(self, entries, key: GraphKey) -> None:
        n, views = len(entries), [e.sparse for e in entries]
        tail, counts = self.buf.field("tail", key.batch), self.buf.field("counts", key.batch)
        tail[:n] = [v.base for v in views]
        counts[:n] = [v.budget for v in views]
        tail[n:], counts[n:] = 0, 0
        if key.kind == "quest":
            pages = self.buf.field("pages", key.batch)
            pages[:n] = [v.num_pages for v in views]
            pages[n:] = 0
        else:
            self._fill_indices(views, key)

    def _fill_indices(self, views, key: GraphKey) -> None:
        """Each request's sets into its column of the [L, B, G, W] buffer, when they changed."""
        # The views themselves are the signature (held, so no new view can look like an old one).
        sig = (key.batch, key.groups, views)
        old = self._indices_sig
        if old is not None and old[:2] == sig[:2] and len(old[2]) == len(views) \
                and all(a is b for a, b in zip(old[2], views)):
            return
        dst = self._index_buffer()[:, :len(views), :key.groups]
        cfg = self.runner.config
        sets = stack_indices(views, dst.device, cfg.num_kv_heads, cfg.num_layers)   # [L, n, G', K]
        dst[:, :, :, :sets.shape[3]] = sets.expand(-1, -1, key.groups, -1)
        self._indices_sig = sig

    # -- persistent outputs --------------------------------------------------------------------
    def _index_buffer(self) -> torch.Tensor:
        if self._indices is None:
            cfg = self.runner.config
            self._indices = torch.zeros(cfg.num_layers, self.max_batch, cfg.num_kv_heads, self.width,
                                        dtype=torch.int32, device=self.runner.device)
        return self._indices

    def _collect_buffers(self, key: GraphKey) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole-model collected logits and lse (every global layer: a sliding-window layer
        collects nothing), grown (and the graphs writing them dropped) when a key needs more rows
        than they hold."""
        rows = 2 * key.batch if key.collect == 2 else key.tokens
        if self._logits is None or self._logits.shape[1] < rows or self._lse.shape[1] < key.tokens:
            cfg = self.runner.config
            rows = max(rows, 0 if self._logits is None else self._logits.shape[1])
            tokens = max(key.tokens, 0 if self._lse is None else self._lse.shape[1])
            self.graphs = {k: g for k, g in self.graphs.items() if not k.collect}
            self._logits = self._lse = None
            layers = len(cfg.global_layers)
            self._logits = torch.empty(layers, rows, cfg.num_heads, self.width,
                                       dtype=torch.bfloat16, device=self.runner.device)
            self._lse = torch.empty(layers, tokens, cfg.num_heads, dtype=torch.float32,
                                    device=self.runner.device)
        return self._logits, self._lse

    # -- the captured function -----------------------------------------------------------------
    def _forward(self, key: GraphKey) -> torch.Tensor:
        v = self.buf.device_views(key)
        meta = AttentionMetadata(slot_mapping=v["slots"], seqs=[], block_tables=v["tables"],
                                 plan=_Plan(groups=[self._group(key, v)]))
        ids = v["ids"]
        if key.kind == "dense" and not key.chain:     # rows whose token is a chain's draft
            src = v["src"]
            ids = torch.where(src >= 0, self._hist.view(-1)[src.clamp(min=0)], ids)
        # A greedy chain step takes only the argmax: the head's bf16 logits, not a float32 copy.
        greedy_chain = key.chain and not key.sampled
        logits = self.runner.model(ids, v["pos"], self.runner.pool, meta, None, v["seq_lens"],
                                   float_logits=not greedy_chain)
        if key.chain:
            self._advance(key, v, logits)
        return logits

    def _advance(self, key: GraphKey, v: dict, logits: torch.Tensor) -> None:
        """A chain's step in the graph: record the token chosen (the argmax, or a sample from the
        request's stream at the position it takes), feed it next, move every position on by one,
        and point each request's next K/V write at its page (the scratch slot once it has run
        its `limit` steps, or for padding requests)."""
        step = v["step"]
        if key.sampled:
            t = v["sampling"]
            probs, nxt = sample_rows(logits, t, v["key"], v["pos"] + 1,
                                     TOKEN if key.kind == "dense" else DRAFT,
                                     filtered=key.sampled == 2, kernel=self.runner.kernels)
            if key.kind != "dense":
                self._qhist[:, :probs.shape[0]].index_copy_(0, step, probs[None])
        else:   # the first index of the largest logit either way (kernels/argmax.py)
            nxt = argmax_rows(logits, pdl=self.runner.options.kernels.pdl) if self.runner.kernels \
                else logits.argmax(dim=-1)
        self._hist[:, :nxt.shape[0]].index_copy_(0, step, nxt[None])
        v["ids"].copy_(nxt)
        for name in ("pos", "seq_lens", "ctx64", "step"):
            v[name].add_(1)
        pos, bs = v["pos"], self.block_size
        page = v["tables"].gather(1, (pos // bs).clamp(max=self.blocks - 1)[:, None])[:, 0].long()
        v["slots"].copy_(torch.where(step < v["limit"], page * bs + pos % bs, self.runner.pool.scratch_slot))

    def _group(self, key: GraphKey, v: dict):
        cfg = self.runner.config
        if key.kind == "dense":
            g = _Dense(rows=None, tables=v["tables"], ctx=v["ctx"], qloc=v["qloc"], max_q=key.rows,
                       num_splits=self.runner.model.backend.dense_splits(key.batch, cfg.num_kv_heads,
                                                                         self.width))
            if key.collect:
                g.logits, g.lse = self._logits, self._lse[:, :key.tokens]
                g.row_slot, g.c2q_tile = v["row_slot"], key.collect == 2
            return g
        g = _Sparse(seqs=[], rows=None, tables=v["tables"], ctx=v["ctx"], tail=v["tail"])
        if key.kind == "fixed":
            g.indices, g.counts = self._index_buffer()[:, :key.batch, :key.groups], v["counts"]
        else:
            g.num_pages, g.budgets, g.page_size = v["pages"], v["counts"], self.block_size
            g.granularity = "layer" if key.groups == 1 else "kv-head"
            g.p_max = self.blocks
            g.sizes = ((key.pages + 1) * self.block_size, key.pages)
            if key.keep_sets:
                g.sets_out = self._kept_sets(key, g.sizes[0])
        return g

    def _kept_sets(self, key: GraphKey, width: int) -> torch.Tensor:
        """[L, B, G, K] int32, the sets a quest chain's first step writes out (one per graph)."""
        if key not in self._kept:
            self._kept[key] = torch.zeros(self.runner.config.num_layers, key.batch, key.groups, width,
                                          dtype=torch.int32, device=self.runner.device)
        return self._kept[key]
