"""Fast paths on the relay's per-request work give what the general code gives: a stream's chunks
read as plain dicts (StreamResume), a message written as canonical JSON."""

from __future__ import annotations

import copy
import json

from hypothesis import example, given, settings
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


_sse_delta = st.one_of(
    st.none(),
    st.text(max_size=3),
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["assistant", None, "", 3]),
            "content": _text,
            "tool_calls": st.one_of(st.none(), st.just([]), st.just([{"index": 0, "id": "t", "function": {}}])),
            "function_call": st.one_of(st.none(), st.just({"name": "f"})),
        },
    ),
)
_sse_choice = st.one_of(
    st.just("x"),
    st.fixed_dictionaries(
        {},
        optional={
            "index": st.just(0),
            "delta": _sse_delta,
            "text": _text,
            "finish_reason": st.sampled_from([None, "stop", "", 1]),
            "logprobs": st.sampled_from([None, {"content": []}, {}]),
        },
    ),
)
_sse_chunk = st.fixed_dictionaries(
    {},
    optional={
        "id": st.sampled_from([None, "a", "b"]),
        "choices": st.one_of(st.none(), st.lists(_sse_choice, max_size=2), st.just({})),
        "usage": st.sampled_from([None, {}, {"prompt_tokens": 1, "completion_tokens": 2}]),
    },
)


def _takes():
    """The run readers to hold to the general path: the Python twin, and the C one where built."""
    from kvgate.middleware.forward import sse_take

    return [sse_take.python_loops().take] + ([sse_take.loops().take] if sse_take.loops() is not sse_take else [])


@settings(max_examples=600, deadline=None)
@given(st.lists(_sse_chunk, min_size=1, max_size=6), st.booleans(), st.booleans())
@example(  # a choice's text where its delta has no content still counts as the first token
    chunks=[{"id": "a", "choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {}, "text": "t"}]}],
    strip_usage=True,
    one_read=False,
)
def test_a_streams_usual_events_leave_the_general_paths_state(chunks, strip_usage, one_read):
    """SseParser's one-pass reading of a chat stream's usual event gives the bytes and the state
    (answer text, id, finish, role, first token, chunks) that its general path gives."""
    from kvgate.middleware.forward.relay_events import SseParser

    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
    for take in _takes():
        _same_as_the_general_path(events, strip_usage, one_read, SseParser(strip_usage, take=take))


def _same_as_the_general_path(events, strip_usage, one_read, fast):
    from kvgate.middleware.forward.relay_events import SseParser

    general = SseParser(strip_usage, take=None)  # every event by the general path
    outs = []
    for parser in (fast, general):
        try:
            reads = [b"".join(events)] if one_read else events
            for read in reads:  # the state after each read, not only at the end (first_seen sticks)
                outs.append((parser.feed(read), parser.done, parser.events, parser.finish, parser.role, parser.plain))
                outs.append((parser.first_seen, parser.resume.stream_id, parser.resume.spliceable))
            outs.append((parser.first_seen, parser.usage, parser.resume.sent_text, parser.resume.stream_id))
            answer = parser.answer([{"role": "user", "content": "q"}])
            if answer is not None and not (parser.plain and parser.resume.spliceable):  # LiteLLM's builder
                answer = {k: v for k, v in answer.items() if k not in ("id", "created")}  # made up per call
            outs.append((parser.resume.spliceable, parser.chunks(), answer))
        except Exception as exc:  # noqa: BLE001  (both paths must fail alike)
            outs.append(type(exc))
    half = len(outs) // 2
    assert outs[:half] == outs[half:]


_odd_event = st.sampled_from(
    [
        b"data: {not json",
        b'data: {"error": {"message": "engine died", "code": 500}}',
        b": keep-alive",
        b'data: {"choices": [{"delta": {"content": "a"}}]}\ndata: ',  # two data lines: one event
        b'data:  {"choices": [{"delta": {"content": " b"}, "finish_reason": null}]}  ',
        b"data: [DONE]",
        b"data: 7",
        b"event: ping",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(_sse_chunk.map(lambda c: b"data: " + json.dumps(c).encode()), _odd_event), min_size=1, max_size=8
    ),
    st.sampled_from([b"\n\n", b"\r\n\r\n"]),
    st.lists(st.integers(0, 400), max_size=5),
    st.booleans(),
)
def test_any_stream_cut_anywhere_reads_as_the_general_path_reads_it(bodies, sep, cuts, strip_usage):
    """Events of any shape (bad JSON, errors, comments, multi-line, [DONE] early), either
    separator, the bytes cut at any points: the run readers leave what the general path leaves."""
    from kvgate.middleware.forward.relay_events import SseParser

    if sep == b"\r\n\r\n":
        bodies = [b.replace(b"\n", b"\r\n") for b in bodies]
    whole = b"".join(b + sep for b in bodies) + b"data: [DONE]" + sep
    points = sorted({min(c, len(whole)) for c in cuts})
    reads = [whole[a:b] for a, b in zip([0, *points], [*points, len(whole)]) if whole[a:b]]
    for take in _takes():
        _same_as_the_general_path(reads, strip_usage, False, SseParser(strip_usage, take=take))


def test_the_c_run_reader_is_built_where_it_can_be():
    import shutil
    import sysconfig
    from pathlib import Path

    from kvgate.middleware.forward import sse_take

    if sse_take.loops() is sse_take.python_loops():
        cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
        if shutil.which(cc) and Path(sysconfig.get_paths()["include"], "Python.h").exists():
            raise AssertionError("a C compiler and Python's headers are here but _sse_take was not built")
        return  # no compiler: the Python twin reads the streams, with the same results
    assert sse_take.loops().__name__ == "kvgate.middleware.forward._sse_take"
