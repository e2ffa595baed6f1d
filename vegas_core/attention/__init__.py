"""Attention backends. The model calls `backend.forward(layer, q, k, v, pool, meta)` and knows nothing
else; the metadata is built once per step by the model runner and shared by every layer, so dense,
sparse (draft) and collecting (verify) attention swap without touching the model or the scheduler."""
from .metadata import AttentionMetadata, DecodeBatch, LogitCollector, SeqAttention, SparseView
from .reference import ReferenceBackend

__all__ = ["AttentionMetadata", "DecodeBatch", "LogitCollector", "SeqAttention", "SparseView", "ReferenceBackend"]
