"""The fast body check (kvgate.middleware.server.schema_check) passes only what the pydantic model
passes, declares every field the model declares, and passes the usual bodies (so it is used)."""

from __future__ import annotations

import copy
import typing

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from kvgate.middleware.server import schema as models
from kvgate.middleware.server import schema_check as checks
from kvgate.middleware.server.schema import ChatCompletionRequest
from kvgate.middleware.server.schema_check import passes

POOL = st.sampled_from(
    [None, True, False, 0, 1, 2, 16, 17, 128, 129, -1, -2, -3, 0.0, 0.5, 1.5, 2.5, -2.5, 1_000_000, 1_000_001]
    + [2**63, 2**64, 2**70, "", "x", "text", "function", "auto", "none", "required", "user", "assistant"]
    + ["system", "developer", "tool", "bogus", [], [""], ["a"], {}, {"a": 1}]
)


def _obj(required: dict, optional: dict) -> st.SearchStrategy:
    """Objects with the fields' values valid or not, each field present or not, plus a stray one."""
    optional = {**optional, "extra_field": POOL}
    return st.one_of(
        st.fixed_dictionaries(required, optional=optional), st.fixed_dictionaries({}, optional={**required, **optional})
    )


def _or_pool(s: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(s, POOL)


_text = _or_pool(st.text(max_size=3))
_function_def = _obj(
    {"name": _text}, {"description": _text, "parameters": _or_pool(st.dictionaries(st.text(max_size=2), POOL))}
)
_tool = _obj({"type": _or_pool(st.just("function")), "function": _or_pool(_function_def)}, {})
_function_call = _obj({"name": _text, "arguments": _text}, {})
_tool_call = _obj({"id": _text, "function": _or_pool(_function_call)}, {"type": _or_pool(st.just("function"))})
_named_valid = st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=3)})}
)
_named = _obj({"type": _or_pool(st.just("function")), "function": _or_pool(_obj({"name": _text}, {}))}, {})
_part = _obj({"type": _or_pool(st.sampled_from(["text", "image_url"]))}, {"text": _text})
_message = _obj(
    {"role": _or_pool(st.sampled_from(["user", "assistant", "system"]))},
    {
        "content": _or_pool(st.one_of(st.text(max_size=3), st.lists(_or_pool(_part), max_size=2))),
        "tool_calls": _or_pool(st.lists(_or_pool(_tool_call), max_size=2)),
        "tool_call_id": _text,
        "name": _text,
    },
)
_number = _or_pool(st.floats(-3, 3, allow_nan=False) | st.integers(-3, 20))
_chat = _obj(
    {"model": _text, "messages": _or_pool(st.lists(_or_pool(_message), max_size=3))},
    {
        "stream": POOL,
        "temperature": _number,
        "top_p": _number,
        "max_tokens": _or_pool(st.integers(-1, 2_000_000)),
        "max_completion_tokens": _or_pool(st.integers(-1, 2_000_000)),
        "n": _number,
        "stop": _or_pool(st.lists(_or_pool(st.text(max_size=2)), max_size=2)),
        "seed": _or_pool(st.integers(-(2**70), 2**70)),
        "presence_penalty": _number,
        "frequency_penalty": _number,
        "user": _text,
        "stream_options": _or_pool(st.dictionaries(st.text(max_size=2), POOL)),
        "tools": _or_pool(st.lists(_or_pool(_tool), max_size=2)),
        "tool_choice": _or_pool(_named),
        "response_format": POOL,
    },
)


_short = st.text(max_size=3)
_word = st.text(min_size=1, max_size=3)
_any_dict = st.dictionaries(st.text(max_size=2), st.one_of(st.none(), st.integers(), _short), max_size=2)
_v_function_def = st.fixed_dictionaries(
    {"name": _word}, optional={"description": st.none() | _short, "parameters": st.none() | _any_dict}
)
_v_tool = st.fixed_dictionaries({"type": st.just("function"), "function": _v_function_def})
_v_tool_call = st.fixed_dictionaries(
    {"id": _short, "function": st.fixed_dictionaries({"name": _short, "arguments": _short})},
    optional={"type": st.just("function")},
)
_v_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _short}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": _any_dict}, optional={"text": st.none()}),
)
_v_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])},
    optional={
        "content": st.none() | _short | st.lists(_v_part, min_size=1, max_size=2),
        "tool_calls": st.none() | st.lists(_v_tool_call, max_size=2),
        "tool_call_id": st.none() | _short,
        "name": st.none() | _short,
    },
)
_v_chat = st.fixed_dictionaries(
    {"model": _word, "messages": st.lists(_v_message, min_size=1, max_size=3)},
    optional={
        "stream": st.booleans(),
        "temperature": st.none() | st.floats(0, 2) | st.integers(0, 2),
        "top_p": st.none() | st.floats(0, 1) | st.integers(0, 1),
        "max_tokens": st.none() | st.integers(1, 1_000_000),
        "max_completion_tokens": st.none() | st.integers(1, 1_000_000),
        "n": st.none() | st.integers(1, 16),
        "stop": st.none() | _short | st.lists(_short, max_size=2),
        "seed": st.none() | st.integers(-(2**63), 2**63 - 1),
        "presence_penalty": st.none() | st.floats(-2, 2),
        "frequency_penalty": st.none() | st.floats(-2, 2),
        "user": st.none() | _short,
        "stream_options": st.none() | _any_dict,
        "tools": st.none() | st.lists(_v_tool, max_size=2),
        "tool_choice": st.none() | st.sampled_from(["none", "auto", "required"]) | _named_valid,
        "response_format": st.none() | _any_dict,
        "logit_bias": _any_dict,
    },
)
EDGES = [16.5, 2.0001, -0.0001, 1.0001, -2.0001, 1_000_001, 0, 17, 2**64, 2**70, "", None, True, [], {}, "bogus"]


def _places(value, path=()):
    """Every place in a body (a key of an object, an item of a list) with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from _places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*path, i)
            yield from _places(item, (*path, i))


def _perturbed(body, draw):
    """The body with one to three places set to an edge value or taken out."""
    places = list(_places(body))
    for _ in range(draw(st.integers(1, 3))):
        if not places:
            break
        path = draw(st.sampled_from(places))
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(EDGES) | POOL))  # the pools stay as they are
        places = list(_places(body))
    return body


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_v_chat, st.data())
def test_a_valid_body_changed_in_a_few_places_passes_the_fast_check_only_if_the_model_passes_it(body, data):
    assert passes(body, ChatCompletionRequest) and _accepted(body), body  # the generator's own bodies
    body = _perturbed(body, data.draw)
    if passes(body, ChatCompletionRequest):
        assert _accepted(body), body


def _accepted(body: dict) -> bool:
    try:
        ChatCompletionRequest.model_validate(body)
    except ValidationError:
        return False
    return True


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_chat)
def test_what_the_fast_check_passes_the_model_passes(body):
    if passes(body, ChatCompletionRequest):
        assert _accepted(body), body


def _fields(model: typing.Any) -> dict[str, typing.Any]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {name: field.annotation for name, field in model.model_fields.items()}
    return typing.get_type_hints(model, include_extras=True)


def _classes(annotation: typing.Any) -> set[type]:
    """The model or Struct classes an annotation names, however nested (lists, unions, Annotated)."""
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or issubclass(annotation, msgspec.Struct)):
        return {annotation}
    return {c for arg in typing.get_args(annotation) for c in _classes(arg)}


def test_every_field_of_the_model_is_restated_at_every_level():
    pending = list(checks.STRUCTS.items())
    seen = set()
    while pending:
        model, struct = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        theirs, ours = _fields(model), _fields(struct)
        assert set(theirs) == set(ours), (model.__name__, set(theirs) ^ set(ours))
        for name, annotation in theirs.items():
            nested = {c.__name__: c for c in _classes(annotation)}
            mine = {c.__name__: c for c in _classes(ours[name])}
            assert set(nested) == set(mine), (model.__name__, name)
            pending += [(nested[n], mine[n]) for n in nested]
    assert {m.__name__ for m in seen} >= {"ChatCompletionRequest", "ChatMessage", "ContentPart", "Tool", "ToolCall"}
    assert models.ChatCompletionRequest in checks.STRUCTS


USUAL = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "top_p": 1,
        "max_tokens": 64,
        "n": 1,
        "stop": ["\n"],
        "seed": 7,
        "user": "u",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_object"},
        "logit_bias": {"1": 2},
    },
]


@pytest.mark.parametrize("body", USUAL)
def test_the_usual_bodies_take_the_fast_check(body):
    assert passes(body, ChatCompletionRequest)
    assert _accepted(body)


def test_a_schema_without_a_restatement_is_left_to_pydantic():
    assert not passes({"request_id": "r", "correct": True}, models.FeedbackRequest)


NUMBERS = [-3, -2.0001, -2, -1, -0.0001, 0, 0.5, 1, 1.0001, 2, 2.0001, 3, 16, 16.5, 17, 20, 128, 129]
NUMBERS += [999_999, 1_000_000, 1_000_001, 2**63, 2**64, True, False, None, "1"]


@pytest.mark.parametrize(
    "field",
    [
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "seed",
        "presence_penalty",
        "frequency_penalty",
    ],
)
def test_each_numeric_field_at_its_bounds(field):
    for value in NUMBERS:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
        if passes(body, ChatCompletionRequest):
            assert _accepted(body), (field, value)
