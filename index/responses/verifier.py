"""The Verifier protocol: a second opinion on a semantic hit, and the factory that loads one.

The vector search finds the cached question nearest to the new one; nearness is not sameness
("lose weight in a week" vs "... in a month"). A verifier reads both questions and says how likely
it is that the cached answer answers the new question. The pipeline serves a semantic hit only
when this score reaches the route's verifier threshold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

VERIFIER_DIR_NAME = "verifier-minilm-ce"


@runtime_checkable
class Verifier(Protocol):
    """Scores (cached question, new question) pairs."""

    name: str

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """A float32 array of len(pairs) probabilities in [0, 1] that each pair asks the same thing."""
        ...


def default_verifier_dir() -> Path:
    """Where `kvgate tune` puts the trained verifier: next to the ONNX embedder in the model cache."""
    from kvgate.index.storage.env import model_cache_dir

    return model_cache_dir() / VERIFIER_DIR_NAME


class VerifierMissing(FileNotFoundError):
    """No trained verifier at the expected place; the message says how to make one."""


def load_verifier(path: str | Path | None = None, threads: int | None = None) -> Verifier:
    """The cross-encoder verifier trained by `kvgate tune` (default: `default_verifier_dir()`)."""
    directory = Path(path) if path else default_verifier_dir()
    if not (directory / "model.onnx").is_file():
        raise VerifierMissing(
            f"no trained verifier at {directory}; run `kvgate tune --pairs FILE --route NAME` "
            "(make install does it with ../shared/data/qqp_dev.csv)"
        )
    from kvgate.index.responses.verifier_onnx import CrossEncoderVerifier

    return CrossEncoderVerifier(directory, threads=threads)
