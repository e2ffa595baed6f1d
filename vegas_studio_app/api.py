"""Typed entry points for `gr.api` (Gradio derives the endpoint schema from these annotations, so this
module deliberately does not use `from __future__ import annotations`)."""
import gradio as gr

from vegas_core.engine_core import STEP_LOG_STEPS


def make_api(studio):
    def stream_tokens(prompt: str, method: str = "vanilla", max_tokens: int = 16, chat: bool = True,
                      temperature: float = 0.0, request: gr.Request = None) -> dict:
        """Stream one request: a dict per message ({seq, token_ids, text, events}: the engine events
        ready since the last message), then a final dict ({finished, finish_reason, all_token_ids,
        all_text}) or one with `error`."""
        yield from studio.api_stream(prompt, method, max_tokens, chat, temperature, request)

    def pool() -> dict:
        """KV pool occupancy: {state, num_free, num_blocks, active_requests, peak_active}."""
        return studio.pool()

    def engine_steps(last: int = STEP_LOG_STEPS) -> list:
        """The engine's last steps, oldest first (at most 512): {start, end: wall clock seconds;
        kind: prefill or decode; rows: requests in it; tokens: prefilled or emitted}, to place
        where a request's time went beside the times `stream_tokens` reports."""
        if not 1 <= last <= STEP_LOG_STEPS:
            raise gr.Error(f"last: 1 to {STEP_LOG_STEPS} steps (the engine keeps the last {STEP_LOG_STEPS}), "
                           f"not {last}")
        return studio.pool(int(last)).get("steps", [])

    return stream_tokens, pool, engine_steps
