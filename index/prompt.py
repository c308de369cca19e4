"""Prompt → chained block hashes, reusing earlier work so cost grows with the new turn.

Two caches, both keyed by content digests (never by object identity):
- segment text → token ids (earlier turns are the same segments every time);
- chain state after a run of segments → (block hashes so far, unhashed tail tokens), keyed by a
  running digest of the segment texts. A request whose first k segments were seen before resumes
  hashing from there: block_hashes(a + b) == block_hashes(a) + block_hashes(tail + b, parent)
  (see index.hashing), so resuming gives exactly the hashes of a full recomputation.

A third, lighter memory serves a caller deciding *where* to hash (middleware.offload):
`uncached_chars(messages)` says how many characters follow the longest leading run of messages
this hasher has hashed before, from digests of the raw messages (no rendering, no tokenising).

`prompt()` also hands back the chain states it passed (`PromptHashes.states`): a caller that will
soon hash a longer conversation starting with the same segments (the router: prompt + answer)
passes them as `known` and resumes from there even if the shared caches evicted them meanwhile.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from index.hashing import DEFAULT_SEED, BlockHash, block_hashes
from index.tokenizer import ChatTokenizer, content_text


class _LRU(OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get_touch(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


ChainState = tuple[tuple[BlockHash, ...], tuple[int, ...]]  # (block hashes so far, unhashed tail tokens)


@dataclass(frozen=True)
class PromptHashes:
    """A prompt's block hashes and token count, plus the chain state after each of its segment
    runs this call hashed or resumed from (key: the run's running digest)."""

    hashes: list[BlockHash]
    tokens: int
    states: Mapping[bytes, ChainState] = field(default_factory=dict, repr=False)


class PromptHasher:
    """Block hashes of chat prompts for one (tokenizer, block_size, seed, extra) setting."""

    def __init__(self, tokenizer: ChatTokenizer, block_size: int = 16, seed: str = DEFAULT_SEED,
                 extra: Sequence[str | int] = (), cache_size: int = 2048) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.seed = seed
        self.extra = tuple(extra)
        self._segments = _LRU(cache_size)
        self._chains = _LRU(cache_size)
        self._seen = _LRU(cache_size)  # running digests of leading message runs hashed so far
        self._lock = threading.Lock()

    def tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        out: list[int] = []
        for seg in self.tokenizer.segments(messages):
            out.extend(self._encode(seg))
        return out

    def hashes(self, messages: Sequence[dict[str, Any]]) -> tuple[list[BlockHash], int]:
        """(block hashes of the rendered prompt, its token count)."""
        out = self.prompt(messages)
        return out.hashes, out.tokens

    def prompt(self, messages: Sequence[dict[str, Any]], known: PromptHashes | None = None) -> PromptHashes:
        """The prompt's hashes, resuming from the longest run of leading segments whose chain
        state is in `known` (an earlier prompt of the same conversation) or in the cache."""
        segments = self.tokenizer.segments(messages)
        digests = []
        d = hashlib.sha256(f"{self.block_size}:{self.seed}:{self.extra}".encode()).digest()
        for seg in segments:
            d = hashlib.sha256(d + seg.encode()).digest()
            digests.append(d)
        pinned = known.states if known is not None else {}
        # resume from the longest run of segments already hashed
        start, hashes, tail = 0, [], []
        states: dict[bytes, ChainState] = {}
        with self._lock:
            for k in range(len(digests) - 1, -1, -1):
                state = pinned.get(digests[k]) or self._chains.get_touch(digests[k])
                if state is not None:
                    start = k + 1
                    hashes, tail = list(state[0]), list(state[1])
                    states[digests[k]] = state
                    break
        for k in range(start, len(segments)):
            tail.extend(self._encode(segments[k]))
            full = len(tail) - len(tail) % self.block_size
            if full:
                parent = hashes[-1] if hashes else None
                hashes.extend(block_hashes(tail[:full], self.block_size, parent, self.extra, self.seed))
                tail = tail[full:]
            state = (tuple(hashes), tuple(tail))
            states[digests[k]] = state
            with self._lock:
                self._chains.put(digests[k], state)
        runs = message_runs(messages)
        with self._lock:
            for run in runs:
                self._seen.put(run, True)
        return PromptHashes(hashes, len(hashes) * self.block_size + len(tail), states)

    def uncached_chars(self, messages: Sequence[dict[str, Any]]) -> int:
        """Characters of content after the longest leading run of `messages` that an earlier
        `prompt()` call hashed (all of them for a new conversation): the part a `prompt()` of
        these messages would tokenise anew, estimated without rendering or tokenising.

        Invariant: 0 ≤ result ≤ total content characters; the total when nothing was seen."""
        runs = message_runs(messages)
        with self._lock:
            known = next((k + 1 for k in range(len(runs) - 1, -1, -1) if runs[k] in self._seen), 0)
        return sum(len(content_text(m.get("content"))) for m in messages[known:])

    def _encode(self, segment: str) -> list[int]:
        with self._lock:
            ids = self._segments.get_touch(segment)
        if ids is None:
            ids = self.tokenizer.encode(segment)
            with self._lock:
                self._segments.put(segment, ids)
        return ids


def message_runs(messages: Sequence[dict[str, Any]]) -> list[bytes]:
    """Running digests of the leading runs of raw messages: entry k covers messages[:k+1].

    Invariant: two message lists share entry k exactly when (barring a hash collision) their
    first k+1 messages have the same roles and content texts; O(characters) at C speed."""
    out: list[bytes] = []
    d = b""
    for m in messages:
        h = hashlib.sha256(d)
        h.update(f"{m.get('role', 'user')}\0".encode("utf-8", "surrogatepass"))
        h.update(content_text(m.get("content")).encode("utf-8", "surrogatepass"))
        d = h.digest()
        out.append(d)
    return out
