"""Embedder on sentence-transformers (torch): the reference implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvgate.index.responses.embedder_model import model_identity


class SentenceTransformerEmbedder:
    """sentence-transformers model loaded from a local directory (no hub access)."""

    def __init__(self, model_path: Path) -> None:
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
        self.name = f"st:{Path(model_path).name}"
        self.identity = model_identity(model_path)
        dim_of = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_of())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = self._model.encode(
            list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.ascontiguousarray(out, dtype=np.float32)
