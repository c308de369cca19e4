"""Which semantic candidate (if any) a route serves: thresholds resolved once, one pure choice rule.

`resolve` turns a route's config (a raw threshold, or a precision target plus the operating point
`kvgate tune` wrote) into `SemanticSettings` at start-up; `choose` applies them to the search
results of one lookup. kvgate.tools.tuning.calibrate scores operating points with the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kvgate.middleware.cache.operating_point import OperatingPoint, operating_point_path, read_operating_point
from kvgate.middleware.config import RouteConfig
from kvgate.middleware.errors import ConfigError


@dataclass(frozen=True)
class SemanticSettings:
    """What a route's semantic lookup does. verifier_threshold None = no verifier (top-1 by cosine)."""

    threshold: float
    verifier_threshold: float | None
    candidates: int
    source: str  # "config" or the operating point file
    max_error_rate: float | None = None  # set: the candidate is judged by kvgate.middleware.cache.trust_gate instead

    @property
    def verifies(self) -> bool:
        return self.verifier_threshold is not None


def to_verify(sims: Sequence[float], floors: Sequence[float], settings: SemanticSettings) -> list[int]:
    """Positions (search order, best cosine first) the verifier must read: within the first
    `candidates`, those whose similarity reaches their floor. Empty without a verifier.

    `floors[i]` is candidate i's cosine threshold: the route's, or higher where feedback raised it.
    """
    if not settings.verifies:
        return []
    return [i for i in range(min(len(sims), settings.candidates)) if sims[i] >= floors[i]]


def choose(
    sims: Sequence[float], floors: Sequence[float], scores: dict[int, float], settings: SemanticSettings
) -> int | None:
    """Position of the candidate to serve, or None for a miss.

    Invariant: the served candidate's similarity reaches its floor; without a verifier it is the
    top-1; with one, its verifier score (`scores[position]`, for the positions `to_verify` gave)
    reaches verifier_threshold and is the highest among the candidates that reach their floors.
    """
    if not sims:
        return None
    if not settings.verifies:
        return 0 if sims[0] >= floors[0] else None
    positions = to_verify(sims, floors, settings)
    if not positions:
        return None
    best = max(positions, key=lambda i: (scores.get(i, -1.0), sims[i]))
    return best if scores.get(best, -1.0) >= settings.verifier_threshold else None  # type: ignore[operator]


def resolve(route: RouteConfig, cache_dir: str | Path, position: int) -> SemanticSettings:
    """A route's settings; with `target_precision`, read from its tuned operating point.

    Raises ConfigError naming `routes.<position>.semantic.<field>` when the point is missing,
    unreadable, tuned for a lower target, or disagrees with an explicit `verifier` setting.
    """
    sem = route.semantic
    field = f"routes.{position}.semantic"
    if sem.max_error_rate is not None:  # thresholds are learned online (kvgate.middleware.cache.trust_gate)
        return SemanticSettings(0.0, None, 1, "config", sem.max_error_rate)
    if sem.target_precision is None:
        verify = bool(sem.verifier)
        return SemanticSettings(
            sem.threshold, sem.verifier_threshold if verify else None, sem.candidates if verify else 1, "config"
        )
    path = operating_point_path(cache_dir, route.name)
    how = f"run `kvgate tune --pairs FILE.csv --route {route.name} --config CONFIG` (make install does it for the examples)"
    try:
        point = read_operating_point(cache_dir, route.name)
    except ValueError as exc:
        raise ConfigError(f"{field}.target_precision: {exc}") from None
    if point is None:
        raise ConfigError(
            f"{field}.target_precision: {sem.target_precision} needs a tuned operating point, and {path} does not exist; {how}"
        )
    _check_point(point, route, field, how)
    return SemanticSettings(
        point.cosine_threshold, point.verifier_threshold if point.verifier else None, point.candidates, str(path)
    )


def _check_point(point: OperatingPoint, route: RouteConfig, field: str, how: str) -> None:
    sem = route.semantic
    if point.target_precision + 1e-9 < (sem.target_precision or 0.0):
        raise ConfigError(
            f"{field}.target_precision: {sem.target_precision}, but the tuned point was made for "
            f"{point.target_precision}; {how} with --target-precision {sem.target_precision}"
        )
    if sem.verifier is not None and sem.verifier != point.verifier:
        raise ConfigError(f"{field}.verifier: {sem.verifier}, but the tuned point has verifier {point.verifier}; {how}")
