"""What loading a token from a KV tier costs, in prefill tokens: measured, per route.

cache_aware's unit of time is one prefill token. A token the engine loads from a tier instead of
computing costs λ prefill tokens, λ = (seconds per loaded token) / (seconds per prefilled token),
which depends on the tier's bandwidth against the engine's prefill rate: on this machine's CPU
engines a load is a small fraction of a prefill; on a GPU a slow tier can cost more than the
prefill it saves. The router measures it: every first token gives a sample

    ttft ≈ a + b · (prefill tokens queued ahead + its own prefill tokens) + c · (tokens it loads)

and a least-squares fit over the last WINDOW samples gives λ = c / b, clamped to [0, 1] (a load
never counts as worse than the prefill it replaces: the connector loads only what it holds, and
vLLM would compute the rest anyway). Until MIN_SAMPLES samples with loads and as many without
have arrived, λ is 1: a tier counts as no better than prefilling, so routing behaves as it did
without tiers until the measurements say otherwise.
"""

from __future__ import annotations

import threading
from collections import deque

WINDOW = 256
MIN_SAMPLES = 4


def fit_lambda(samples: list[tuple[float, float, float]]) -> float | None:
    """λ from (prefill tokens, loaded tokens, seconds) samples by least squares with an intercept
    (pure); None when the data cannot separate the two slopes or b is not positive."""
    n = len(samples)
    if n < 3:
        return None
    sx = [s[0] for s in samples]
    sl = [s[1] for s in samples]
    sy = [s[2] for s in samples]
    mx, ml, my = sum(sx) / n, sum(sl) / n, sum(sy) / n
    cxx = sum((x - mx) ** 2 for x in sx)
    cll = sum((v - ml) ** 2 for v in sl)
    cxl = sum((x - mx) * (v - ml) for x, v in zip(sx, sl))
    cxy = sum((x - mx) * (y - my) for x, y in zip(sx, sy))
    cly = sum((v - ml) * (y - my) for v, y in zip(sl, sy))
    det = cxx * cll - cxl * cxl
    if det <= 1e-9 * max(1.0, cxx * cll):
        return None
    b = (cll * cxy - cxl * cly) / det
    c = (cxx * cly - cxl * cxy) / det
    if b <= 0:
        return None
    return min(1.0, max(0.0, c / b))


class LoadCost:
    """The route's λ, refitted as samples arrive (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)
        self.value = 1.0

    def observe(self, prefill_tokens: float, loaded_tokens: float, seconds: float) -> None:
        with self._lock:
            self._samples.append((prefill_tokens, loaded_tokens, seconds))
            with_loads = sum(1 for s in self._samples if s[1] > 0)
            if with_loads < MIN_SAMPLES or len(self._samples) - with_loads < MIN_SAMPLES:
                return
            fitted = fit_lambda(list(self._samples))
            if fitted is not None:
                self.value = fitted

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {
                "load_cost": self.value,
                "samples": len(self._samples),
                "samples_with_loads": sum(1 for s in self._samples if s[1] > 0),
            }
