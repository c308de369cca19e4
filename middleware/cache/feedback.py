"""Feedback on a served answer: `correct=false` removes what was served and tightens around it.

- semantic hit judged wrong: the served entry is deleted, and every entry of its scope at least as
  close to it as the wrong query was must from now on clear that similarity plus a margin
  (kvgate.index.responses.tighten; later entries there inherit the floor);
- exact hit or miss judged wrong: the entry served or stored is deleted (no neighbourhood: the
  embedding was not at fault);
- correct=true: counted, nothing changes (floors are never relaxed by praise).

Only the tenant that made the request can judge it; to anyone else the id does not exist.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvgate.index.responses.semantic import SemanticIndex
from kvgate.middleware.cache.request_log import RequestLog
from kvgate.middleware.errors import RequestNotFound
from kvgate.middleware.telemetry.metrics import Metrics


@dataclass(frozen=True)
class FeedbackOutcome:
    """What feedback did. `removed`: the entry was deleted now; `tightened`: entries whose floor rose."""

    request_id: str
    correct: bool
    tier: str
    route: str
    removed: bool = False
    tightened: int = 0

    def to_json(self) -> dict[str, object]:
        return {"object": "cache.feedback", **asdict(self)}


def give_feedback(
    index: SemanticIndex,
    log: RequestLog,
    metrics: Metrics,
    request_id: str,
    correct: bool,
    tenant: str,
    mark_ttl: float | None = None,
) -> FeedbackOutcome:
    """Apply one verdict. Raises RequestNotFound for unknown, expired or other tenants' ids.

    Idempotent: a second `false` on the same id finds the entry gone and changes nothing more."""
    record = log.get(request_id)
    if record is None or record.tenant != tenant:
        raise RequestNotFound(
            f"no request {request_id!r} to give feedback on (unknown, expired, or not yours)", param="request_id"
        )
    metrics.feedback.labels(record.route, record.tier, "correct" if correct else "wrong").inc()
    outcome = FeedbackOutcome(request_id, correct, record.tier, record.route)
    if correct or record.entry_id is None:
        return outcome
    # read the vector before deleting: it is the centre of the region to tighten
    center = index.vector(record.entry_id) if record.tier == "semantic" else None
    removed = index.delete(record.entry_id)
    tightened = 0
    if center is not None and record.similarity is not None:
        tightened = index.tighten(record.scope, center, record.similarity, ttl=mark_ttl, tenant=tenant)
    if removed:
        metrics.feedback_removed.labels(record.route).inc()
    metrics.feedback_tightened.labels(record.route).inc(tightened)
    return FeedbackOutcome(request_id, correct, record.tier, record.route, removed, tightened)
