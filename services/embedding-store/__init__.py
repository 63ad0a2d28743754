"""Sparse parameter server: dynamic multi-table embedding store (PaddleRec / OneEmbedding)."""
