"""Replaying an uploaded trace, as a hostile but fair user would: any file under the upload limit
replays (or is refused with one message) within 5 s and 300 MB; uploads count against a byte budget
shared by sessions; a Studio's temporary directory goes with it. Files are written here (no server)."""
from __future__ import annotations

import gc
import json
import random
import time
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from tests.vegas_core.trace.conftest import build_trace
from vegas_core.trace import encode_positions
from vegas_core.trace.fields import MAX_CONTEXT, MAX_SELECTION_CELLS
from vegas_studio_app.session import SessionStore
from vegas_studio_app.studio import MAX_UPLOAD_BYTES, Studio

SECONDS, EXTRA_BYTES = 5.0, 300 * 1024 * 1024
pytestmark = pytest.mark.filterwarnings("ignore:Could not load this trace")   # gr.Warning outside a request


def _iteration(i, position, drafts=0, selection=None):
    d = [{"token_id": 5, "draft_prob": 0.5, "target_prob": 0.5, "accepted": True}] * drafts
    return {"index": i, "step": i, "position": position, "drafts": d, "num_accepted": drafts,
            "emitted": [5] * drafts + [6], "final_token": 6, "final_kind": "bonus" if drafts else "decode",
            "selection": selection}


def _trace(layers: int, requests: list, **extra) -> dict:
    return {"schema_version": 1, "created": "2025-01-01T00:00:00+00:00",
            "model": {"name": "m", "arch": "llama", "num_layers": layers, "num_heads": 1, "num_kv_heads": 1,
                      "head_dim": 64, "vocab_size": 49152, "dtype": "float32", "device": "cpu"},
            "config": {"method": "vegas", "gamma": 16, "sparsity": 0.07, "max_tokens": MAX_CONTEXT},
            "requests": requests, **extra}


def dense_drafts(limit: int) -> dict:
    """Iterations of 16 drafts each: the most pydantic objects (and stream pieces) a byte buys."""
    n = limit // 1300
    return _trace(30, [{"request_id": "r", "prompt_token_ids": [7] * 10, "output_token_ids": [5] * (17 * n),
                        "finish_reason": "length", "iterations": [_iteration(i, 10 + 17 * i, 16) for i in range(n)]}])


def widest_selection(limit: int) -> dict:
    """The largest layers x positions selection the schema allows, every 7th position selected."""
    n = MAX_CONTEXT - 2
    layers = MAX_SELECTION_CELLS // n
    sel = {"granularity": "layer", "base": n, "budget": n // 7,
           "layers": [encode_positions(np.arange(0, n, 7))] * layers}
    return _trace(layers, [{"request_id": "r", "prompt_token_ids": [7] * n, "output_token_ids": [6, 6],
                            "finish_reason": "length", "iterations": [_iteration(0, n, 1, sel)]}])


def _sent_bytes(outputs) -> int:
    """What Gradio would send: figures as Plotly JSON, everything else as text."""
    return sum(len(v.to_json()) if hasattr(v, "to_json") else len(str(v)) for v in outputs)


def _replay(studio, path, session="s"):
    request = SimpleNamespace(session_hash=session)
    status = studio.replay(str(path), request)[0]
    views = studio.refresh_views(request)
    return status, _sent_bytes(views)


@pytest.mark.parametrize("build", [dense_drafts, widest_selection])
def test_a_file_at_the_upload_limit_replays_within_5_s_and_300_mb(tmp_path, build):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(build(MAX_UPLOAD_BYTES), separators=(",", ":")))
    assert path.stat().st_size <= MAX_UPLOAD_BYTES
    start = time.perf_counter()
    status, _ = _replay(Studio(None, export_root=str(tmp_path)), path)
    seconds = time.perf_counter() - start
    assert status.startswith("Replaying") and seconds < SECONDS, (status, seconds)
    gc.collect()
    tracemalloc.start()
    try:
        studio = Studio(None, export_root=str(tmp_path))
        status, sent = _replay(studio, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status.startswith("Replaying") and peak < EXTRA_BYTES and sent < 64 << 20, (peak, sent)


def test_uploads_share_a_byte_budget(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(build_trace().model_dump_json())
    studio = Studio(None, export_root=str(tmp_path))
    per_upload = 20 * path.stat().st_size
    studio.store.upload_budget_bytes = 2 * per_upload
    for session in ("a", "b", "c"):
        assert _replay(studio, path, session)[0].startswith("Replaying")
    assert studio.store.upload_bytes == 2 * per_upload
    assert studio.store.get("a").trace is None                  # the oldest upload was dropped
    assert studio.store.get("c").trace is not None


def test_the_session_store_evicts_by_bytes_oldest_first():
    store = SessionStore(upload_budget_bytes=120)
    a, b, c = store.get("a"), store.get("b"), store.get("c")
    store.charge_upload(a, 60)
    store.charge_upload(c, 30)
    store.get("a")                                              # a is now the most recent
    store.charge_upload(b, 50)                                  # 140 > 120: c goes, a stays
    assert store.upload_bytes == 110 and len(store) == 2
    assert store.get("a") is a and store.get("b") is b and store.get("c") is not c


def test_a_studio_removes_its_temporary_directory():
    studio = Studio(None)
    root = studio.export_root
    assert root.is_dir()
    del studio
    gc.collect()
    assert not root.exists()


# --- fuzz -----------------------------------------------------------------------------------------

EXTREMES = [10**7, -1, 2**63, 2**64, 1e308, -0.5, "x" * 3000, "", [], {}, None, True, [[[[1]]]], 200000,
            49151, 49152]


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def test_fuzzed_traces_replay_or_are_refused_in_one_message(tmp_path):
    base = json.loads(build_trace().model_dump_json())
    leaves = list(_leaves(base))
    rng = random.Random(37)
    studio = Studio(None, export_root=str(tmp_path))
    outcomes = set()
    for i in range(60):
        obj = json.loads(json.dumps(base))
        for path in rng.sample(leaves, rng.randint(1, 3)):
            target = obj
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = rng.choice(EXTREMES)
        text = json.dumps(obj)
        if i % 10 == 0:     # an integer past Python's digit limit
            text = text.replace('"max_tokens": 11', '"max_tokens": ' + "7" * 5000)
        path = tmp_path / f"f{i}.json"
        path.write_text(text)
        start = time.perf_counter()
        status, sent = _replay(studio, path)
        assert time.perf_counter() - start < 2.0 and sent < 8 << 20
        assert status.startswith(("Replaying", "⚠ Could not load this trace: ")) and "\n" not in status, status
        outcomes.add(status[:9])
    assert outcomes == {"Replaying", "⚠ Could n"}
