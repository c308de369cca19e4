"""A replica's SSE stream as the relay reads it (middleware/forward/relay.py): cut into events, each
event's JSON read once (and again at the end only for an answer that is not plain text, which
LiteLLM's builder makes from every chunk), the bytes passed on unchanged unless they must change.

What is read: choice 0's text and finish reason (the answer to store, the conversation approximate
routing records), the first content token (`Router.first_token`), the usage, and error events
(a failed stream). What changes on the way: [DONE] is held back (the pipeline sends it once the
answer is stored), a usage chunk the client did not ask for is dropped, and after a mid-stream
resume each chunk is trimmed to what the client has not seen (kvgate.middleware.forward.resume) and re-encoded.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from kvgate.middleware.litellm_env import litellm  # noqa: F401  (before any import from litellm)

# isort: split
from litellm.types.utils import ModelResponseStream

from kvgate.middleware.answers import assemble
from kvgate.middleware.forward.resume import StreamResume
from kvgate.middleware.forward.sse_take import loops

# take(buffer, pos, end, sep, loads, wire) -> (pos, taken, first_id, finish, role, seen, pieces)
TakeRun = Callable[[bytes, int, int, bytes, Callable[[bytes], Any], list[bytes]], tuple[Any, ...]]
TAKE: TakeRun = loops().take  # C where built

# what SseParser's event handling returns for "this event goes on exactly as the replica sent it";
# made at run time so no other bytes object is this one (it is compared by identity)
_AS_IS = b"".join([b"as ", b"is"])


class ReplicaError(Exception):
    """A replica answered with an error (status_code None: no usable HTTP status)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class SseParser:
    """Follows one client stream through the replica's SSE bytes: cuts them into events, reads each
    event's JSON once and says which bytes go on to the client (as they came, unless a resumed
    stream's chunk had to be trimmed). [DONE] is held back (the pipeline sends it after storing)."""

    def __init__(self, strip_usage: bool, completions: bool = False, take: TakeRun | None = TAKE) -> None:
        """`take`: how a run of a chat stream's usual events is read (kvgate.middleware.forward.sse_take;
        None: every event by the general path)."""
        self._take = take
        self.resume = StreamResume()  # also keeps choice 0's text: the answer
        self.completions = completions  # /v1/completions events (choice text, not deltas)
        # a completions stream's events as the replica sent them (usage included), for a byte-exact replay
        self.events_raw: list[str] | None = [] if completions else None
        # each chunk's JSON as read (as trimmed, after a resume): bytes, which the garbage collector
        # never walks however long the stream, read again only for the rare answer that is not
        # plain text (`chunks`); the first chunk (the answer's id, model, time) is kept as read
        self._wire: list[bytes] = []
        self._head: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self.role: str | None = None
        self.plain = True  # one choice, text only, no logprobs: the answer is built without LiteLLM
        self.events = 0
        self.first_seen = False  # the first content token (or finish) came: the relay tells the router
        self.done = False  # the replica's [DONE] came: the stream has nothing more to say
        self._strip_usage = strip_usage
        self._buffer = b""
        self._sep: bytes | None = None

    def restart(self) -> None:
        """A re-issued stream begins (after StreamResume.restart): drop the dead one's partial event."""
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """Bytes read from the replica → the bytes to send on (b"" while an event is incomplete)."""
        buffer = self._buffer + data if self._buffer else data
        if self._sep is None:
            newline = buffer.find(b"\n")
            if newline < 0:
                self._buffer = buffer
                return b""
            self._sep = b"\r\n\r\n" if newline and buffer[newline - 1 : newline] == b"\r" else b"\n\n"
        sep = self._sep
        cut = buffer.rfind(sep)
        if cut < 0:  # no event is complete yet
            self._buffer = buffer
            return b""
        limit = cut + len(sep)
        self._buffer = buffer[limit:]  # after the last separator: an incomplete event, or b""
        # events passed on as they came (the usual case) are one slice of the read, not a join
        out: list[bytes] = []
        start = kept_from = 0
        runs = self._take is not None and self.events_raw is None and not self.resume.resumes
        while start < limit:
            if runs and self._head is not None:
                start = self._take_run(buffer, start, limit)  # the usual events: passed on as they came
                if start >= limit:
                    break
            end = buffer.find(sep, start, limit) + len(sep)
            body = buffer[start : end - len(sep)]
            if body[:6] == b"data: " and b"\n" not in body:  # the usual one-line event
                kept = self._chunk(body[6:].strip(), buffer[start:end] if self.events_raw is not None else None)
            else:
                kept = self._event(buffer[start:end])
            if kept is not _AS_IS:
                if start > kept_from:
                    out.append(buffer[kept_from:start])
                if kept:
                    out.append(kept)
                kept_from = end
            start = end
        if not out:
            return buffer[kept_from:limit]
        if limit > kept_from:
            out.append(buffer[kept_from:limit])
        return b"".join(out)

    def _take_run(self, buffer: bytes, start: int, limit: int) -> int:
        """The usual events from `start` on, read by `take` (kvgate.middleware.forward.sse_take)
        and folded into this parser's state as the general path would leave it; where the first
        event of another shape starts (or `limit`)."""
        assert self._take is not None
        pos, taken, first_id, finish, role, seen, pieces = self._take(
            buffer, start, limit, self._sep, orjson.loads, self._wire
        )
        if taken:
            self.events += taken
            self.resume.took(first_id, pieces)
            if finish is not None:
                self.finish = finish
            if self.role is None and role is not None:
                self.role = role
            if seen:
                self.first_seen = True
        return pos

    def _event(self, event: bytes) -> bytes | None:
        """Any event other than a one-line `data: ` one: what to send for it (_AS_IS: itself)."""
        data = _data(event)
        if data is None:  # a comment (keep-alive) or a field we do not read: passed on as is
            return _AS_IS
        return self._chunk(data, event)

    def _chunk(self, data: bytes, event: bytes | None) -> bytes | None:
        """One event's data → _AS_IS (send the event as it came), None (send nothing) or the
        bytes to send instead. `event`: the whole event, needed only for a completions stream's
        byte-exact replay (`events_raw`)."""
        if data == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ReplicaError("replica sent a stream event that is not JSON") from None
        if type(chunk) is not dict:  # orjson gives a JSON object as exactly a dict
            raise ReplicaError("replica sent a stream event that is not a JSON object")
        if "error" in chunk:  # vLLM / SGLang report a failure inside the stream
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            code = error.get("code")
            raise ReplicaError(
                f"replica failed mid-stream: {error.get('message')}", code if isinstance(code, int) else None
            )
        self.events += 1
        resumed = self.resume.resumes > 0
        if self.events_raw is not None and not resumed and event is not None:
            self.events_raw.append(event.decode("utf-8", "surrogatepass"))
        if resumed:
            chunk = self.resume.trim(chunk)  # Diverged when the retry says something else
            if chunk is None:
                return None
        else:
            self.resume.sent(chunk)
        if self._head is None:
            self._head = chunk
        self._wire.append(orjson.dumps(chunk) if resumed else data)
        rewrite = resumed
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
            if self._strip_usage:  # we asked for it; the client did not
                if not chunk.get("choices"):
                    return None
                chunk = {k: v for k, v in chunk.items() if k != "usage"}
                rewrite = True
        self._read_choices(chunk.get("choices") or [])
        return b"data: " + orjson.dumps(chunk) + self._sep if rewrite else _AS_IS  # type: ignore[operator]

    def _read_choices(self, choices: list[Any]) -> None:
        if not choices:
            return
        first = choices[0]
        if len(choices) > 1 or not isinstance(first, dict) or first.get("logprobs"):
            self.plain = False
            return
        delta = first.get("delta") or {}
        finish = first.get("finish_reason")
        if finish:
            self.finish = finish
        if self.role is None and delta.get("role"):
            self.role = delta["role"]
        if not self.first_seen and (delta.get("content") or delta.get("tool_calls") or first.get("text") or finish):
            self.first_seen = True

    def answer(self, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The full answer as a `chat.completion` dict, for the cache; None when the stream did
        not finish (no finish reason) or cannot be rebuilt."""
        if self._head is None:
            return None
        if self.completions:
            return self._completion()
        if not (self.plain and self.resume.spliceable):  # tool calls, several choices…: LiteLLM's builder
            return assemble([ModelResponseStream(**c) for c in self.chunks()], messages)
        if self.finish is None:
            return None
        head = self._head
        answer: dict[str, Any] = {
            "id": self.resume.stream_id or head.get("id"),
            "object": "chat.completion",
            "created": head.get("created"),
            "model": head.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": self.role or "assistant", "content": self.resume.sent_text},
                    "finish_reason": self.finish,
                }
            ],
        }
        if head.get("system_fingerprint"):
            answer["system_fingerprint"] = head["system_fingerprint"]
        if self.usage:
            answer["usage"] = self.usage
        return answer

    def chunks(self) -> list[dict[str, Any]]:
        """Every chunk of the stream as it was read (usage included; as trimmed after a resume),
        each with the stream's one id as it was given on the way (StreamResume.sent)."""
        resume, out = StreamResume(), []
        for raw in self._wire:
            chunk = orjson.loads(raw)
            resume.sent(chunk)
            out.append(chunk)
        return out

    def _completion(self) -> dict[str, Any] | None:
        """A completions stream as the `text_completion` answer it makes up, with the stream's
        own events (`_kvgate_sse`) for a replay byte for byte; None when it did not finish or
        holds what a text answer cannot (several choices, log-probabilities, a resumed splice)."""
        if self.finish is None or not self.plain or self.resume.resumes:
            return None
        head = self._head
        assert head is not None
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.resume.sent_text,
            "logprobs": None,
            "finish_reason": self.finish,
        }
        answer: dict[str, Any] = {
            "id": head.get("id"),
            "object": "text_completion",
            "created": head.get("created"),
            "model": head.get("model"),
            "choices": [choice],
        }
        if self.usage:
            answer["usage"] = self.usage
        answer["_kvgate_sse"] = list(self.events_raw or [])
        return answer


def _data(event: bytes) -> bytes | None:
    """The data of one SSE event (its `data:` lines joined), None when it has none."""
    if event.startswith(b"data:") and event.count(b"\n") <= 2:  # the usual one-line event
        return event[5:].strip()
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
