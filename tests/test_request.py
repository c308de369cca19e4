"""Keys and scopes: pure functions, checked with properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.middleware.canonical import canonical_json, digest
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import BadRequest
from kvgate.middleware.replay import replay_chunks, split_text
from kvgate.middleware.request import CacheControl, build_view

CONFIG = parse_config(
    {
        "routes": [
            {"name": "a", "model": "m-*"},
            {"name": "b", "model": "last-*", "semantic": {"context": "last_user_only"}},
            {"name": "s", "model": "shared-*", "scope": "shared"},
        ]
    }
)


def view(messages, model="m-1", tenant="t1", **params):
    return build_view(CONFIG, {"model": model, "messages": messages, **params}, tenant, CacheControl())


def user(text):
    return {"role": "user", "content": text}


def test_key_ignores_dict_order_and_non_output_params():
    a = view([user("hi")], temperature=0.2, top_p=0.9)
    b = build_view(
        CONFIG,
        {
            "top_p": 0.9,
            "messages": [{"content": "hi", "role": "user"}],
            "temperature": 0.2,
            "model": "m-1",
            "stream": True,
            "user": "someone",
            "metadata": {"x": 1},
        },
        "t1",
        CacheControl(),
    )
    assert a.exact_key == b.exact_key and a.scope == b.scope


@pytest.mark.parametrize(
    "change",
    [
        {"model": "m-2"},
        {"tenant": "t2"},
        {"temperature": 0.5},
        {"max_tokens": 10},
        {"seed": 3},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_every_output_affecting_change_splits_scope(change):
    base = view([user("hi")])
    other = view([user("hi")], **change)
    assert base.exact_key != other.exact_key and base.scope != other.scope


def test_context_modes():
    sys_ = {"role": "system", "content": "be brief"}
    turn = [user("about Rome"), {"role": "assistant", "content": "Rome is old"}]
    exact_a = view([sys_, *turn, user("what is there?")])
    exact_b = view([sys_, user("what is there?")])
    assert exact_a.scope != exact_b.scope  # context: exact keeps earlier turns in the scope
    last_a = view([sys_, *turn, user("what is there?")], model="last-1")
    last_b = view([sys_, user("what is there?")], model="last-1")
    assert last_a.scope == last_b.scope  # last_user_only drops them...
    assert last_a.exact_key != last_b.exact_key  # ...but the exact tier never does
    assert view([user("x")], model="last-1").scope != last_b.scope  # the system prompt always counts


def test_shared_scope_ignores_tenant():
    assert (
        view([user("x")], model="shared-1", tenant="a").scope == view([user("x")], model="shared-1", tenant="b").scope
    )


def test_query_text_only_for_plain_user_text():
    assert view([user("hello")]).query_text == "hello"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert view([{"role": "user", "content": parts}]).query_text == "a\nb"
    image = [{"type": "image_url", "image_url": {"url": "data:..."}}]
    assert view([{"role": "user", "content": image}]).query_text is None
    tool = [
        user("x"),
        {
            "role": "assistant",
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "42"},
    ]
    assert view(tool).query_text is None  # last turn is a tool result: exact tier only


@pytest.mark.parametrize(
    "messages", [[], "hi", [{"role": "user"}], [{"role": "x", "content": "y"}], [{"role": "user", "content": 5}]]
)
def test_bad_messages(messages):
    with pytest.raises(BadRequest):
        view(messages)


def test_cache_control_parsing():
    assert CacheControl.from_header("No-Cache, no-store, ttl=30") == CacheControl(True, True, 30.0)
    assert CacheControl.from_kwarg({"no-cache": True, "ttl": 5}) == CacheControl(True, False, 5.0)
    for bad in ("ttl=abc", "ttl=-1", "sometimes"):
        with pytest.raises(BadRequest):
            CacheControl.from_header(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=4), json_values, max_size=5))
def test_canonical_json_is_order_independent(d):
    assert canonical_json(d) == canonical_json(dict(reversed(list(d.items()))))


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_split_text_roundtrips(text):
    assert "".join(split_text(text)) == text


def test_replay_rebuilds_content_and_usage():
    stored = {
        "id": "x",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "one two three four five"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6},
    }
    chunks = list(replay_chunks(stored, include_usage=True))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three four five"
    assert chunks[-1]["usage"]["total_tokens"] == 6 and chunks[-2]["choices"][0]["finish_reason"] == "stop"


_leaf = (
    st.text()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
)
_json_like = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_json_like)
def test_canonical_json_is_json_dumps_byte_for_byte(value):
    """Keys made before the fast path stay valid: the text is json.dumps's, whichever writer ran."""
    import hashlib
    import json

    from kvgate.middleware.canonical import KEY_VERSION, _drop_none

    clean, _ = _drop_none(value)
    want = json.dumps(clean, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    assert canonical_json(value) == want
    text = json.dumps([KEY_VERSION, "x", clean], sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    try:
        expected = hashlib.sha256(text.encode()).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate: no key, before as now
        with pytest.raises(UnicodeEncodeError):
            digest("x", value)
        return
    assert digest("x", value) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(_json_like, max_size=5))
def test_a_list_from_its_items_texts_is_the_lists_canonical_json(items):
    """build_view writes each message once and joins them for both keys: the same text, so the same keys."""
    from kvgate.middleware.canonical import canonical_list, digest

    joined = canonical_list([canonical_json(x) for x in items])
    assert joined.text == canonical_json(items)
    try:
        assert digest("x", joined, 1) == digest("x", items, 1)
    except UnicodeEncodeError:  # a lone surrogate: no key either way
        pass


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text() | st.none() | _json_like.map(lambda v: ("rendered", v)), max_size=6))
def test_a_key_of_texts_and_rendered_parts_is_the_part_by_part_writers(parts):
    """Keys of strings, None and parts the caller rendered are written by one orjson call: the
    same bytes as each part written on its own and joined, so the same digest (keys stay valid)."""
    import hashlib

    from kvgate.middleware.canonical import KEY_VERSION, Rendered, rendered

    parts = [rendered(p[1]) if type(p) is tuple else p for p in parts]
    texts = [p.text if type(p) is Rendered else canonical_json(p) for p in [KEY_VERSION, *parts]]
    try:
        expected = hashlib.sha256(("[" + ",".join(texts) + "]").encode()).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate: no key, before as now
        with pytest.raises(UnicodeEncodeError):
            digest(*parts)
        return
    assert digest(*parts) == expected


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["temperature", "max_tokens", "stop", "seed", "top_p", "model", "stream", "tools", "user"]),
        _leaf
        | st.floats()
        | st.lists(_leaf, max_size=3)
        | st.tuples(_leaf)
        | st.dictionaries(st.text(max_size=3), _leaf),
        max_size=6,
    )
)
def test_output_params_are_what_the_json_round_trip_gives(kwargs):
    """Scalar parameters skip the round trip through JSON: the same values, in the same order,
    so the same keys (a NaN, which never equals itself, compared as JSON text)."""
    import json

    from kvgate.middleware.request import NON_OUTPUT_PARAMS, output_params

    want = json.loads(canonical_json({k: v for k, v in kwargs.items() if k not in NON_OUTPUT_PARAMS and v is not None}))
    got = output_params(kwargs)
    assert list(got) == list(want)
    assert json.dumps(got) == json.dumps(want)
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}


@pytest.mark.parametrize("context", ["exact", "last_user_only", "semantic"])
def test_view_keys_are_the_digests_of_the_messages(context):
    """The keys build_view writes from per-message texts equal the digests of the lists (keys made before stay valid)."""
    from kvgate.middleware.canonical import digest

    cfg = parse_config(
        {"routes": [{"name": "r", "model": "*", "backend": {"model": "openai/x"}, "semantic": {"context": context}}]}
    )
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "name": None},
        {"role": "user", "content": "2+2?"},
    ]
    view = build_view(cfg, {"model": "m", "messages": messages, "temperature": 0.5}, "t", CacheControl())
    clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
    assert view.exact_key == digest("exact", "r", "m", clean, view.params, "t")  # the tenant: scope "tenant" by default
    earlier = clean[:-1] if context == "exact" else clean[:1]
    assert view.scope == digest("scope", "r", "m", view.params, earlier, "t")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_route_that_caches_nothing_writes_no_keys(endpoint):
    """No key is written where nothing is stored or looked up (`exact: false`, semantic off); a
    route with either tier keeps both keys, and the same request on a caching route still gets them."""
    from kvgate.middleware.request import build_text_view

    cfg = parse_config(
        {
            "routes": [
                {"name": "router", "model": "r-*", "exact": False, "semantic": {"enabled": False}},
                {"name": "semantic-only", "model": "s-*", "exact": False},
                {"name": "cached", "model": "c-*", "semantic": {"enabled": False}},
            ]
        }
    )
    build = build_view if endpoint == "chat" else build_text_view
    body = {"messages": [user("hi")]} if endpoint == "chat" else {"prompt": "hi"}
    views = {m: build(cfg, {"model": m, **body}, "t", CacheControl()) for m in ("r-1", "s-1", "c-1")}
    assert views["r-1"].exact_key is None and views["r-1"].scope is None
    for model in ("s-1", "c-1"):
        assert isinstance(views[model].exact_key, str) and isinstance(views[model].scope, str)
    assert views["r-1"].messages == views["c-1"].messages and views["r-1"].params == views["c-1"].params


def test_the_scope_is_digested_once_and_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A route without a semantic tier needs the scope only to store the answer, after the
    replica answered: building the view digests the exact key alone."""
    import kvgate.middleware.request as request

    calls: list[str] = []

    def counted(*parts: Any) -> str:
        calls.append(parts[0])
        return digest(*parts)

    monkeypatch.setattr(request, "digest", counted)
    built = view([{"role": "system", "content": "long " * 5000}, user("x")], model="last-1")
    assert calls == ["exact"]
    first = built.scope
    assert calls == ["exact", "scope"] and built.scope == first  # asked twice, digested once


_ROLE = st.sampled_from(["system", "user", "assistant", "developer"])
_TEXT = st.text(max_size=6) | st.sampled_from(["\ud800", 'é"\\', "\n"])  # a lone surrogate, escapes
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": _ROLE, "content": _TEXT}),
    st.fixed_dictionaries({"role": _ROLE, "content": _TEXT}, optional={"name": _TEXT}),
    st.fixed_dictionaries({"role": _ROLE, "content": st.just([{"type": "text", "text": "hi"}])}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none()}),
)


@settings(max_examples=400, deadline=None)
@given(
    messages=st.lists(_MESSAGE, min_size=1, max_size=5),
    model=st.sampled_from(["m-1", "last-1", "shared-1"]),
    temperature=st.none() | st.floats(min_value=0, max_value=2),
)
def test_the_keys_are_the_item_by_item_writers_on_every_path(messages, model, temperature):
    """Plain conversations are written whole at C speed: the exact key and the scope are the ones
    the message-by-message writer gives, for every route's context and with or without a float."""
    from kvgate.middleware.canonical import canonical_list
    from kvgate.middleware.request import SYSTEM_ROLES, output_params

    kwargs: dict[str, Any] = {"model": model, "messages": messages}
    if temperature is not None:
        kwargs["temperature"] = temperature
    try:
        got = build_view(CONFIG, kwargs, "t1", CacheControl())
    except UnicodeEncodeError:  # a lone surrogate: no key, as before
        with pytest.raises(UnicodeEncodeError):
            digest("exact", canonical_list([canonical_json(m) for m in messages]))
        return
    route = got.route
    params, tenant = output_params(kwargs), "t1" if route.scope == "tenant" else None
    rendered = [canonical_json(m) for m in messages]
    assert got.exact_key == digest("exact", route.name, model, canonical_list(rendered), params, tenant)
    earlier = range(len(messages) - 1)
    if route.semantic.context in ("semantic", "last_user_only"):
        earlier = [i for i in earlier if messages[i].get("role") in SYSTEM_ROLES]
    scope = digest("scope", route.name, model, params, canonical_list([rendered[i] for i in earlier]), tenant)
    assert got.scope_digest() == scope


def test_plain_messages_are_dicts_of_strings_only():
    from kvgate.middleware.canonical import plain_list

    assert plain_list([{"role": "user", "content": "x"}, {"role": "system", "content": ""}]) is not None
    assert plain_list([{"role": "user", "content": None}]) is None
    assert plain_list([{"role": "user", "content": [{"type": "text", "text": "x"}]}]) is None
    assert plain_list([{"role": "user", 1: "x"}]) is None
    assert plain_list(["user"]) is None
