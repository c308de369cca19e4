"""Embeddings of benchmark texts, computed once and kept on disk.

Embedding 100k questions with the ONNX MiniLM takes tens of minutes on two busy cores, and a
benchmark is re-run many times on the same texts. `cached_embeddings` embeds PART_SIZE texts at a
time and saves each part as a .npy file under `cache_root() / key`, its name carrying a digest of
the part's texts; a later run loads every part whose texts are unchanged and embeds only the rest
(an interrupted run resumes where it stopped). `key` names what the texts came from and the
embedder (e.g. the input files' hash), so a new model or new inputs never read stale vectors.

Location: $KVGATE_BENCH_CACHE, else $XDG_CACHE_HOME/kvgate/bench, else ~/.cache/kvgate/bench.
Files are written to a temporary name and renamed, so a killed run leaves no half part.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

PART_SIZE = 4096


class _Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class CacheReport:
    """What one call did: parts loaded from disk, parts embedded, seconds spent embedding."""

    directory: str
    parts_loaded: int
    parts_embedded: int
    embed_s: float

    @property
    def state(self) -> str:
        """'hit' (nothing embedded), 'miss' (nothing loaded) or 'partial'."""
        if not self.parts_embedded:
            return "hit"
        return "miss" if not self.parts_loaded else "partial"


def cache_root() -> Path:
    """Where benchmark embeddings live (see the module docstring)."""
    if os.environ.get("KVGATE_BENCH_CACHE"):
        return Path(os.environ["KVGATE_BENCH_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kvgate" / "bench"


def cache_key(source_digest: str, embedder_name: str) -> str:
    """A directory name for texts from `source_digest` embedded by `embedder_name`."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', embedder_name)}-{source_digest[:20]}"


def cached_embeddings(
    texts: Sequence[str], embedder: _Embedder, key: str, progress: Callable[[str], None] = lambda _m: None
) -> tuple[np.ndarray, CacheReport]:
    """Unit vectors (float32, len(texts) x dim) of `texts`, from the cache where possible.

    Invariant: row i is embedder.embed([texts[i]]) as computed by some run with the same key
    (parts are matched by a digest of their exact texts), renormalised to unit length.
    """
    directory = cache_root() / key
    directory.mkdir(parents=True, exist_ok=True)
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    loaded = embedded = embedded_texts = 0
    embed_s = 0.0
    started = time.perf_counter()
    n_parts = (len(texts) + PART_SIZE - 1) // PART_SIZE
    for part in range(n_parts):
        lo, hi = part * PART_SIZE, min(len(texts), (part + 1) * PART_SIZE)
        path = directory / f"part-{part:05d}-{_digest(texts[lo:hi])}.npy"
        vecs = _load(path, hi - lo, embedder.dim)
        if vecs is None:
            t0 = time.perf_counter()
            vecs = np.asarray(embedder.embed(list(texts[lo:hi])), dtype=np.float32)
            embed_s += time.perf_counter() - t0
            _save(path, vecs)
            embedded += 1
            embedded_texts += hi - lo
        else:
            loaded += 1
        out[lo:hi] = vecs
        if embedded:
            rate = embedded_texts / max(embed_s, 1e-9)
            left = (len(texts) - hi) / rate if rate else 0.0
            progress(
                f"filler embeddings: {hi}/{len(texts)} ({rate:.0f} texts/s embedding, ~{left:.0f}s left; {loaded} part(s) from {directory})"
            )
    if not embedded and texts:
        progress(f"filler embeddings: {len(texts)} loaded from {directory} in {time.perf_counter() - started:.1f}s")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    out /= np.where(norms > 0, norms, 1.0)
    return out, CacheReport(str(directory), loaded, embedded, round(embed_s, 2))


def _digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _load(path: Path, rows: int, dim: int) -> np.ndarray | None:
    """The part's vectors, or None when absent or not of the expected shape."""
    try:
        vecs = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return vecs if vecs.shape == (rows, dim) and vecs.dtype == np.float32 else None


def _save(path: Path, vecs: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        np.save(fh, vecs, allow_pickle=False)
    os.replace(tmp, path)
