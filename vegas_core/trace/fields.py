"""Shared base model and constrained field types of the trace schema."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Bounds on what a trace may declare: far past every model and run we know, and small enough that
# whatever is built from a trace (a layers x context matrix, a span per context position) stays
# within seconds and a few hundred MB. A trace is untrusted input: nothing in it is unbounded.
MAX_LAYERS = 256
MAX_HEADS = 256
MAX_HEAD_DIM = 1024
MAX_VOCAB = 1 << 22
MAX_CONTEXT = 1 << 17           # positions in one request (prompt + output)
MAX_SELECTION_CELLS = 1 << 24   # sets x positions of one iteration's selection (a rows x context matrix)
MAX_REQUESTS = 4096
MAX_TEXT_CHARS = 1 << 22
MAX_INT = (1 << 63) - 1         # counters (steps, indices): any int64

NonNegInt = Annotated[int, Field(ge=0, le=MAX_INT)]
Position = Annotated[int, Field(ge=0, le=MAX_CONTEXT)]
TokenId = Annotated[int, Field(ge=0, lt=MAX_VOCAB)]
NonNegFloat = Annotated[float, Field(ge=0.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
# Recall is a float32 sum of softmax mass, so allow rounding just above 1.
Recall = Annotated[float, Field(ge=0.0, le=1.0 + 1e-3)]


class StrictModel(BaseModel):
    """Base of every trace model: unknown fields and NaN / infinity are rejected."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
