"""Self-speculative decoding: drafting policies, selection of the KV entries a draft attends to,
and the draft -> verify -> accept iteration."""
from .params import GRANULARITIES, METHODS, SpecParams

__all__ = ["GRANULARITIES", "METHODS", "SpecParams"]
