"""The attended set of one draft phase, stored compactly (see positions.py for the encoding)."""
from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from .fields import MAX_CONTEXT, MAX_HEADS, MAX_LAYERS, Position
from .fields import StrictModel as _Strict
from .positions import decode_positions, encode_positions, looks_like_positions

Granularity = Literal["layer", "kv-head"]
# At most 9 bytes a position (a varint), base64: 12 characters for 9 bytes.
PositionsText = Annotated[str, Field(max_length=12 * MAX_CONTEXT)]


class Selection(_Strict):
    """The KV positions a draft phase attended to, besides every position >= `base` (written since the
    last verification, always attended). `layers[l]` (granularity "layer") or `heads[l][h]`
    (granularity "kv-head") are `encode_positions` strings; `budget` is the kept count per set."""
    granularity: Granularity
    base: Position
    budget: Position
    layers: list[PositionsText] | None = Field(default=None, max_length=MAX_LAYERS)
    heads: list[Annotated[list[PositionsText], Field(max_length=MAX_HEADS)]] | None = Field(
        default=None, max_length=MAX_LAYERS)

    @model_validator(mode="after")
    def _one_layout(self):
        if self.granularity == "layer":
            if self.layers is None or self.heads is not None:
                raise ValueError('granularity "layer" needs `layers` and no `heads`')
            sets = self.layers
        else:
            if self.heads is None or self.layers is not None:
                raise ValueError('granularity "kv-head" needs `heads` and no `layers`')
            if len({len(per_layer) for per_layer in self.heads}) > 1:
                raise ValueError("every layer of `heads` must hold the same number of KV heads")
            sets = [s for per_layer in self.heads for s in per_layer]
        bad = next((s for s in sets if not looks_like_positions(s)), None)
        if bad is not None:
            raise ValueError(f"positions string {bad[:24]!r} is not base64 text from encode_positions")
        return self

    @classmethod
    def from_positions(cls, granularity: Granularity, base: int, budget: int, sets) -> Selection:
        """Build from arrays: `sets[l]` (layer) or `sets[l][h]` (kv-head) are position arrays."""
        if granularity == "layer":
            return cls(granularity=granularity, base=base, budget=budget,
                       layers=[encode_positions(s) for s in sets])
        return cls(granularity=granularity, base=base, budget=budget,
                   heads=[[encode_positions(s) for s in per_layer] for per_layer in sets])

    @property
    def num_layers(self) -> int:
        return len(self.layers if self.layers is not None else self.heads)

    def positions(self, layer: int, head: int | None = None) -> np.ndarray:
        """Selected positions (sorted int64) of `layer`; for kv-head granularity `head` is required,
        for layer granularity it may be given and is ignored (all heads share the layer's set)."""
        if self.granularity == "layer":
            return decode_positions(self.layers[layer])
        if head is None:
            raise ValueError('granularity "kv-head" needs a head index')
        return decode_positions(self.heads[layer][head])
