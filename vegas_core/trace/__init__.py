"""Traces of generation runs: the versioned schema, compact position sets, safe loading, metrics and
exports. The engine writes a `Trace`; the app, visualizations and exports only read one.

    schema.py     Trace, RequestTrace, Iteration, DraftToken, ModelInfo, RunConfig (pydantic v2)
    selection.py  Selection: the attended set of a draft phase
    positions.py  encode_positions / decode_positions: sorted position sets as compact text
    aggregates.py vLLM-named metrics (mean acceptance length, per-position acceptance, tokens/s)
    io.py         save_trace, load_trace, load_trace_bytes (size, depth, NaN and version checks)
    export.py     Chrome/Perfetto timeline, flat iterations table, Parquet, CSV
"""
from .io import load_trace, load_trace_bytes, save_trace
from .positions import decode_positions, encode_positions
from .schema import (TRACE_SCHEMA_VERSION, DraftToken, Iteration, ModelInfo, RequestTrace, RunConfig,
                     Trace)
from .selection import Selection

__all__ = [
    "TRACE_SCHEMA_VERSION", "DraftToken", "Iteration", "ModelInfo", "RequestTrace", "RunConfig",
    "Selection", "Trace", "decode_positions", "encode_positions", "load_trace", "load_trace_bytes",
    "save_trace",
]
