"""What the pipeline knows about one request: validated, canonicalised, hashed.

Pure functions: the same request gives the same keys in every process, so the cache survives
restarts and is shared between processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import repeat
from typing import Any, Callable, Mapping

from kvgate.index.kv.prompt import TextPrompt
from kvgate.middleware.canonical import (
    ONLY_DICT,
    ONLY_STR,
    canonical_json,
    canonical_list,
    digest,
    plain_list,
    rendered,
)
from kvgate.middleware.config import Config, RouteConfig
from kvgate.middleware.errors import BadRequest, ModelNotFound

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SYSTEM_ROLES = frozenset({"system", "developer"})

# Arguments that do not change what the model says. Everything else counts as output-affecting,
# so an unknown new parameter splits the cache rather than risking a wrong hit.
NON_OUTPUT_PARAMS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "api_key",
        "api_base",
        "base_url",
        "api_version",
        "timeout",
        "request_timeout",
        "cache",
        "extra_headers",
        "headers",
        "num_retries",
        "max_retries",
        "store",
        "litellm_logging_obj",
        "mock_response",
        "caching",
        "fallbacks",
        "context_window_fallback_dict",
        "service_tier",
    }
)
MAX_TOKEN_ID = (1 << 31) - 1  # token ids are int32 in every engine we front
# Sent on to the backend but kept out of the keys.
FORWARDED_NON_OUTPUT = ("stream_options", "user", "metadata", "extra_headers", "headers")
_FORWARDED_SET = frozenset(FORWARDED_NON_OUTPUT)


@dataclass(frozen=True)
class CacheControl:
    """Per-request cache directives (header `x-kvgate-cache-control`, SDK kwarg `cache`)."""

    no_cache: bool = False  # do not look up
    no_store: bool = False  # do not write
    ttl: float | None = None  # override the route's TTL for this write
    tags: tuple[str, ...] = ()  # the client's tags for this write (kvgate.middleware.tags: header x-kvgate-tags)

    @classmethod
    def from_header(cls, value: str | None) -> "CacheControl":
        """Parse `no-cache, no-store, ttl=60` (comma separated, case-insensitive)."""
        if not value:
            return cls()
        no_cache = no_store = False
        ttl = None
        for part in (p.strip().lower() for p in value.split(",")):
            if part == "no-cache":
                no_cache = True
            elif part == "no-store":
                no_store = True
            elif part.startswith(("ttl=", "max-age=")):
                ttl = _positive_float(part.split("=", 1)[1], "x-kvgate-cache-control ttl")
            elif part:
                raise BadRequest(f"unknown x-kvgate-cache-control directive {part!r}", param="x-kvgate-cache-control")
        return cls(no_cache, no_store, ttl)

    @classmethod
    def from_kwarg(cls, value: Any) -> "CacheControl":
        """LiteLLM's per-call `cache={"no-cache": True, "no-store": True, "ttl": 60}`."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise BadRequest("`cache` must be a dict like {'no-cache': True, 'ttl': 60}", param="cache")
        ttl = value.get("ttl", value.get("s-maxage"))
        return cls(
            bool(value.get("no-cache", False)),
            bool(value.get("no-store", False)),
            _positive_float(ttl, "cache.ttl") if ttl is not None else None,
        )


def _positive_float(raw: Any, name: str) -> float:
    try:
        out = float(raw)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must be a number of seconds", param=name) from None
    if out <= 0:
        raise BadRequest(f"{name} must be positive", param=name)
    return out


@dataclass(frozen=True)
class RequestView:
    route: RouteConfig
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]  # output-affecting, canonical
    forwarded: dict[str, Any]  # sent to the backend, not part of any key
    stream: bool
    tenant: str
    # the exact key and the semantic scope (`scope`, digested when first asked: a route without a
    # semantic tier needs it only to store the answer, after the replica has answered): None on a
    # route that caches nothing (RouteConfig.caches false), where nothing is looked up or stored
    exact_key: str | None
    scope_digest: Callable[[], str | None] = field(repr=False, compare=False)
    query_text: str | None  # the last user turn, when it is plain text
    control: CacheControl = field(default_factory=CacheControl)
    parents: tuple[str, ...] | None = None  # context: semantic: the earlier user turns (texts), judged per entry
    prompt: TextPrompt | None = None  # a completions request's prompt (`messages` is then empty)
    skip: str | None = (
        None  # why this request is neither looked up nor stored (the answer is not a function of the key)
    )

    @cached_property
    def scope(self) -> str | None:
        """The semantic scope's digest (once per view)."""
        return self.scope_digest()

    @property
    def completions(self) -> bool:
        return self.prompt is not None

    @property
    def routing_prompt(self) -> "list[dict[str, Any]] | TextPrompt":
        """What the router hashes: the conversation, or the completions prompt."""
        return self.prompt if self.prompt is not None else self.messages

    def with_answer(self, answer: str) -> "list[dict[str, Any]] | TextPrompt | None":
        """What a next turn of this conversation starts with: the prompt followed by `answer`
        (None when it cannot be told: a token-id prompt)."""
        if self.prompt is not None:
            return self.prompt.extended(answer)
        return [*self.messages, {"role": "assistant", "content": answer}]


_SCALAR_TYPES = (str, bool, int, float)


def output_params(kwargs: Mapping[str, Any], skip: str | None = None) -> dict[str, Any]:
    """The set parameters that shape an answer (all but NON_OUTPUT_PARAMS and `skip`), as the
    keys see them: None dropped at every level, keys sorted, values as JSON reads them back.

    Invariant: equal to `json.loads(canonical_json(...))` of those parameters. Scalars (the usual
    temperature, max_tokens, stop string) read back as they are, so they skip the round trip."""
    params = {k: v for k, v in kwargs.items() if k not in NON_OUTPUT_PARAMS and k != skip and v is not None}
    if all(type(k) is str and type(v) in _SCALAR_TYPES for k, v in params.items()):
        return dict(sorted(params.items()))
    return json.loads(canonical_json(params))


def forwarded_params(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The set parameters sent on to the engine that do not shape the answer, in FORWARDED_NON_OUTPUT's order."""
    if _FORWARDED_SET.isdisjoint(kwargs):  # the usual request sets none of them
        return {}
    return {k: kwargs[k] for k in FORWARDED_NON_OUTPUT if kwargs.get(k) is not None}


def text_of(content: Any) -> str | None:
    """Plain text of a message content, or None when it holds anything but text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                return None
            texts.append(part["text"])
        return "\n".join(texts)
    return None


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the OpenAI message shape; return plain dicts. Raises BadRequest naming the field."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list", param="messages")
    try:  # the usual shape, checked at C speed: plain dicts, each with a known role and string content
        if (
            set(map(type, messages)) == ONLY_DICT
            and ROLES.issuperset(map(dict.get, messages, repeat("role")))
            and ONLY_STR.issuperset(map(type, map(dict.get, messages, repeat("content"))))
        ):
            return list(map(dict, messages))
    except TypeError:  # an unhashable role: the loop below names it
        pass
    out = []
    for i, msg in enumerate(messages):
        if type(msg) is not dict and hasattr(msg, "model_dump"):  # a plain dict has none: no lookup that fails
            msg = msg.model_dump(exclude_none=True)
        if not isinstance(msg, Mapping):
            raise BadRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a list or dict role is no member, not a TypeError
            raise BadRequest(
                f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}", param=f"messages[{i}].role"
            )
        content = msg.get("content")
        if content is None and not (role == "assistant" and msg.get("tool_calls")):
            if role != "assistant":
                raise BadRequest(f"messages[{i}].content is required", param=f"messages[{i}].content")
        elif content is not None and not isinstance(content, (str, list)):
            raise BadRequest(
                f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content"
            )
        out.append(dict(msg))
    return out


def build_view(
    config: Config, kwargs: Mapping[str, Any], tenant: str, control: CacheControl, route: RouteConfig | None = None
) -> RequestView:
    """Compute the exact key, the semantic scope and the query text; `route`: the one
    `match_route` found for these kwargs (matched here when not given)."""
    route = match_route(config, kwargs) if route is None else route
    model = kwargs["model"]
    messages = validate_messages(kwargs.get("messages"))
    params = output_params(kwargs)
    forwarded = forwarded_params(kwargs)
    stream = bool(kwargs.get("stream", False))
    cache_tenant = tenant if route.scope == "tenant" else None

    exact_key, scope = _chat_keys(route, model, messages, params, cache_tenant)
    last = messages[-1]
    query = text_of(last.get("content")) if last.get("role") == "user" else None
    parents = None
    if route.semantic.context == "semantic":  # earlier user turns are judged per entry, not hashed
        texts = [text_of(m.get("content")) for m in messages[:-1] if m.get("role") == "user"]
        query = query if all(t is not None for t in texts) else None  # non-text history: exact tier only
        parents = tuple(t for t in texts if t is not None)
    return RequestView(
        route, model, messages, params, forwarded, stream, tenant, exact_key, scope, query, control, parents
    )


def _none() -> None:
    """The scope of a request on a route that caches nothing."""
    return None


def _chat_keys(
    route: RouteConfig, model: str, messages: list[dict[str, Any]], params: dict[str, Any], tenant: str | None
) -> tuple[str | None, Callable[[], str | None]]:
    """(exact key, semantic scope's digest on demand) of a chat request; (None, a None scope) on a
    route that caches nothing. The scope covers the earlier messages its route's `semantic.context`
    keeps: all of them, or only the system ones (earlier user turns judged per entry, or left out)."""
    if not route.caches:
        return None, _none
    earlier = range(len(messages) - 1)
    if route.semantic.context in ("semantic", "last_user_only"):
        earlier = [i for i in earlier if messages[i].get("role") in SYSTEM_ROLES]
    whole = plain_list(messages)  # the usual conversation: written in one pass at C speed
    each = [] if whole is not None else [canonical_json(m) for m in messages]  # else each once, for both keys
    params_text = rendered(params)  # once, for both keys
    exact_key = digest("exact", route.name, model, whole or canonical_list(each), params_text, tenant)

    def scope() -> str:
        kept = [messages[i] for i in earlier]
        part = plain_list(kept) if whole is not None else canonical_list([each[i] for i in earlier])
        return digest(
            "scope", route.name, model, params_text, part or canonical_list(list(map(canonical_json, kept))), tenant
        )

    return exact_key, scope


def uncacheable(params: Mapping[str, Any]) -> str | None:
    """Why a completions request's answer is not a function of its key (None when it is):
    several sampled choices, log-probabilities or the echoed prompt are forwarded and not cached."""
    n = params.get("n")
    temperature = params.get("temperature")
    if isinstance(n, int) and n > 1 and (temperature is None or float(temperature) > 0):
        return "n>1 with temperature>0"
    if params.get("logprobs") is not None and params.get("logprobs") is not False:
        return "logprobs"
    if params.get("echo"):
        return "echo"
    return None


def text_prompt(prompt: Any, where: str = "prompt") -> TextPrompt:
    """One completions prompt: a non-empty string or a non-empty list of token ids. Raises
    BadRequest naming the field (the engine would refuse it after a round trip)."""
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest(f"`{where}` must not be empty", param=where)
        return TextPrompt(prompt)
    if (
        isinstance(prompt, (list, tuple))
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise BadRequest(f"`{where}[{bad}]` = {prompt[bad]} is not a token id", param=f"{where}[{bad}]")
        return TextPrompt(token_ids=tuple(prompt))
    if isinstance(prompt, (list, tuple)) and not prompt:
        raise BadRequest(f"`{where}` must not be empty", param=where)
    raise BadRequest(f"`{where}` must be a string or a list of token ids", param=where)


def build_text_view(
    config: Config, kwargs: Mapping[str, Any], tenant: str, control: CacheControl, route: RouteConfig | None = None
) -> RequestView:
    """A completions request (one prompt; a batch is split before it gets here): the exact key
    covers the prompt (text or ids), model, output-affecting parameters and tenant; the semantic
    tier's query is the prompt text. Requests whose answer is not a function of the key
    (`uncacheable`) skip both tiers. `route` as for `build_view`."""
    route = match_route(config, kwargs, "completions") if route is None else route
    model = kwargs["model"]
    prompt = text_prompt(kwargs.get("prompt"))
    params = output_params(kwargs, skip="prompt")
    n = params.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise BadRequest(f"`n` must be a positive integer, got {n!r}", param="n")
    forwarded = forwarded_params(kwargs)
    stream = bool(kwargs.get("stream", False))
    cache_tenant = tenant if route.scope == "tenant" else None
    exact_key, scope = None, _none
    if route.caches:
        keyed = ["text", prompt.text] if prompt.text is not None else ["ids", list(prompt.token_ids or ())]
        params_text = rendered(params)  # once, for both keys
        exact_key = digest("exact-completions", route.name, model, rendered(keyed), params_text, cache_tenant)
        scope = partial(digest, "scope-completions", route.name, model, params_text, cache_tenant)
    skip = uncacheable(params)
    if skip is not None:
        control = CacheControl(no_cache=True, no_store=True)
    # raw prompts that differ only in a few words (one document, another question at its end) embed
    # close together: the semantic tier serves them only on a route that turns it on by name
    semantic = "enabled" in route.semantic.model_fields_set and route.semantic.enabled
    return RequestView(
        route,
        model,
        [],
        params,
        forwarded,
        stream,
        tenant,
        exact_key,
        scope,
        prompt.text if semantic else None,
        control,
        None,
        prompt,
        skip,
    )


def match_route(config: Config, kwargs: Mapping[str, Any], endpoint: str = "chat") -> RouteConfig:
    """The route that serves this request's model on `endpoint`; BadRequest / ModelNotFound
    when there is none. The pipeline matches once per request and hands the route on."""
    model = kwargs.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required and must be a string", param="model")
    route = config.match(model, endpoint)
    if route is None:
        known = ", ".join(repr(r.model) for r in config.routes if endpoint in r.endpoints)
        raise ModelNotFound(f"no route serves model {model!r} on {endpoint}; routes accept: {known}", param="model")
    return route
