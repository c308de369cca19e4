"""A chat stream's usual events, taken in a run: the relay's per-event work on a streamed answer.

Most events of a relayed chat stream have one shape: a one-line `data: ` event whose JSON object
has one choice, its delta an object without tool calls, no log-probabilities, no usage and no
error. The relay passes such an event on as it came and keeps only a few facts from it (its text,
finish reason, role, id). `take` reads a run of them in one call and stops at the first event of
any other shape, which the caller's general path reads (kvgate.middleware.forward.relay_events).

It exists twice: here in Python, and in `_sse_take.c`, a C extension with the same name and
contract that `pip install` builds where a C compiler is found (setup.py; optional, and this
module stands in where it was not built). `loops()` gives the C one when it imports.
tests/test_wire_fast_paths.py holds both to the general path's bytes and state.

May import: the standard library and kvgate.index.kv.native (which twin runs).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable

from kvgate.index.kv.native import twin

_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


def take(
    buffer: bytes, pos: int, end: int, sep: bytes, loads: Callable[[bytes], Any], wire: list[bytes]
) -> tuple[int, int, Any, Any, Any, bool, list[str]]:
    """Read the usual events of `buffer[pos:end]` (whole events, each ending with `sep`) until
    one of another shape: (where that one starts, or `end`; events taken; the first id that is
    not None; the last truthy finish reason; the first truthy delta role; whether any taken event
    carried a first token (truthy content, finish reason or choice text); the text of each delta
    whose content is a str, in order). Each taken event's data (after `data: `, stripped) is
    appended to `wire`.

    Invariant: an event is taken only if the general path would pass it on unchanged, and what
    is returned is what that path learns from the same events read one by one. Nothing raises
    for a malformed event: it stops the run, and the general path reads it (and raises)."""
    taken = 0
    first_id = finish = role = None
    seen = False
    pieces: list[str] = []
    step = len(sep)
    while pos < end:
        stop = buffer.find(sep, pos, end)
        if stop < 0:
            break
        body = buffer[pos:stop]
        if body[:6] != b"data: " or b"\n" in body:
            break
        data = body[6:].strip(_WHITESPACE)
        if data == b"[DONE]":
            break
        try:
            chunk = loads(data)
        except Exception:  # noqa: BLE001  (the general path reads it again and says what is wrong)
            break
        if type(chunk) is not dict or "error" in chunk:
            break
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1 or chunk.get("usage"):
            break
        first = choices[0]
        if type(first) is not dict or first.get("logprobs"):
            break
        delta = first.get("delta")
        if type(delta) is not dict or delta.get("tool_calls") or delta.get("function_call"):
            break
        taken += 1
        content, reason = delta.get("content"), first.get("finish_reason")
        if first_id is None:
            first_id = chunk.get("id")
        if isinstance(content, str):
            pieces.append(content)
        wire.append(data)
        if reason:
            finish = reason
        if role is None and delta.get("role"):
            role = delta["role"]
        if not seen and (content or reason or first.get("text")):
            seen = True
        pos = stop + step
    return pos, taken, first_id, finish, role, seen, pieces


def python_loops() -> ModuleType:
    """This module: `take` in Python."""
    return sys.modules[__name__]


def loops() -> ModuleType:
    """The C `take` when the extension was built, else the Python one."""
    return twin("kvgate.middleware.forward._sse_take", __name__)
