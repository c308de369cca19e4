"""A prompt's hashes as `PromptHasher.prompt` hands them back, whole or partial.

A partial result keeps what its hasher needs to finish it (`Rest`): the chain state to resume
from and the segments after it, each as packed token ids, or, for a long segment only a lead of
which was tokenised (kvgate.index.kv.tokenizer_light.lead_ids), as its text. Its token count is
then an estimate until `complete()` tokenises the rest.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from kvgate.index.kv.hashing import BlockHash

# (the block hashes so far as 8-byte digests end to end, the unhashed tail's packed tokens): bytes,
# so a state is copied, stored and freed at C speed however long the conversation
ChainState = tuple[bytes, bytes]


class Finisher(Protocol):
    """What finishes a partial prompt: its hasher (kvgate.index.kv.prompt.PromptHasher)."""

    block_size: int

    def finish(self, rest: "Rest", states: dict[bytes, ChainState]) -> tuple[list[BlockHash], int]: ...


@dataclass
class Left:
    """A segment a partial prompt has not hashed: its running digest and packed ids, or its text
    (`text` set: tokenised by `complete()`, whose ids must start with `lead`, the ids the
    partial hashes were made from)."""

    digest: bytes
    packed: bytes = b""
    text: str | None = None
    lead: bytes = b""


@dataclass
class Rest:
    """What a partial prompt left: the chain and unhashed packed tokens to resume from, the
    segments after them, the message runs to mark as seen once hashed."""

    hasher: Finisher
    seed: str
    chain: bytes
    tail: bytes
    segments: list[Left]
    runs: list[int]

    @property
    def untokenized(self) -> bool:
        return any(s.text is not None for s in self.segments)


class PromptHashes:
    """A prompt's block hashes and token count, plus the chain state after each of its segment
    runs this call hashed or resumed from (key: the run's running digest).

    Hashed with `until` (PromptHasher.prompt), it may be *partial*: `hashes` then holds the
    leading blocks up to one that `until` refused, `tokens` still counts the whole prompt (an
    estimate while a long segment is `untokenized`), and `complete()` hashes the rest (once;
    thread-safe), after which it is what an eager call gives, token count included.
    """

    def __init__(
        self,
        hashes: list[BlockHash],
        tokens: int,
        states: dict[bytes, ChainState] | None = None,
        rest: Rest | None = None,
        run: int | None = None,
    ) -> None:
        self.hashes = hashes
        self.tokens = tokens
        self.run = run  # a chat prompt's last message_runs key (None for a completions prompt)
        self.states: dict[bytes, ChainState] = states if states is not None else {}
        self._rest = rest
        self._lock = threading.Lock() if rest is not None else None

    @property
    def partial(self) -> bool:
        return self._rest is not None

    @property
    def untokenized(self) -> bool:
        """Whether `complete()` has text to tokenise (not only hashing): work that grows with
        the prompt, to be done off the event loop."""
        rest = self._rest
        return rest is not None and rest.untokenized

    @property
    def blocks(self) -> int:
        """Full blocks of the whole prompt (the length of `hashes` once complete)."""
        rest = self._rest
        return self.tokens // rest.hasher.block_size if rest is not None else len(self.hashes)

    def complete(self) -> "PromptHashes":
        """Hash what `until` left (nothing when it left nothing), store the chain states in the
        hasher's cache as an eager call would have; returns self."""
        if self._lock is None:
            return self
        with self._lock:
            rest = self._rest
            if rest is not None:
                self.hashes, self.tokens = rest.hasher.finish(rest, self.states)
                self._rest = None
        return self

    def __repr__(self) -> str:
        return f"PromptHashes(blocks={len(self.hashes)}{'+' if self.partial else ''}, tokens={self.tokens})"
