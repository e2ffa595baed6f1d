"""Clients that measure a running app: one streamed request timed event by event (`timed_stream`),
and `ClientProcesses`, clients in processes of their own that submit together when told.

Eight clients are eight users on eight machines, not eight threads of the measuring process: there
they share one interpreter lock, and eight gradio_client jobs submitted at once from one process
reached the app 0.1-0.15 s later than from the page's protocol (bench/NOTES.md versions 66 and 68).
Each client opens its session before it is told to go, as a page does when it loads: Gradio builds a
new session's state at its first call, ~17 ms for this page on the server's event loop, so eight new
sessions at once held the last handler back by ~0.13 s (bench/NOTES.md version 70).
"""
from __future__ import annotations

import multiprocessing
import time

from .client import open_page_session, open_stream_session, page_stream, stream_tokens

# Long enough for a request at the app's largest prompt on the CPU; a client silent for longer is stuck.
REPLY_TIMEOUT_S = 900.0


def new_client(url: str, page: bool):
    """A connection to the app: an httpx.Client for the page's protocol, else a gradio_client
    `Client` (which fetches the app's API description as it is made)."""
    if page:
        import httpx
        return httpx.Client(timeout=300)
    from gradio_client import Client
    return Client(url, verbose=False)


def open_session(url: str, client, page: bool) -> str | None:
    """Open `client`'s session on the app, as a page load does (`client.open_page_session`): the
    session hash for the page's protocol; a gradio_client `Client` keeps its own for `stream_tokens`
    (None)."""
    if page:
        return open_page_session(url, client)
    open_stream_session(client)
    return None


def timed_stream(url: str, prompt: str, method: str, max_tokens: int, client, page: bool = False,
                 fn_index: int | None = None, session: str | None = None) -> dict:
    """One greedy chat request streamed on `client`: tokens/s between the first and last token
    events, time to first token from the submit, the largest gap between events, and where each
    event was on the server (`t_engine`: the engine emitted it, `t_sent`: the API yielded it), so
    that a gap can be placed: engine, hand-over or transport. `page`: by the page's protocol
    (`client` an httpx.Client; `session` from `open_session`, else a new one), else a gradio_client
    `Client` through `client.stream_tokens`."""
    t0 = time.time()
    if page:
        outs = page_stream(url, prompt, method, max_tokens, True, 0.0, fn_index=fn_index, client=client,
                           session=session)
    else:
        outs = stream_tokens(client, prompt, method, max_tokens, True, 0.0)
    events, api, accepted, final = [], None, None, {}
    for out in outs:
        if not out.get("finished"):
            events.append((time.time(), len(out["token_ids"]), out.get("t_engine"), out.get("t_sent")))
            api, accepted = out.get("t_api"), out.get("t_accepted")
        else:
            final = out
    if final.get("error"):
        raise RuntimeError(f"{method}: {final['error']}")
    arrivals = [e[0] for e in events]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    engine_gaps = [b[2] - a[2] for a, b in zip(events, events[1:]) if a[2] and b[2]]
    return dict(tokens=sum(e[1] for e in events), events=len(events),
                tokens_per_s=decode_rate([e[1] for e in events], arrivals),
                t_submit=t0, t_last=arrivals[-1] if arrivals else None,
                ttft_s=arrivals[0] - t0 if arrivals else None, max_gap_s=max(gaps, default=None),
                engine_ttft_s=events[0][2] - t0 if events and events[0][2] else None,
                api_s=api - t0 if api else None, accept_s=accepted - t0 if accepted else None,
                first_to_last_s=arrivals[-1] - arrivals[0] if arrivals else None,
                max_engine_gap_s=max(engine_gaps, default=None),
                max_send_delay_s=max((e[0] - e[3] for e in events if e[3]), default=None),
                max_handover_s=max((e[3] - e[2] for e in events if e[2] and e[3]), default=None))


def decode_rate(event_tokens: list[int], stamps: list[float]) -> float | None:
    """Decode tokens/s between the first and the last token event: the tokens that came after the
    first event over the time since it."""
    if len(stamps) < 2:
        return None
    return (sum(event_tokens) - event_tokens[0]) / (stamps[-1] - stamps[0])


def _client_main(conn, url: str, max_tokens: int, fn_index: int) -> None:
    """A client process: for each (prompt, method, page) it connects and opens its session
    (`open_session`), says "ready", and on "go" streams and sends back ("ok", `timed_stream`'s
    dict) or ("error", what went wrong)."""
    while (task := conn.recv()) is not None:
        prompt, method, page = task
        client = None
        try:
            client = new_client(url, page)
            session = open_session(url, client, page)
            conn.send(("ready", None))
            if conn.recv():
                conn.send(("ok", timed_stream(url, prompt, method, max_tokens, client, page, fn_index, session)))
        except Exception as e:      # reported to the measuring process, which raises it
            conn.send(("error", f"{type(e).__name__}: {e}"))
        finally:
            if client is not None:
                client.close()


class ClientProcesses:
    """`n` client processes for the app at `url`; `together` has each stream one prompt, all
    submitted at once after every client has connected and opened its session (users open the
    page before they press Generate). Close when done (a context manager)."""

    def __init__(self, url: str, n: int, max_tokens: int, fn_index: int):
        ctx = multiprocessing.get_context("spawn")    # no copy of the measuring process's threads or torch
        self.conns, self.procs, self.broken = [], [], None
        for i in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_client_main, args=(child, url, max_tokens, fn_index),
                               name=f"client-{i}", daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _broken(self, why: str) -> RuntimeError:
        """The clients are out of step once one is gone or stuck: every later call says why."""
        self.broken = why
        return RuntimeError(why)

    def _exited(self, i: int) -> RuntimeError:
        self.procs[i].join(timeout=1)
        return self._broken(f"client {i}'s process exited (code {self.procs[i].exitcode})")

    def _send(self, i: int, message) -> None:
        try:
            self.conns[i].send(message)
        except OSError:                  # a broken pipe: the process is gone
            raise self._exited(i) from None

    def _reply(self, i: int):
        conn = self.conns[i]
        if not conn.poll(REPLY_TIMEOUT_S):
            raise self._broken(f"client {i} sent nothing for {REPLY_TIMEOUT_S:.0f} s")
        try:
            return conn.recv()
        except (EOFError, OSError):      # closed or reset: the process is gone
            raise self._exited(i) from None

    def together(self, prompts: list[str], method: str, page: bool = False) -> list[dict]:
        """Client i streams prompts[i]; `timed_stream`'s dict per client. Raises RuntimeError
        naming each client that failed."""
        if self.broken:
            raise RuntimeError(f"the client processes are out of step: {self.broken}")
        if len(prompts) != len(self.conns):
            raise ValueError(f"{len(prompts)} prompts for {len(self.conns)} clients")
        for i, prompt in enumerate(prompts):
            self._send(i, (prompt, method, page))
        ready = [self._reply(i) for i in range(len(self.conns))]
        go = all(kind == "ready" for kind, _ in ready)
        for i, (kind, _) in enumerate(ready):
            if kind == "ready":
                self._send(i, go)
        done = [self._reply(i) for i in range(len(self.conns))] if go else ready
        errors = [f"client {i}: {what}" for i, (kind, what) in enumerate(done) if kind == "error"]
        if errors:
            raise RuntimeError(f"{method}: " + "; ".join(errors))
        return [what for _, what in done]

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        for conn in self.conns:
            conn.close()
