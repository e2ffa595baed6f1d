"""Shared base model and constrained field types of the trace schema."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
# Recall is a float32 sum of softmax mass, so allow rounding just above 1.
Recall = Annotated[float, Field(ge=0.0, le=1.0 + 1e-3)]


class StrictModel(BaseModel):
    """Base of every trace model: unknown fields and NaN / infinity are rejected."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
