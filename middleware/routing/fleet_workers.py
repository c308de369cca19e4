"""The replica lists of `kvgate serve --workers N`, shared: a replica the admin API adds or removes
in any worker is added or removed in every worker.

Each worker routes with its own Router (its replica list, prefix index, KV-event subscribers), and
an admin call reaches the one worker its connection landed on. So a change is first written to one
file all workers read (`fleet.json` in the workers' directory, beside the load table), under an
exclusive flock so that two workers' changes never interleave; then each worker applies the
difference between that file and its routers (middleware/server/fleet_sync.py): the worker that
took the call before it answers, the others when its hub tells them (a nudge on the ipc sockets
the routing records use) or, a nudge being lossy, at their next look at the file (WorkerHub, every
CHECK_S). A worker started again reads the file before it serves.

Load of an added replica: the shared load table is laid out at start-up with SPARE_SLOTS columns
per route beyond the configured replicas. The file gives each added name one of its route's spare
columns, kept for that name while the supervisor runs: a name removed and added again gets its
column back, whose counts the requests still in flight on it settle. With a route's spares used
up, a further add is refused (409): put the replica in the YAML and restart.

Invariants: the file is only ever replaced whole (os.replace), so a reader sees one version or the
next; `replicas` is pure over the file and the configured list; a route never loses its last
replica through it; a spare column is given to one name only.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from kvgate.middleware.config import ReplicaConfig

FLEET_FILE = "fleet.json"
LOCK_FILE = "fleet.lock"
SPARE_SLOTS = 8  # load-table columns per route for replicas added at run time
CHECK_S = 1.0  # how often a worker looks at the file without a nudge


class FleetConflict(ValueError):
    """The change contradicts the shared lists (a name already there, no spare column left)."""


def spare_key(route: str, i: int) -> str:
    """The load-table key of a route's i-th spare column (never a replica's: NUL-prefixed)."""
    return f"{route}\x00\x00spare{i}"


def apply_changes(configured: Sequence[ReplicaConfig], changes: dict[str, Any]) -> list[ReplicaConfig]:
    """A route's replicas: the configured ones, less those removed, plus those added, in order
    (pure)."""
    out = {r.name: r for r in configured}
    for name, change in changes.items():
        if change.get("removed"):
            out.pop(name, None)
        else:
            out.pop(name, None)
            out[name] = ReplicaConfig.model_validate(change["config"])
    return list(out.values())


class SharedFleet:
    """The workers' shared record of run-time replica changes (see the module docstring)."""

    def __init__(self, directory: str, slots: dict[str, int]) -> None:
        self.path = Path(directory) / FLEET_FILE
        self.lock_path = Path(directory) / LOCK_FILE
        self.slots = slots  # the load table's columns (WorkersLayout.slots), spares included

    def token(self) -> int:
        """Changes when the file does (its mtime in ns; 0 while there is none): cheap to poll."""
        try:
            return os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return 0

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"version": 0, "routes": {}}

    def replicas(self, route: str, configured: Sequence[ReplicaConfig]) -> list[ReplicaConfig]:
        """`route`'s replicas now: the configured ones with every change applied."""
        return apply_changes(configured, self.read()["routes"].get(route, {}).get("changes", {}))

    def slot(self, route: str, name: str) -> int | None:
        """The load-table column counting `name` on `route` (None: it has none)."""
        configured = self.slots.get(f"{route}\x00{name}")
        if configured is not None:
            return configured
        return self.read()["routes"].get(route, {}).get("slots", {}).get(name)

    def add(self, route: str, cfg: ReplicaConfig, configured: Sequence[ReplicaConfig]) -> None:
        """Record `cfg` as added to `route`. FleetConflict: the name is on the route already, or
        no spare column is left for it."""
        with self._locked() as data:
            entry = data["routes"].setdefault(route, {"changes": {}, "slots": {}})
            if cfg.name in {r.name for r in apply_changes(configured, entry["changes"])}:
                raise FleetConflict(f"replica {cfg.name!r} is on route {route!r} already")
            if f"{route}\x00{cfg.name}" not in self.slots and cfg.name not in entry["slots"]:
                used = set(entry["slots"].values())
                free = [
                    self.slots[k]
                    for i in range(SPARE_SLOTS)
                    if (k := spare_key(route, i)) in self.slots and self.slots[k] not in used
                ]
                if not free:
                    raise FleetConflict(
                        f"route {route!r} has no room left for replicas added at run time under "
                        f"--workers ({SPARE_SLOTS} per route): add it to routes[].replicas in the "
                        "YAML and restart"
                    )
                entry["slots"][cfg.name] = free[0]
            entry["changes"].pop(cfg.name, None)
            entry["changes"][cfg.name] = {"config": cfg.model_dump(mode="json")}

    def remove(self, route: str, name: str, configured: Sequence[ReplicaConfig]) -> None:
        """Record `name` as removed from `route`. KeyError: not on it; FleetConflict: its last one."""
        with self._locked() as data:
            entry = data["routes"].setdefault(route, {"changes": {}, "slots": {}})
            names = [r.name for r in apply_changes(configured, entry["changes"])]
            if name not in names:
                raise KeyError(name)
            if len(names) == 1:
                raise FleetConflict(f"{name!r} is the last replica of route {route!r}; add another one first")
            entry["changes"].pop(name, None)
            entry["changes"][name] = {"removed": True}

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The file's content to change, written back (whole, atomically) if the block succeeds."""
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = self.read()
                yield data
                data["version"] = data.get("version", 0) + 1
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data))
                os.replace(tmp, self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
