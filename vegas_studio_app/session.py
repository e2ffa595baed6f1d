"""Per-browser-session state, kept on the server and keyed by Gradio's session hash.

Handlers of one session run concurrently (Stop, Pause and Step arrive while Generate streams), so the
controls live here rather than in `gr.State`, which a running generator would not see change.
`paused` means two things: during a live run the engine holds the request (Step advances it one
iteration); after a run, or for an uploaded trace, the view holds at `revealed` recorded iterations.
The store is a bounded LRU: old sessions' traces are dropped, so memory stays bounded, in sessions
(`capacity`) and in bytes: the uploaded traces that sessions hold share `upload_budget_bytes`, and
past it the least recently used sessions holding one are dropped.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from .runs import RunLog


@dataclass(eq=False)
class Session:
    handle: object | None = None        # worker.Handle of the generation in flight
    paused: bool = False                # live run: the engine holds the request; otherwise: the view holds
    revealed: int = 0                   # iterations shown while paused (Step adds one)
    version: int = 0                    # bumped by Pause / Step / Resume: the streaming view re-renders
    trace: object | None = None         # Trace of the last run, or the replayed upload
    live_iterations: list = field(default_factory=list)   # iterations of the run in flight / last run
    live_texts: dict = field(default_factory=dict)
    live_output: list = field(default_factory=list)
    runs: dict = field(default_factory=dict)              # compare: method -> Trace
    cancel_compare: bool = False
    source: str = ""                    # "live", "replay" or ""
    streaming: bool = False             # the Generate stream of `handle` is in flight (live step-through)
    run_info: tuple | None = None       # (SpecParams, SamplingParams) of the live run
    upload_bytes: int = 0               # memory its uploaded trace is counted as (`SessionStore.charge_upload`)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The run selector (runs.py): every run of this session, the one every tab shows, the one the
    # KV controls were last set for (they reset only when that changes), and the live run's Select
    # sets and acceptance draws by iteration index (the engine's, not kept in traces).
    runlog: RunLog = field(default_factory=RunLog)
    selected_run: str | None = None
    kv_run: str | None = None
    live_selected: dict = field(default_factory=dict)
    live_draws: dict = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.handle is not None and not getattr(self.handle, "done", True)

    def stop(self) -> bool:
        """Abort the generation in flight (and any compare loop). True if there was one."""
        self.cancel_compare = True
        h = self.handle
        if h is not None and not h.done:
            h.abort()
            return True
        return False


class SessionStore:
    def __init__(self, capacity: int = 256, upload_budget_bytes: int = 1 << 30):
        self.capacity = capacity
        self.upload_budget_bytes = upload_budget_bytes
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str | None) -> Session:
        key = key or "anonymous"
        with self._lock:
            s = self._items.get(key)
            if s is None:
                s = self._items[key] = Session()
                while len(self._items) > self.capacity:
                    _, old = self._items.popitem(last=False)
                    old.stop()
            else:
                self._items.move_to_end(key)
            return s

    def charge_upload(self, session: Session, nbytes: int) -> None:
        """Count `session`'s uploaded trace as `nbytes` (replacing what its last one counted); past
        the budget, drop the least recently used other sessions that hold one."""
        with self._lock:
            session.upload_bytes = nbytes
            total = sum(s.upload_bytes for s in self._items.values())
            for key, old in list(self._items.items()):       # oldest first
                if total <= self.upload_budget_bytes:
                    break
                if old is not session and old.upload_bytes:
                    del self._items[key]
                    old.stop()
                    total -= old.upload_bytes

    @property
    def upload_bytes(self) -> int:
        return sum(s.upload_bytes for s in self._items.values())

    def __len__(self) -> int:
        return len(self._items)
