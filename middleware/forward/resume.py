"""Resuming a streamed answer on another replica after the first one died mid-stream.

Once a chunk has reached the client, failing over by starting again would send the start of the
answer twice. For a *deterministic* request (greedy decoding: `temperature` 0, one choice) every
healthy replica of the route produces the same text, so the backend re-issues the request and
`StreamResume` drops what the client already has: the re-issued stream must repeat the sent text
exactly, and only what follows it is passed on. If the retry says anything else before catching
up (another model version, a replica that is not deterministic after all), `Diverged` is raised
and the client gets a clean in-band error instead of a spliced answer.

Chunks are LiteLLM's objects (the LiteLLM path, kvgate.middleware.forward.litellm_call) or the replica's own JSON
decoded to dicts (the relay, kvgate.middleware.forward.relay); both are read and edited through `_get`/`_set`.
"""

from __future__ import annotations

from typing import Any


class Diverged(Exception):
    """The re-issued stream's text does not continue what the client was already sent."""


def resumable(params: dict[str, Any]) -> bool:
    """Only greedy, single-choice requests give the same text on every replica."""
    temperature = params.get("temperature")
    n = params.get("n")
    return temperature is not None and float(temperature) == 0.0 and n in (None, 1)


def _get(obj: Any, name: str) -> Any:
    """A field of a chunk part: a dict's key or an object's attribute (None when absent)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _set(obj: Any, name: str, value: Any) -> None:
    """Set a field; on a dict, None removes the key (as the wire format leaves unset fields out)."""
    if isinstance(obj, dict):
        if value is None:
            obj.pop(name, None)
        else:
            obj[name] = value
    else:
        setattr(obj, name, value)


def _delta(chunk: Any) -> Any:
    choices = _get(chunk, "choices") or []
    return _get(choices[0], "delta") if choices else None


def _text_field(chunk: Any) -> tuple[Any, str]:
    """Where choice 0's new text sits: a chat chunk's `delta.content`, a completions chunk's
    `text` ((None, "") when the chunk has neither)."""
    choices = _get(chunk, "choices") or []
    if not choices:
        return None, ""
    delta = _get(choices[0], "delta")
    if delta is not None:
        return delta, "content"
    if isinstance(_get(choices[0], "text"), str):
        return choices[0], "text"
    return None, ""


def _plain(chunk: Any) -> bool:
    """A chunk we know how to splice: only role / text content on choice 0."""
    choices = _get(chunk, "choices") or []
    if len(choices) > 1:
        return False
    delta = _delta(chunk)
    return delta is None or not (_get(delta, "tool_calls") or _get(delta, "function_call"))


class StreamResume:
    """Follows one client stream: what was sent, and what a re-issued stream must skip."""

    def __init__(self) -> None:
        # content of choice 0 the client has received (`sent_text`): the pieces as they came,
        # joined when read, so a long stream costs linear time, not a copy of the text per piece
        self._text = ""
        self._pieces: list[str] = []
        self.stream_id: str | None = None
        self.spliceable = True  # False once a chunk we cannot splice (tool calls…) was sent
        self._skip = ""  # sent text the current re-issued stream has not yet repeated
        self.resumes = 0

    @property
    def sent_text(self) -> str:
        """Choice 0's content the client has received, in order."""
        if self._pieces:
            self._text += "".join(self._pieces)
            self._pieces.clear()
        return self._text

    def sent(self, chunk: Any) -> Any:
        """Record a chunk on its way to the client (and give it the stream's first id)."""
        if type(chunk) is dict and self._sent_wire(chunk):
            return chunk
        if self.stream_id is None:
            self.stream_id = _get(chunk, "id")
        elif _get(chunk, "id") is not None:
            _set(chunk, "id", self.stream_id)  # one id per client stream, whichever replica wrote it
        self.spliceable = self.spliceable and _plain(chunk)
        holder, key = _text_field(chunk)
        content = _get(holder, key) if holder is not None else None
        if isinstance(content, str):
            self._pieces.append(content)
        return chunk

    def took(self, first_id: Any, pieces: list[str]) -> None:
        """`sent` for a run of chunks their reader already took apart, of the usual shape (choice
        0 alone, its delta an object without tool calls): the first of their ids that is not None
        (None: none has one) and the text of each whose content is a str, in order.
        Invariant: the state it leaves is the one `sent` leaves for those chunks, one by one."""
        if self.stream_id is None:
            self.stream_id = first_id
        self._pieces.extend(pieces)

    def _sent_wire(self, chunk: dict[str, Any]) -> bool:
        """`sent` for the relay's chunks (JSON objects, every part a dict), read without the
        dict-or-object accessors, which cost more than the rest of an event on a long stream;
        False, having changed nothing, when a part is of another shape (the general path reads it).
        Invariant: where it returns True, the state it leaves is the general path's."""
        choices = chunk.get("choices")
        first = None
        if choices:
            if type(choices) is not list or type(choices[0]) is not dict:
                return False
            first = choices[0]
        delta = first.get("delta") if first is not None else None
        if delta is not None and type(delta) is not dict:
            return False
        chunk_id = chunk.get("id")
        if self.stream_id is None:
            self.stream_id = chunk_id
        elif chunk_id is not None:
            chunk["id"] = self.stream_id  # one id per client stream, whichever replica wrote it
        if first is None:
            return True
        if len(choices) > 1 or (delta is not None and (delta.get("tool_calls") or delta.get("function_call"))):
            self.spliceable = False
        content = delta.get("content") if delta is not None else first.get("text")
        if isinstance(content, str):
            self._pieces.append(content)
        return True

    def restart(self) -> None:
        """A re-issued stream begins: it must first repeat everything sent so far."""
        self._skip = self.sent_text
        self.resumes += 1

    def trim(self, chunk: Any) -> Any | None:
        """The part of a re-issued stream's chunk the client has not seen (None: nothing new)."""
        if not self._skip:
            return self.sent(chunk)
        if not _plain(chunk):
            raise Diverged("the retried stream carries tool calls where text was expected")
        holder, key = _text_field(chunk)
        content = _get(holder, key) if holder is not None else None
        content = content if isinstance(content, str) else ""
        n = min(len(content), len(self._skip))
        if content[:n] != self._skip[:n]:
            raise Diverged("the retried stream's text differs from what was already sent")
        self._skip = self._skip[n:]
        rest = content[n:]
        choices = _get(chunk, "choices") or []
        finish = _get(choices[0], "finish_reason") if choices else None
        if self._skip and finish is not None:
            raise Diverged("the retried stream ended before repeating what was already sent")
        if not choices:  # a usage-only chunk while still catching up: the final one comes later
            return None
        if not rest and finish is None:
            return None
        if holder is not None:
            _set(holder, key, rest)
            if key == "content" and _get(holder, "role") is not None:
                _set(holder, "role", None)  # the client already had the role in the first chunk
        return self.sent(chunk)
