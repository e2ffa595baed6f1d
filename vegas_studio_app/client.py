"""Streaming from a running Vegas Studio with gradio_client, event by event as the server sends them.

    from gradio_client import Client
    from vegas_studio_app.client import stream_tokens
    for event in stream_tokens(Client("http://127.0.0.1:7860/"), "Hello", "vegas", max_tokens=64):
        print(event.get("text", ""), end="", flush=True)

Read a job through `stream_job`, not `for out in job`: gradio_client's `Job.__next__` sleeps while it
holds the lock that its reader thread needs to hand over each event, and on a many-core host that
starved the reader for seconds, so a whole answer arrived at once (docs/RESULTS.md, "The app").
"""
from __future__ import annotations

import time
from collections.abc import Iterator


def stream_job(job, poll_s: float = 0.002) -> Iterator:
    """Yield a gradio_client `Job`'s outputs as they arrive, then raise the job's error if it failed."""
    seen = 0
    while True:
        done = job.done()                 # before reading: outputs that came with the end are not missed
        outputs = job.outputs()
        yield from outputs[seen:]
        seen = len(outputs)
        if done:
            job.result()                  # raises the job's error (queue full, server stopped, ...)
            return
        time.sleep(poll_s)


def stream_tokens(client, prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                  temperature: float = 0.0) -> Iterator[dict]:
    """The app's `stream_tokens` endpoint: a dict per message ({seq, token_ids, text, events: the
    engine events it carries, t_accepted, t_engine, t_sent}), then the final dict ({finished, finish_reason, all_token_ids, all_text} or {error}).
    Leaving the loop early cancels the request, which frees its place in the engine."""
    job = client.submit(prompt, method, max_tokens, chat, temperature, api_name="/stream_tokens")
    try:
        yield from stream_job(job)
    finally:
        if not job.done():
            job.cancel()
