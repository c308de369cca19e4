"""Which KV tiers each replica can load from, learned from the engines' own KV events.

kvgate's KV connector (engines/vllm/kv_connector) reports every chunk it stores or evicts as a
BlockStored / BlockRemoved whose `medium` names the tier: "memory" (that engine's RAM: private),
"disk:<id>" or "remote:<id>" (a directory or a Redis, the id derived from where it is, so every
engine reading the same one reports the same medium). The prefix index holds each tier as a
replica of its own, named here: "tier:memory@<replica>" for a private one, "tier:<medium>" for a
shared one. A replica can load from a tier once it has reported storing into it (its connector
writes through every tier it has); a shared tier's blocks, stored by any replica, are then
loadable by all of them.

`split` turns the index's match (engines and tiers alike) into what a plan needs: blocks each
replica's engine holds, and the leading blocks each replica could load from the best tier it
reads. Invariant: tier names never appear among the engine matches, and a replica's tier match
counts only tiers it has reported.
"""

from __future__ import annotations

import threading

from kvgate.index.kv.prefix import PrefixIndex

PREFIX = "tier:"
SHARED = ("disk:", "remote:")
PRIVATE = ("memory",)


class TierMedia:
    def __init__(self, index: PrefixIndex, capacity_blocks: int | None) -> None:
        self.index = index
        self.capacity_blocks = capacity_blocks
        self._lock = threading.Lock()
        self._readable: dict[str, set[str]] = {}  # replica → tier names it loads from

    @staticmethod
    def is_tier(name: str) -> bool:
        return name.startswith(PREFIX)

    def tier_of(self, replica: str, medium: str | None) -> str | None:
        """The index replica that holds `medium`'s blocks for `replica`, registering it (None: not a
        kvgate tier; the engine's own cache and other connectors' media stay with the replica)."""
        if medium is None:
            return None
        if medium.startswith(SHARED):
            name = PREFIX + medium
        elif medium in PRIVATE:
            name = f"{PREFIX}{medium}@{replica}"
        else:
            return None
        with self._lock:
            if name not in self.index.replicas:
                self.index.add_replica(name, self.capacity_blocks)
            self._readable.setdefault(replica, set()).add(name)
        return name

    def forget(self, replica: str) -> None:
        """The replica restarted or left: its private tiers go; shared ones outlive it."""
        with self._lock:
            names = self._readable.pop(replica, set())
        for name in names:
            if name.endswith("@" + replica) and name in self.index.replicas:
                self.index.cleared(name)

    def readable(self, replica: str) -> set[str]:
        with self._lock:
            return set(self._readable.get(replica, ()))

    def split(self, matched: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """(engine matches without tiers, replica → leading blocks of the best tier it reads)."""
        engines = {k: v for k, v in matched.items() if not k.startswith(PREFIX)}
        with self._lock:
            tiers = {r: max((matched.get(t, 0) for t in names), default=0) for r, names in self._readable.items()}
        return engines, {r: b for r, b in tiers.items() if b}
