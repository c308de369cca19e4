"""Answer text as it is decoded: token ids → text pieces (Detokenizer), and what of that text
may be released before a stop string could still match (StopMatcher)."""

from __future__ import annotations

from typing import Any, Sequence


class Detokenizer:
    """Incremental ids → text (vLLM's prefix/read offsets): a piece is released only once it
    decodes without a trailing replacement character, so multi-byte characters are never split."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, token: int) -> str:
        """Append one id; returns the text it completes ("" while a character is still partial)."""
        self.ids.append(token)
        decode = self._tok.decode
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        after = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        return ""


class StopMatcher:
    """Text so far, what may be released, and whether a stop string ended it. Released text
    never contains a stop string nor any part of one (a suffix that could begin one is held)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.released = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add decoded text; returns the newly releasable part."""
        if self.stopped or not piece:
            return ""
        start = max(0, len(self.text) - self._longest + 1)  # a new match ends inside `piece`
        self.text += piece
        if self.stops:
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return self.flush()
        safe = len(self.text) - self._held_back()
        out = self.text[self.released : safe]
        self.released = max(self.released, safe)
        return out

    def flush(self) -> str:
        """Release whatever is held (the answer ended without completing a stop string)."""
        out = self.text[self.released :]
        self.released = len(self.text)
        return out

    def _held_back(self) -> int:
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
