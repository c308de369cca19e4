"""Policy names → implementations. Adding a policy: one file, one line here."""
from __future__ import annotations

from typing import Any, Callable

from middleware.routing.affinity import Affinity
from middleware.routing.base import RoutingPolicy
from middleware.routing.cache_aware import CacheAware
from middleware.routing.least_loaded import LeastLoaded
from middleware.routing.round_robin import RoundRobin

POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    "round_robin": RoundRobin,
    "least_loaded": LeastLoaded,
    "cache_aware": CacheAware,
    "affinity": Affinity,
}


def make_policy(name: str, **options: Any) -> RoutingPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose from {sorted(POLICIES)}") from None
    return factory(**options)
