"""The composition root: every object of a pipeline, built from config in one place.

The proxy, the SDK and the CLI all build their pipeline here; a test or a benchmark may hand in a
ready part (an embedder, an index, metrics, a verifier, a shared routing state) instead of the one
the config would build.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kvgate.index.responses.embedder import (
    Embedder,
    EmbedderMissing,
    embedder_identity,
    embedder_missing,
    make_embedder,
    read_manifest,
)
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.responses.trust import Rule, prior_rule
from kvgate.index.responses.verifier import Verifier, VerifierMissing, load_verifier
from kvgate.index.storage.env import MissingSecret
from kvgate.index.storage.redis_link import RedisLink
from kvgate.middleware.cache.embedder_mark import claim
from kvgate.middleware.cache.governance import Governance
from kvgate.middleware.cache.offload import new_chars_limit
from kvgate.middleware.cache.response_cache import ResponseCache
from kvgate.middleware.cache.semantic_lookup import SemanticLookup
from kvgate.middleware.cache.store import open_observations, open_stores
from kvgate.middleware.cache.trust_gate import TrustGate
from kvgate.middleware.cache.verification import resolve
from kvgate.middleware.config import Config, RouteConfig
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.forward.forwarder import Forwarder
from kvgate.middleware.forward.relay import Relay
from kvgate.middleware.pipeline import Pipeline
from kvgate.middleware.routing.epochs import Epochs
from kvgate.middleware.routing.epochs_disk import DiskEpochStore
from kvgate.middleware.routing.epochs_redis import RedisEpochStore
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing.salt import Salter, load_secret
from kvgate.middleware.routing.state import StateFactory
from kvgate.middleware.routing.state_redis import shared_routing
from kvgate.middleware.telemetry.metrics import Metrics

MINILM_DIM = 384
log = logging.getLogger("kvgate")


def build_pipeline(
    config: Config,
    *,
    embedder: Embedder | None = None,
    index: SemanticIndex | None = None,
    metrics: Metrics | None = None,
    verifier: Verifier | None = None,
    routing_state: StateFactory | None = None,
) -> Pipeline:
    metrics = metrics or Metrics()
    # thresholds from the config or from `kvgate tune`'s operating point, resolved once (ConfigError if missing)
    settings = {r.name: resolve(r, config.cache_dir, i) for i, r in enumerate(config.routes)}
    # the verifier model loads only when a semantic route uses it
    verifying = [i for i, r in enumerate(config.routes) if r.semantic.enabled and settings[r.name].verifies]
    verifier = verifier or (_load_verifier(config, verifying[0]) if verifying else None)
    # no semantic route, no model to load (saves seconds of start-up and the model's memory)
    semantic_routes = any(r.semantic.enabled for r in config.routes)
    embedder = embedder or (_make_embedder(config) if semantic_routes else None)
    if semantic_routes and embedder is None:
        _serve_exact_only(config)
    dim = embedder.dim if embedder is not None else MINILM_DIM
    # `store:` local dirs or a shared Redis (kvgate.middleware.cache.store); the index follows the store's log
    stores = open_stores(config, dim, with_entries=index is None)
    if index is None and embedder is not None:
        # a cache keeps one embedder's vectors: another embedder's would match nothing or the wrong thing
        try:
            claim(config, stores.link, embedder_identity(embedder))
        except ConfigError:
            stores.close()
            raise
    if index is None:  # not `index or ...`: a handed-in index that is still empty is falsy (len 0)
        index = SemanticIndex(
            None,
            dim,
            max_entries=config.max_entries,
            entries=stores.entries,
            tighten_margin=config.feedback.margin,
            max_bytes=config.max_bytes,
            follow_interval_s=stores.follow_interval_s,
        )
    # on Redis, the routing view is shared with every proxy process on it (one host's workers included)
    hub = shared_routing(config, stores.link)
    routing_state = hub.state if hub is not None else routing_state
    metrics.entries.set_function(lambda: len(index))
    metrics.cache_bytes.set_function(lambda: index.bytes)
    # routes with semantic.max_error_rate: verified outcomes live next to the entries (shared, kept)
    trust = None
    if any(r.semantic.enabled and settings[r.name].max_error_rate is not None for r in config.routes):
        assert embedder is not None  # a max_error_rate route is a semantic route: its embedder was made above
        trust = TrustGate(
            open_observations(config, stores.link),
            embedder.embed,
            lambda route, ok: metrics.exploration_verdicts.labels(route, "agree" if ok else "differ").inc(),
            _calibration_prior(config),
        )
    epochs = _epochs(config, stores.link, stores.follow_interval_s)  # tenants' salt records, replaced by an erasure
    salter = _salter(config, epochs)
    relay = Relay()
    forwarders = {
        route.name: Forwarder(route, _router_for(route, routing_state, salter), metrics, relay)
        for route in config.routes
    }
    routers = {name: f.router for name, f in forwarders.items() if f.router is not None}
    index.revision_of = _revisions(config, routers)  # answers of another model revision are stale
    for name, router in routers.items():
        for replica in router.replicas:
            metrics.watch_replica(name, replica)
    metrics.watch(routers, {"responses": index, "request_log": stores.requests})
    metrics.watch_store(stores.link, index.follow_lag_s)
    cipher = getattr(index.entries, "cipher", None)  # the entry store's, the config's or a handed-in index's
    if cipher is not None:
        metrics.watch_decrypt(lambda: cipher.failures)
    # per route: the prompt size up to which its cache steps run on the event loop (kvgate.middleware.cache.offload)
    inline_chars = {
        r.name: new_chars_limit(
            local_stores=stores.link is None,
            semantic=r.semantic.enabled,
            tokenizer=r.routing.prefix.tokenizer if r.replicas else None,
        )
        for r in config.routes
    }
    lookup = SemanticLookup(index, embedder, settings, verifier, trust, metrics)
    cache = ResponseCache(config, index, stores.requests, lookup, metrics, inline_chars, stores.link is None)
    # closed before the cache, in this order: queued trust comparisons finish while the index is open
    closing: list[Any] = [
        *([trust] if trust is not None else []),
        *routers.values(),
        *([hub] if hub is not None else []),
        epochs,
    ]
    return Pipeline(
        config, cache, forwarders, relay, metrics, closing, governance=Governance(index, stores.requests, epochs)
    )


def _load_verifier(config: Config, position: int) -> Verifier:
    """The trained verifier; a missing one is a ConfigError naming the route that needs it."""
    try:
        return load_verifier(config.embedder.verifier_path)
    except VerifierMissing as exc:
        raise ConfigError(f"routes.{position}.semantic.verifier: {exc}") from None


def _make_embedder(config: Config) -> Embedder | None:
    """The configured embedder; mpnet without its wheels is a ConfigError naming the field. None
    when no embedder is installed (the core install has none: torch is an extra) and the config
    asked for the semantic tier only by default; a ConfigError naming the field that asked for it
    when the config did."""
    from kvgate.index.responses.mpnet_files import MpnetMissing

    try:
        return make_embedder(config.embedder.backend, config.embedder.model_path, model=config.embedder.model)
    except MpnetMissing as exc:
        raise ConfigError(f"embedder.model: {exc}") from None
    except EmbedderMissing as exc:
        field = _semantic_asked(config)
        if field is None:
            log.warning("serving exact-only: the semantic tier needs an embedder, and %s", exc)
            return None
        raise _refusal(field, exc) from None


def check_embedder(config: Config) -> None:
    """Refuse a config that asks for the semantic tier by name where no embedder can run, before
    a server starts (found without loading the model; building the pipeline finds the same)."""
    field = _semantic_asked(config) if any(r.semantic.enabled for r in config.routes) else None
    if field is None:
        return
    missing = embedder_missing(config.embedder.backend, config.embedder.model_path, config.embedder.model)
    if missing is not None:
        raise _refusal(field, missing)


def _refusal(field: str, missing: EmbedderMissing) -> ConfigError:
    return ConfigError(
        f"{field}: the semantic tier needs an embedder, and {missing}; "
        "or set semantic.enabled: false on routes that should be exact-only"
    )


def _semantic_asked(config: Config) -> str | None:
    """The config field that asks for the semantic tier by name: a route's `semantic` section (other
    than the deprecated scope/ttl spellings it still takes) or the `embedder` section; None when
    the tier is on only by its default."""
    for position, route in enumerate(config.routes):
        named = route.semantic.model_fields_set - {"scope", "ttl"}
        if "semantic" in route.model_fields_set and route.semantic.enabled and named:
            return f"routes.{position}.semantic"
    return "embedder" if "embedder" in config.model_fields_set else None


def _serve_exact_only(config: Config) -> None:
    """Turn the semantic tier off on `config`'s routes, so every part of the pipeline (and the
    dashboard, and a second pipeline built from it) sees the exact-only routes that run."""
    for route in config.routes:
        route.semantic.enabled = False


def _calibration_prior(config: Config) -> Rule | None:
    """The tuned embedder's calibration curve (its manifest) as the trust gate's prior, if any."""
    if not config.embedder.calibration_prior:
        return None
    return prior_rule((read_manifest(config.embedder.model_path) or {}).get("calibration"))


def _epochs(config: Config, link: RedisLink | None, interval_s: float) -> Epochs:
    """Tenants' salt records where the response cache lives: the shared Redis, else <cache_dir>/tenants."""
    store = (
        RedisEpochStore(link, config.store.key_prefix)
        if link is not None
        else DiskEpochStore(config.cache_dir / "tenants")
    )
    return Epochs(store, interval_s)


def _revisions(config: Config, routers: dict[str, Router]) -> Callable[[str], str | None]:
    """route → the model revision it serves now: its `model_revision`, else what its replicas report."""
    pinned = {r.name: r.model_revision for r in config.routes}

    def revision(route: str) -> str | None:
        router = routers.get(route)
        return pinned.get(route) or (router.model_revision if router is not None else None)

    return revision


def _salter(config: Config, epochs: Epochs | None = None) -> Salter | None:
    """The engines' cache-salt maker, when a tenant-scoped route forwards to replicas that may
    take one (routing.cache_salt); a missing secret variable is a ConfigError naming the field."""
    if not any(
        r.replicas and r.scope == "tenant" and r.routing.cache_salt and r.routing.engine != "openai"
        for r in config.routes
    ):
        return None
    try:
        return Salter(load_secret(config.cache_dir, config.auth.salt_secret_env), epochs.record if epochs else None)
    except MissingSecret as exc:  # names the field itself
        raise ConfigError(str(exc)) from None
    except ValueError as exc:
        raise ConfigError(f"auth.salt_secret_env: {exc}") from None


def _router_for(route: RouteConfig, state: StateFactory | None, salter: Salter | None = None) -> Router | None:
    """The route's Router; `state` shares its load and decisions with other proxy processes."""
    if not route.replicas:
        return None
    shared = state(route.name, [r.name for r in route.replicas]) if state is not None else None
    return Router(
        route.replicas,
        route.routing,
        state=shared,
        defer_records=True,
        salter=salter if route.scope == "tenant" else None,
        name=route.name,
    )
