"""The tuned operating point of a route: what `kvgate tune` writes and the pipeline reads.

File: `<cache_dir>/tuned/<route>.json`. Written atomically (temp file + rename), so a reader sees
the old point or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1


@dataclass(frozen=True)
class OperatingPoint:
    """Thresholds that met `target_precision` on the calibration pairs, and what they gave there."""

    route: str
    target_precision: float
    cosine_threshold: float
    verifier: bool
    verifier_threshold: float | None  # None when verifier is False
    candidates: int  # top-k entries the verifier reads per lookup
    expected_precision: float
    expected_recall: float
    calibration: dict[str, Any] = field(default_factory=dict)  # pairs file, counts, hits, interval
    holdout: dict[str, Any] = field(default_factory=dict)  # the same point on the held-out part
    verifier_model: dict[str, Any] = field(default_factory=dict)  # name, dir, fingerprint
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OperatingPoint":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def operating_point_path(cache_dir: str | Path, route: str) -> Path:
    """Where the tuned point of `route` lives under a config's cache_dir."""
    return Path(cache_dir) / "tuned" / f"{route}.json"


def write_operating_point(cache_dir: str | Path, point: OperatingPoint) -> Path:
    path = operating_point_path(cache_dir, point.route)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(point.to_json())
    os.replace(tmp, path)
    return path


def read_operating_point(cache_dir: str | Path, route: str) -> OperatingPoint | None:
    """The route's tuned point, or None when there is none. A damaged file raises ValueError."""
    path = operating_point_path(cache_dir, route)
    if not path.is_file():
        return None
    try:
        return OperatingPoint.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a valid operating point ({exc}); run `kvgate tune` again") from None
