"""Whether anyone reads an API stream.

Gradio pulls a handler's generator whether or not a client reads what it yields: a script that POSTs
to `/call/stream_tokens` and never GETs the result would keep the engine decoding to max_tokens while
the messages pile up in the server. Gradio has no public way to tell, so `UnreadWatch` reads its
queue's per-session backlog (`Queue.pending_messages_per_session`, private; a test in
tests/vegas_studio_app/test_load.py fails if it goes away)."""
from __future__ import annotations

import time


def unread_messages(blocks, session_hash: str | None) -> int | None:
    """Messages Gradio holds for this session that no client has read, or None where it cannot say."""
    pending = getattr(getattr(blocks, "_queue", None), "pending_messages_per_session", None)
    queue = pending.get(session_hash) if pending is not None and session_hash else None
    return queue.qsize() if queue is not None else None


class UnreadWatch:
    """`abandoned()` turns True once the session's backlog has been non-empty and not shrinking
    for `limit_s` seconds: events keep coming and nobody takes them."""

    def __init__(self, blocks, session_hash: str | None, limit_s: float):
        self.blocks, self.session_hash, self.limit_s = blocks, session_hash, limit_s
        self.last = 0
        self.read_at = time.monotonic()

    def abandoned(self) -> bool:
        n = unread_messages(self.blocks, self.session_hash)
        if n is None:
            return False
        now = time.monotonic()
        if n == 0 or n < self.last:
            self.read_at = now
        self.last = n
        return now - self.read_at > self.limit_s
