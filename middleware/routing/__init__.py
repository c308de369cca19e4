"""Prefix-aware routing: a RoutingPolicy protocol, one file per policy, and the Router."""
from middleware.routing.base import ReplicaState, RoutePlan, RoutingPolicy
from middleware.routing.factory import make_policy

__all__ = ["ReplicaState", "RoutePlan", "RoutingPolicy", "make_policy"]
