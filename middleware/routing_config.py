"""`routing:` of a route as pydantic models: the policy (a union on `name`, each member with its own
knobs), the prefix index the router keeps for the prefix-aware policies (`prefix`), and the
route-level failover and forwarding fields.

Older files spell every knob flat on `routing:` (`policy: cache_aware` beside `decode_weight: 4`,
`mode: precise`, ...): RoutingConfig._old_spellings moves each into place and says so, once per
field per load (`deprecations`, used by kvgate.middleware.config.parse_config), as a DeprecationWarning
and on the `kvgate.config` logger (which `kvgate` prints).

Imports only pydantic and index: kvgate.middleware.routing (whose policies each take their settings model
from here) imports this, directly and through kvgate.middleware.config.
"""

from __future__ import annotations

import logging
import math
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, Iterator, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from kvgate.index.kv.prefix import EVENT_FED_CAPACITY

log = logging.getLogger("kvgate.config")

# what moved where: flat routing.<knob> → routing.policy.<knob> (of the policy named), and
# flat routing.<field> → routing.prefix.<field>
# approximate mode's block with a model tokenizer until an engine reports its own (vLLM's GPU block)
APPROXIMATE_BLOCK_TOKENS = 16
PREFIX_FIELDS = ("mode", "tokenizer", "block_size", "seed", "capacity_blocks", "record_answers")

_collected: ContextVar[list[str] | None] = ContextVar("kvgate_config_deprecations", default=None)


def deprecated(message: str) -> None:
    """An old spelling was read: said at the end of the load under way (`deprecations`), once per
    message; outside a load (a RoutingConfig built in code) said at once."""
    pending = _collected.get()
    if pending is None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        log.warning(message)
    elif message not in pending:
        pending.append(message)


@contextmanager
def deprecations() -> Iterator[None]:
    """Collect the deprecation messages of one load and say each once when it ends: as a
    DeprecationWarning and on the `kvgate.config` logger. A load that fails only logs them (a
    DeprecationWarning turned into an error must not hide the ConfigError)."""
    token = _collected.set([])
    ok = False
    try:
        yield
        ok = True
    finally:
        messages = _collected.get() or []
        _collected.reset(token)
        for message in messages:
            if ok:
                warnings.warn(message, DeprecationWarning, stacklevel=3)
            log.warning(message)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Policy(_Strict):
    """What every policy's settings share: a knob of another policy is refused naming its policy."""

    @model_validator(mode="before")
    @classmethod
    def _knob_of_another_policy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("name", cls.model_fields["name"].default)
            for key in data:
                owner = KNOB_POLICY.get(key)
                if owner is not None and key not in cls.model_fields:
                    raise ValueError(f"routing.policy.{key} belongs to policy {owner}; this route's policy is {name}")
        return data


class RoundRobinConfig(_Policy):
    """round_robin: each request to the next replica in turn (no knobs)."""

    name: Literal["round_robin"] = "round_robin"


class LeastLoadedConfig(_Policy):
    """least_loaded: the replica with the fewest requests in flight (no knobs)."""

    name: Literal["least_loaded"] = "least_loaded"


class CacheAwareConfig(_Policy):
    """cache_aware: expected time to first token, with a bound on the queueing a prefix match may
    buy (middleware/routing/cache_aware.py)."""

    name: Literal["cache_aware"] = "cache_aware"
    decode_weight: float = Field(8.0, ge=0, description="prefill tokens one running request costs")
    miss_weight: float = Field(
        64.0,
        ge=1.0,
        description="charge for copying a prefix another replica holds, per token, weighted by its share of the prompt",
    )
    queue_slack: float = Field(
        2.5,
        ge=0,
        description="a prefix match may buy at most max(queue_slack × mean queue, prompt_slack × prompt) of queueing (.inf: no bound)",
    )
    prompt_slack: float = Field(0.5, ge=0, description="see queue_slack")
    session_slack: float = Field(
        math.inf,
        ge=0,
        description="queue_slack for a match that is one "
        "conversation's own history (no other request continued "
        "that prefix differently); .inf (default): not bounded",
    )
    stall_weight: float = Field(
        0.0,
        ge=0,
        description="charge per request in flight on a replica, per prefill token this request computes there: "
        "the running decodes wait while its prompt is computed beside them (1: that wait in full; 0: not counted)",
    )
    new_sessions: Literal["load", "resident"] = Field(
        "load",
        description="where a conversation's start goes (a prompt matching nothing, or only a prefix other "
        "conversations share): load, the lowest cost now; resident, among the replicas within the wait "
        "bound, the one whose engine holds the fewest tokens, so the turns that follow spread as the "
        "conversations do",
    )


class PrefillTimeConfig(_Policy):
    """prefill_time: the replica where the first token is expected soonest, in seconds, from the
    engines' measured prefill rates and queues (middleware/routing/prefill_time.py)."""

    name: Literal["prefill_time"] = "prefill_time"
    cold_prefill_rate: float = Field(
        1000.0,
        gt=0,
        description="prefill tokens per second assumed for every replica until one is measured from its engine's counters",
    )


class AffinityConfig(_Policy):
    """affinity: sticky sessions by consistent hashing with bounded loads (middleware/routing/affinity.py)."""

    name: Literal["affinity"] = "affinity"
    load_factor: float = Field(1.25, ge=1.0, description="bound on load vs the mean")


POLICY_MODELS = (RoundRobinConfig, LeastLoadedConfig, CacheAwareConfig, PrefillTimeConfig, AffinityConfig)
POLICY_NAMES = tuple(m.model_fields["name"].default for m in POLICY_MODELS)
KNOB_POLICY = {knob: m.model_fields["name"].default for m in POLICY_MODELS for knob in m.model_fields if knob != "name"}
PolicyConfig = Annotated[
    Union[RoundRobinConfig, LeastLoadedConfig, CacheAwareConfig, PrefillTimeConfig, AffinityConfig],
    Field(discriminator="name"),
]
_POLICY = TypeAdapter(PolicyConfig)


def policy_config(
    name: str, **knobs: Any
) -> RoundRobinConfig | LeastLoadedConfig | CacheAwareConfig | PrefillTimeConfig | AffinityConfig:
    """The settings of policy `name` (validated: pydantic.ValidationError, a ValueError, if not)."""
    return _POLICY.validate_python({"name": name, **knobs})


class PrefixConfig(_Strict):
    """How the router hashes prompts into blocks and what its prefix index keeps: what the
    prefix-aware policies (cache_aware) match against."""

    mode: Literal["approximate", "precise"] = "approximate"
    tokenizer: str | None = Field(
        None,
        description="smollm2 | text | auto | codepoints (engines whose tokens are "
        "code points: kvgate's simulator) | path to a local HF tokenizer "
        "dir. Default: "
        "text in approximate mode; auto in precise mode (the served "
        "model's own tokenizer, from the model dir the engine reports)",
    )
    block_size: int | None = Field(
        None,
        gt=0,
        le=4096,
        description="tokens per hashed block (characters with tokenizer: text). Default: the "
        "engine's own (vLLM reports it), in approximate mode 16 until an engine does and 64 "
        "characters with tokenizer text. A value that disagrees with the engine's is reported; "
        "precise mode then uses the engine's",
    )
    seed: str = Field("kvgate", description="seed of kvgate's own block hashes (the router's hash space)")
    capacity_blocks: int | None = Field(
        None,
        gt=0,
        description="per-replica blocks the prefix index keeps (LRU). approximate: the engine's cache "
        "size to mirror, by default the size the engine reports (vLLM's KV cache, in blocks); "
        "precise, or tokenizer text: a memory bound. Default (and until an engine reports) "
        "EVENT_FED_CAPACITY (262144)",
    )
    record_answers: bool = Field(
        True,
        description="approximate mode: the engine caches generated tokens too (vLLM does); a process "
        "routing alone hashes an answer when its conversation's next turn comes",
    )

    @model_validator(mode="after")
    def _defaults_by_mode(self) -> "PrefixConfig":
        """approximate mode guesses what engines cache from what it routed: blocks of 16 tokens
        (vLLM's GPU block) until an engine reports its own (routing/mirror.py: None here means
        the engine's), 64 with the `text` tokenizer, whose blocks count characters (16
        characters are only ~4 tokens of English). Precise mode reads what the
        engines report, so its hashes must cut the engine's own token ids where the engine cuts
        them: the tokenizer defaults to the served model's (`auto`) and the block size to the
        engine's (None until the engine says it); `text` cannot match an engine at all."""
        if self.mode == "precise":
            if self.tokenizer == "text":
                raise ValueError(
                    "routing.prefix.mode: precise cannot use routing.prefix.tokenizer: text: the engine "
                    "hashes the model's token ids, not characters, so no block would ever match. Leave "
                    "routing.prefix.tokenizer out (auto: the served model's tokenizer) or name a "
                    "tokenizer dir"
                )
            self.tokenizer = self.tokenizer or "auto"
        else:
            if self.tokenizer in (None, "auto"):
                if self.tokenizer == "auto":
                    raise ValueError(
                        "routing.prefix.tokenizer: auto needs routing.prefix.mode: precise (the engines "
                        "tell the model); in approximate mode name the tokenizer or leave it out (text)"
                    )
                self.tokenizer = "text"
            if self.block_size is None and self.tokenizer == "text":
                self.block_size = 64
        return self

    @model_validator(mode="after")
    def _index_is_bounded(self) -> "PrefixConfig":
        """The prefix index never grows without end: precise mode follows the engines' own
        evictions, but lost removal events must not pile up; approximate mode records every
        routed prompt, and fresh long prompts would add blocks forever (and an insert that grows
        a large index's tables holds the proxy's GIL long enough to stall every request). Default bound:
        kvgate.index.kv.prefix.EVENT_FED_CAPACITY, far above what an engine caches; approximate
        mode with a model tokenizer keeps None here: each replica's engine's own size once it
        reports one, that bound until then (routing/mirror.py)."""
        if self.capacity_blocks is None and (self.mode == "precise" or self.tokenizer == "text"):
            self.capacity_blocks = EVENT_FED_CAPACITY
        return self


class RoutingConfig(_Strict):
    """How a miss picks a replica. See middleware/routing/*.py for each policy's rule."""

    policy: PolicyConfig = Field(
        default_factory=CacheAwareConfig,
        description="round_robin | least_loaded | cache_aware | prefill_time | affinity, or a mapping {name: <policy>, <its knobs>}",
    )
    prefix: PrefixConfig = Field(default_factory=PrefixConfig)
    engine: Literal["auto", "vllm", "openai"] = Field(
        "auto",
        description="what serves the replicas: auto = asked from each replica (vLLM answers /version); "
        "vllm; openai = any other OpenAI-compatible server (no cache_salt, no engine settings)",
    )
    cache_salt: bool = Field(
        True,
        description="scope tenant on a vLLM engine: every forwarded request carries a "
        "cache_salt derived from the tenant, so tenants never share "
        "(or time) each other's prefix cache",
    )
    max_attempts: int = Field(3, ge=1, le=10, description="replicas tried per request on connection errors / 5xx")
    down_for_s: float = Field(5.0, gt=0, description="a failed replica gets no traffic this long (then half-open)")
    probe_interval_s: float = Field(2.0, gt=0, description="health probe of down replicas (proxy)")
    engine_poll_s: float = Field(
        2.0,
        ge=0.1,
        le=300,
        description="seconds between two reads of each replica's /metrics by the proxy (its "
        "engine's queue and prefill rate for prefill_time, and the dashboard's "
        "engine numbers); below the engine's HTTP keep-alive (vLLM: 5 s), one "
        "connection per replica serves every read",
    )
    forward: Literal["relay", "litellm"] = Field(
        "relay",
        description="proxy misses: relay = pass the replica's own bytes through (httpx, OpenAI-compatible "
        "replicas: backend.model openai/… or hosted_vllm/…); litellm = through litellm.acompletion",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_spellings(cls, data: Any) -> Any:
        """`policy: <name>` is that policy with its defaults. Flat knobs (routing.decode_weight, ...)
        move into routing.policy when it is their policy (refused otherwise), flat prefix fields
        (routing.mode, ...) into routing.prefix; each move is a deprecation (`deprecated`)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        policy = data.get("policy", "cache_aware")
        flat = [k for k in KNOB_POLICY if k in data]
        if isinstance(policy, str):
            policy = {"name": policy}
        elif isinstance(policy, BaseModel) and flat:  # a settings object with knobs beside it
            policy = {**policy.model_dump(include=policy.model_fields_set), "name": getattr(policy, "name", None)}
        elif isinstance(policy, dict):
            if "name" not in policy:
                raise ValueError(f"routing.policy needs a name: one of {', '.join(POLICY_NAMES)}")
            policy = dict(policy)
        if isinstance(policy, dict):
            data["policy"] = policy
        if not flat or not isinstance(policy, dict) or policy["name"] not in POLICY_NAMES:
            flat = []  # nothing to move, or pydantic says what is wrong with the policy (naming those there are)
        name = policy["name"] if flat else None
        for key in flat:
            owner = KNOB_POLICY[key]
            if name != owner:
                raise ValueError(f"routing.{key} belongs to policy {owner}; this route's policy is {name}")
            if key in policy:
                raise ValueError(f"routing.{key} and routing.policy.{key} are both given; keep routing.policy.{key}")
            policy[key] = data.pop(key)
            deprecated(f"routing.{key} is deprecated: write routing.policy.{key} (with policy: {{name: {owner}, ...}})")
        moved = [k for k in PREFIX_FIELDS if k in data]
        if moved:
            prefix = data.get("prefix", {})
            if not isinstance(prefix, dict):
                raise ValueError(
                    f"routing.{moved[0]} and routing.prefix are both given; write routing.prefix.{moved[0]}"
                )
            prefix = dict(prefix)
            for key in moved:
                if key in prefix:
                    raise ValueError(
                        f"routing.{key} and routing.prefix.{key} are both given; keep routing.prefix.{key}"
                    )
                prefix[key] = data.pop(key)
                deprecated(f"routing.{key} is deprecated: write routing.prefix.{key}")
            data["prefix"] = prefix
        return data
