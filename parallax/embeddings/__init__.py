"""Embedding tables whose rows appear as ids do (docs/dynamic_embeddings.md)."""
from parallax.embeddings.table import DynamicEmbedding, dynamic_embedding

__all__ = ["DynamicEmbedding", "dynamic_embedding"]
