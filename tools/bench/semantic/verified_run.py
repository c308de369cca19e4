"""The pairs run with the verifier on (kvgate.tools.bench.verified), at the route's operating point or the
defaults of a route with `verifier: true`; or why it was skipped."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from kvgate.tools.bench.semantic.report import progress
from kvgate.tools.tuning.pairs import Pair


def verified_result(
    index: Any,
    scope: str,
    embedder: Any,
    pairs: Sequence[Pair],
    v2: np.ndarray,
    threshold: float,
    settings: Any,
    enabled: bool,
    verifier_path: str | None,
    latency_texts: list[str],
    warmup: list[str],
) -> dict[str, Any]:
    """The JSON's `with_verifier` object: the same lookups on the filled `index` with the verifier,
    or {"skipped": reason} (--no-verifier, or no trained verifier)."""
    from kvgate.index.responses.verifier import VerifierMissing, load_verifier
    from kvgate.middleware.cache.verification import SemanticSettings
    from kvgate.middleware.config import SemanticConfig
    from kvgate.tools.bench.verified import run_verified

    if not enabled:
        return {"skipped": "--no-verifier"}
    if settings is None or not settings.verifies:  # the defaults of a route with `verifier: true`
        defaults = SemanticConfig()
        settings = SemanticSettings(threshold, defaults.verifier_threshold, defaults.candidates, "config defaults")
    try:
        verifier = load_verifier(verifier_path)
    except VerifierMissing as exc:
        return {"skipped": str(exc)}
    progress(
        f"with the verifier {verifier.name}: cosine >= {settings.threshold}, "
        f"verifier >= {settings.verifier_threshold}, top-{settings.candidates}"
    )
    return run_verified(
        index,
        scope,
        embedder,
        verifier,
        [p.question1 for p in pairs],
        [p.question2 for p in pairs],
        [p.duplicate for p in pairs],
        v2,
        settings,
        latency_texts,
        warmup,
        progress,
    )
