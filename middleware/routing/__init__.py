"""Prefix-aware routing: which replica takes a miss.

Owns: the RoutingPolicy protocol with one file per policy, the Router that composes scoring, the
prefix index, the KV-event feed (precise.py), replica health, shared routing state, and the
tenants' cache salts with their salt records (salt.py, epochs*.py).
May import: index/, kvgate.middleware.config (and its routing_config), kvgate.middleware.errors and
kvgate.middleware.engines; never telemetry/, cache/, forward/, the pipeline or a face.
"""

from kvgate.middleware.routing.base import ReplicaState, RoutePlan, RoutingPolicy
from kvgate.middleware.routing.factory import make_policy

__all__ = ["ReplicaState", "RoutePlan", "RoutingPolicy", "make_policy"]
