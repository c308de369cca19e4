"""validate_messages: whatever path a list takes (the usual shape's C-speed check or the loop), the
result is the rule's: plain dict copies, or the BadRequest naming the first bad field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from kvgate.middleware.errors import BadRequest
from kvgate.middleware.request import ROLES, forwarded_params, validate_messages


class Message(BaseModel):  # what an SDK caller may pass instead of a dict
    role: str
    content: str | None = None


ROLE = st.one_of(st.sampled_from(sorted(ROLES)), st.sampled_from(["bot", "", None]), st.just(["user"]))
CONTENT = st.one_of(
    st.text(max_size=5), st.none(), st.just([{"type": "text", "text": "hi"}]), st.integers(), st.just({"text": "x"})
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT}),
    st.fixed_dictionaries({"role": ROLE}, optional={"tool_calls": st.just([{"id": "t"}]), "name": st.text(max_size=3)}),
    st.builds(Message, role=st.sampled_from(sorted(ROLES)), content=st.one_of(st.text(max_size=5), st.none())),
    st.sampled_from(["user", 3, None]),
)


def rule(messages):
    """The shape's rules, one message at a time: (the copies, None) or (None, (message, param))."""
    if not isinstance(messages, list) or not messages:
        return None, ("`messages` must be a non-empty list", "messages")
    out = []
    for i, msg in enumerate(messages):
        if isinstance(msg, BaseModel):
            msg = msg.model_dump(exclude_none=True)
        if not isinstance(msg, dict):
            return None, (f"messages[{i}] must be an object", f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            return None, (f"messages[{i}].role must be one of", f"messages[{i}].role")
        content = msg.get("content")
        if content is None and role != "assistant":
            return None, (f"messages[{i}].content is required", f"messages[{i}].content")
        if content is not None and not isinstance(content, (str, list)):
            return None, (f"messages[{i}].content must be a string or a list of parts", f"messages[{i}].content")
        out.append(dict(msg))
    return out, None


@settings(max_examples=600, deadline=None)
@given(messages=st.one_of(st.lists(MESSAGE, max_size=6), st.none(), st.just("hi")))
def test_validate_messages_follows_the_rules_on_every_path(messages):
    expected, refusal = rule(messages)
    if refusal is None:
        got = validate_messages(messages)
        assert got == expected and all(type(m) is dict for m in got)
        originals = [m for m in messages if isinstance(m, dict)]
        assert not any(g is m for g in got for m in originals)  # copies: the caller's dicts stay its own
    else:
        with pytest.raises(BadRequest) as caught:
            validate_messages(messages)
        assert str(caught.value).startswith(refusal[0]) and caught.value.param == refusal[1]


def test_the_usual_shape_comes_back_as_copies():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q", "name": "n"}]
    got = validate_messages(messages)
    got[0]["content"] = "changed"
    assert got == [{"role": "system", "content": "changed"}, {"role": "user", "content": "q", "name": "n"}]
    assert messages[0]["content"] == "s"


def test_forwarded_params_keep_their_order_and_drop_unset():
    assert forwarded_params({"model": "m", "temperature": 0}) == {}
    kwargs = {"user": "u", "metadata": None, "stream_options": {"include_usage": True}, "model": "m"}
    assert list(forwarded_params(kwargs).items()) == [("stream_options", {"include_usage": True}), ("user", "u")]
