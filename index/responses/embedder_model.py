"""A model directory's identity and manifest: which vectors it makes, whatever backend runs it.

Both embedder implementations and the factory (embedder.py) read these; kept apart from the
factory so the implementations it loads do not import it back.
"""

from __future__ import annotations

from pathlib import Path

MANIFEST = "kvgate_embedder.json"  # written by `kvgate tune --embedder` into the model dir it makes
EXPORTED_ONNX = "model.onnx"  # a model dir that holds this runs without torch (`kvgate prepare --onnx-dir`)
# the fix, wherever an embedder is missing: the extra that exports one, or a dir exported elsewhere
EMBEDDER_EXTRA = (
    "pip install 'kvgate[embedder]', then `kvgate prepare`; or set embedder.model_path to a dir "
    "that `kvgate prepare --onnx-dir DIR` wrote where torch is installed"
)


class EmbedderMissing(RuntimeError):
    """The embedder's model, or the torch it is exported with, is not installed; the message says
    which, and how to install it. The core install has neither: torch is an extra."""


def model_identity(model_path: str | Path) -> str:
    """Which vectors a model dir makes, independent of the backend that runs it (ONNX and torch
    give the same vectors): a tuned dir's manifest identity (a digest of its weights), else the
    dir's name and weight size. A cache records it beside its vectors (mixed vectors are refused)."""
    path = Path(model_path)
    identity = (read_manifest(path) or {}).get("identity")
    if identity:
        return str(identity)
    weights = path / "model.safetensors"
    return f"{path.name}:{weights.stat().st_size if weights.exists() else 0}"


def read_manifest(model_path: str | Path | None) -> dict | None:
    """The manifest `kvgate tune --embedder` wrote into a model dir; None for any other dir."""
    import json

    if not model_path:
        return None
    try:
        found = json.loads((Path(model_path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
