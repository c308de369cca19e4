"""Fast paths on the relay's per-request work give what the general code gives: a stream's chunks
read as plain dicts (StreamResume), a message written as canonical JSON."""

from __future__ import annotations

import copy
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.middleware.canonical import canonical_json
from kvgate.middleware.forward.resume import StreamResume


class _Chunk(dict):
    """A dict the fast path does not take (it checks the exact type): the general path's input."""


def _general(value):
    if isinstance(value, dict):
        return _Chunk({k: _general(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_general(v) for v in value]
    return value


_text = st.one_of(st.none(), st.text(max_size=6), st.integers(-2, 2))
_delta = st.one_of(
    st.none(),
    st.text(max_size=3),  # not an object: the general path's to read
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["assistant", None]),
            "content": _text,
            "tool_calls": st.one_of(st.none(), st.just([]), st.just([{"index": 0}])),
            "function_call": st.one_of(st.none(), st.just({"name": "f"})),
        },
    ),
)
_choice = st.fixed_dictionaries(
    {}, optional={"index": st.just(0), "delta": _delta, "text": _text, "finish_reason": st.sampled_from([None, "stop"])}
)
_chunk = st.fixed_dictionaries(
    {},
    optional={
        "id": st.sampled_from([None, "a", "b"]),
        "choices": st.one_of(st.none(), st.lists(_choice, max_size=2), st.just([]), st.just(["x"])),
        "usage": st.none(),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_chunk, max_size=6))
def test_plain_dict_chunks_leave_the_general_paths_state(chunks):
    fast, general = StreamResume(), StreamResume()
    out_fast, out_general = [], []
    for chunk in chunks:
        a, b = copy.deepcopy(chunk), _general(copy.deepcopy(chunk))
        try:
            out_general.append(dict(general.sent(b)))
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            out_general.append(type(exc))
        try:
            out_fast.append(dict(fast.sent(a)))
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            out_fast.append(type(exc))
    assert out_fast == out_general
    assert (fast.sent_text, fast.stream_id, fast.spliceable) == (
        general.sent_text,
        general.stream_id,
        general.spliceable,
    )


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.text(max_size=12), max_size=4))
def test_a_flat_string_message_is_json_dumps_byte_for_byte(message):
    want = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    assert canonical_json(message) == want
