"""Policy settings → implementations: routing.policy (one member of the config's union) names its
class by `name` and is handed to it. Adding a policy: one file, its settings model in
middleware/routing_config.py, one line here."""

from __future__ import annotations

from typing import Any, Callable

from kvgate.middleware.routing.affinity import Affinity
from kvgate.middleware.routing.base import RoutingPolicy
from kvgate.middleware.routing.cache_aware import CacheAware
from kvgate.middleware.routing.least_loaded import LeastLoaded
from kvgate.middleware.routing.prefill_time import PrefillTime
from kvgate.middleware.routing.round_robin import RoundRobin
from kvgate.middleware.routing_config import PolicyConfig, policy_config

POLICIES: dict[str, Callable[[Any], RoutingPolicy]] = {
    "round_robin": RoundRobin,
    "least_loaded": LeastLoaded,
    "cache_aware": CacheAware,
    "prefill_time": PrefillTime,
    "affinity": Affinity,
}


def make_policy(policy: PolicyConfig | str, **knobs: Any) -> RoutingPolicy:
    """The policy of a route's `routing.policy` settings, or of a name and its knobs
    (make_policy("cache_aware", miss_weight=4)), validated as the config is."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; choose from {sorted(POLICIES)}")
        policy = policy_config(policy, **knobs)
    elif knobs:
        raise TypeError("make_policy: knobs go in the settings object, not beside it")
    return POLICIES[policy.name](policy)
