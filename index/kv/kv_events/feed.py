"""EventFeed: one publisher's stream of batches into an EventApplier, and what it counts.

The transport hands over ``(seq, payload)`` per message; the feed puts batches in order
(sequence numbers), decodes them, applies them and measures how late they arrive. It knows no
socket, so it is driven the same way by ZMQ, by a test, or by a replay.

Resync. A lost batch may have carried BlockRemoved events (the index would keep blocks the
engine dropped: routing to a cache that is not there) or BlockStored events (later chains then
hang off unknown parents). Rather than drift silently, the feed resyncs: on a sequence gap, and
on a message it cannot decode (equally lost), it drops everything the index holds for that
replica (`EventApplier.reset`) before applying what follows, and counts `resyncs`. The view then
restarts from the events that follow: new chains from their root block, and blocks the engine
stores or re-stores from then on. Until then the replica looks cold to the router, which costs
prefills, never wrong answers. Other replicas' views are untouched.
A publisher counting from 0 again (`restart`) is a restarted engine, whose cache is empty: the
same reset, counted as a restart.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Literal

from kvgate.index.kv.kv_events.applier import EventApplier
from kvgate.index.kv.kv_events.codec import decode_batch

log = logging.getLogger(__name__)

Order = Literal["next", "gap", "duplicate", "restart"]
# Upper bounds (seconds) of the lag histogram: a same-host publisher lands in the first few.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def order_of(last: int | None, seq: int | None) -> Order:
    """Where batch `seq` falls after `last`, the previous sequence number seen.

    'next': no number (a two-frame message), the first number seen, or last + 1;
    'gap': last + 1 .. seq - 1 were missed (ZMQ PUB drops for slow or late subscribers), so the
    replica's view is resynced (see the module docstring);
    'duplicate': seq == last, a resend, to be skipped;
    'restart': seq < last, a new publisher counting from 0 again, i.e. a restarted engine, whose
    cache is empty.
    """
    if seq is None or last is None or seq == last + 1:
        return "next"
    if seq == last:
        return "duplicate"
    return "gap" if seq > last else "restart"


@dataclass(frozen=True)
class FeedStats:
    """A snapshot of one feed. Counters only grow; `last_*` describe the latest batch and
    `mapped_blocks` the present."""

    batches: int = 0  # batches applied
    events: int = 0  # events received in decoded batches
    decode_errors: int = 0  # messages dropped: not a batch (bad frames or payload)
    apply_errors: int = 0  # batches whose application raised
    gaps: int = 0  # times sequence numbers jumped ahead
    missed_batches: int = 0  # batches those jumps skipped
    duplicates: int = 0  # batches skipped as resends
    restarts: int = 0  # publishers seen counting from 0 again (replica blocks then cleared)
    resyncs: int = 0  # replica views dropped because a batch was lost (gap or undecodable message)
    last_seq: int | None = None
    last_lag_s: float | None = None  # applied-at minus the batch's ts, of the latest batch
    lag_sum_s: float = 0.0
    lag_buckets: tuple[tuple[float, int], ...] = ()  # (upper bound, cumulative count), +inf last
    # what the applier did with the events (EventApplier.stats())
    blocks_stored: int = 0
    blocks_removed: int = 0
    clears: int = 0
    wrong_block_size: int = 0
    unknown_parent: int = 0
    mapped_blocks: int = 0
    bound_evictions: int = 0  # blocks the index's per-replica bound evicted
    forgotten: int = 0  # engine hashes dropped at the applier's max_mapped

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cumulative(bounds: tuple[float, ...], counts: list[int]) -> tuple[tuple[float, int], ...]:
    """Per-bucket counts (one more than `bounds`: the overflow) as Prometheus's cumulative
    (le, count) pairs ending with (inf, total)."""
    out, running = [], 0
    for bound, n in zip((*bounds, float("inf")), counts):
        running += n
        out.append((bound, running))
    return tuple(out)


@dataclass(slots=True)
class _Tally:
    """The mutable counters behind FeedStats (guarded by EventFeed._lock)."""

    batches: int = 0
    events: int = 0
    decode_errors: int = 0
    apply_errors: int = 0
    gaps: int = 0
    missed_batches: int = 0
    duplicates: int = 0
    restarts: int = 0
    resyncs: int = 0
    last_seq: int | None = None
    last_lag_s: float | None = None
    lag_sum_s: float = 0.0


class EventFeed:
    """Orders, decodes and applies one publisher's batches; counts what happened.

    A batch repeating the last sequence number is skipped. A sequence number going backwards
    clears the replica's blocks before the batch is applied (see `order_of`); so does a gap, or
    a message that cannot be decoded (a resync: see the module docstring). Lag is measured
    after applying, against the publisher's clock: clock skew between hosts shifts it, and a
    negative value is recorded as 0.

    `receive` is called from one thread (the transport's); `stats` from any.
    """

    def __init__(
        self,
        applier: EventApplier,
        clock: Callable[[], float] = time.time,
        lag_buckets: tuple[float, ...] = LAG_BUCKETS,
        source: str = "",
    ) -> None:
        self.applier = applier
        self.source = source or applier.replica  # for log lines
        self._clock = clock
        self._bounds = tuple(lag_buckets)
        self._lock = threading.Lock()  # guards _tally and _lag_counts (stats() reads them elsewhere)
        self._tally = _Tally()
        self._lag_counts = [0] * (len(self._bounds) + 1)  # per bucket, the last one is overflow
        self._unknown_tags: set[str] = set()  # logged once each

    @property
    def replica(self) -> str:
        return self.applier.replica

    @property
    def last_seq(self) -> int | None:
        """The sequence number of the latest batch taken (None before the first)."""
        with self._lock:
            return self._tally.last_seq

    @property
    def batches(self) -> int:
        """Batches applied so far (stats().batches without the snapshot: read per request)."""
        with self._lock:
            return self._tally.batches

    def receive(self, seq: int | None, payload: bytes) -> None:
        """One message: batch number `seq` (None when the publisher sends none) and its bytes."""
        with self._lock:
            t = self._tally
            order = order_of(t.last_seq, seq)
            if order == "duplicate":
                t.duplicates += 1
                return
            missed = 0
            if order == "gap":
                missed = seq - t.last_seq - 1  # type: ignore[operator]
                t.gaps += 1
                t.missed_batches += missed
            elif order == "restart":
                t.restarts += 1
            if seq is not None:
                t.last_seq = seq
        if order == "gap":
            self._resync(f"{missed} batch(es) missed before batch {seq}")
        try:
            batch = decode_batch(payload, self._unknown_tags)
        except ValueError as e:
            self.malformed(f"bad KV event batch: {e}", resync=order != "gap")  # one loss, one resync
            return
        with self._lock:
            self._tally.events += len(batch.events)
        try:
            if order == "restart":
                self.applier.reset()
            self.applier.apply_batch(batch)
        except Exception:  # keep consuming; one bad batch must not stop the feed
            with self._lock:
                self._tally.apply_errors += 1
            log.exception("applying KV events from %s failed", self.source)
            return
        lag = max(0.0, self._clock() - batch.ts)
        with self._lock:
            self._lag_counts[bisect.bisect_left(self._bounds, lag)] += 1
            self._tally.batches += 1
            self._tally.lag_sum_s += lag
            self._tally.last_lag_s = lag

    def malformed(self, why: str, resync: bool = True) -> None:
        """Count a message that is not a batch (wrong frame count, undecodable payload): its
        events are lost, so the replica's view is resynced (unless the caller just did)."""
        with self._lock:
            self._tally.decode_errors += 1
        log.warning("KV events from %s: %s", self.source, why)
        if resync:
            self._resync("an undecodable message")

    def _resync(self, cause: str) -> None:
        """Drop the replica's view (events were lost); the events that follow rebuild it."""
        with self._lock:
            self._tally.resyncs += 1
        log.warning(
            "KV events from %s: %s, resyncing: the replica's blocks are dropped from the prefix index until it stores them again",
            self.source,
            cause,
        )
        try:
            self.applier.reset()
        except Exception:
            with self._lock:
                self._tally.apply_errors += 1
            log.exception("resetting the view of %s failed", self.source)

    def stats(self) -> FeedStats:
        applied = self.applier.stats()
        with self._lock:
            return FeedStats(
                **asdict(self._tally),
                lag_buckets=cumulative(self._bounds, self._lag_counts),
                blocks_stored=applied["stored"],
                blocks_removed=applied["removed"],
                clears=applied["cleared"],
                wrong_block_size=applied["wrong_block_size"],
                unknown_parent=applied["unknown_parent"],
                mapped_blocks=applied["mapped"],
                bound_evictions=applied["bound_evictions"],
                forgotten=applied["forgotten"],
            )
