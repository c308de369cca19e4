"""Prompt → chained block hashes, reusing earlier work so cost grows with the new turn.

Two caches, both keyed by content digests (never by object identity):
- segment text → token ids (earlier turns are the same segments every time);
- chain state after a run of segments → (block hashes so far, unhashed tail tokens), keyed by a
  running digest of the segment texts. A request whose first k segments were seen before resumes
  hashing from there: block_hashes(a + b) == block_hashes(a) + block_hashes(tail + b, parent)
  (see kvgate.index.kv.hashing), so resuming gives exactly the hashes of a full recomputation.

A third, lighter memory serves a caller deciding *where* to hash (kvgate.middleware.cache.offload):
`uncached_chars(messages)` says how many characters follow the longest leading run of messages
this hasher has hashed before, from hashes of the raw messages (no rendering, no tokenising).

A router only needs a prompt's hashes up to the first block no replica holds (a prefix match
stops there), so `prompt(until=...)` may stop hashing early and leave the rest to
`PromptHashes.complete()`, which a background thread runs before recording the chain: a fresh
27k-character prompt is matched after hashing ~16 blocks instead of ~420.

Token ids are kept packed (uint32 bytes, kvgate.index.kv.hashing.pack_tokens) and chains as digest bytes,
so copying, caching and resuming them is C-speed work.

`prompt()` also hands back the chain states it passed (`PromptHashes.states`): a caller that will
soon hash a longer conversation starting with the same segments (the router: prompt + answer)
passes them as `known` and resumes from there even if the shared caches evicted them meanwhile.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterable, Sequence

from kvgate.index.kv.hash_loops import loops
from kvgate.index.kv.hashing import (
    DEFAULT_SEED,
    BlockHash,
    digests_to_hashes,
    extra_prefix,
    pack_tokens,
    salted_seed,
    seed_hash,
    unpack_tokens,
)
from kvgate.index.kv.tokenizer import ChatTokenizer, content_text


@dataclass(frozen=True)
class TextPrompt:
    """A completions prompt: raw text (tokenized as the engine does, no chat template) or the
    token ids the client sent (hashed as given). Exactly one of the two is set."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("a TextPrompt holds text or token ids, exactly one")

    @property
    def wire(self) -> str | list[int]:
        """The prompt as an engine's `/completions` takes it."""
        return self.text if self.text is not None else list(self.token_ids or ())

    @property
    def chars(self) -> int:
        """Its size in the unit the offload decision counts (characters, or ids for a token prompt)."""
        return len(self.text) if self.text is not None else len(self.token_ids or ())

    def extended(self, answer: str) -> "TextPrompt | None":
        """The prompt a next turn starting with this prompt and `answer` begins with (text only:
        a token prompt's answer has no ids here)."""
        return TextPrompt(self.text + answer) if self.text is not None else None


# what the hasher takes: a chat conversation, or a completions prompt
Prompt = Sequence[dict[str, Any]] | TextPrompt


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
        self.put_all(((key, value),))

    def put_all(self, items: Iterable[tuple[Any, Any]]) -> None:
        """Each (key, value) in turn becomes the most recently used; then the oldest go while over size."""
        move = self.move_to_end
        for key, value in items:
            self[key] = value  # an old key keeps its place: moved next
            move(key)
        while len(self) > self.size:
            self.popitem(last=False)


# (the block hashes so far as 8-byte digests end to end, the unhashed tail's packed tokens): bytes,
# so a state is copied, stored and freed at C speed however long the conversation
ChainState = tuple[bytes, bytes]


STOP_CHECK_BLOCKS = 16  # with `until`, hashing checks whether to go on once per this many blocks


@dataclass
class _Rest:
    """What a partial prompt left unhashed: the chain so far, the unhashed packed tokens, the
    segments after them (running digest, packed tokens), the message runs to mark as seen."""

    hasher: "PromptHasher"
    seed: str
    chain: bytes
    tail: bytes
    segments: list[tuple[bytes, bytes]]
    runs: list[int]


class PromptHashes:
    """A prompt's block hashes and token count, plus the chain state after each of its segment
    runs this call hashed or resumed from (key: the run's running digest).

    Hashed with `until` (PromptHasher.prompt), it may be *partial*: `hashes` then holds the
    leading blocks up to one that `until` refused, `tokens` still counts the whole prompt, and
    `complete()` hashes the rest (once; thread-safe), after which it is what an eager call gives.
    """

    def __init__(
        self,
        hashes: list[BlockHash],
        tokens: int,
        states: dict[bytes, ChainState] | None = None,
        rest: _Rest | None = None,
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
    def blocks(self) -> int:
        """Full blocks of the whole prompt (the length of `hashes` once complete)."""
        return self.tokens // self._rest.hasher.block_size if self._rest is not None else len(self.hashes)

    def complete(self) -> "PromptHashes":
        """Hash what `until` left (nothing when it left nothing), store the chain states in the
        hasher's cache as an eager call would have; returns self."""
        if self._lock is None:
            return self
        with self._lock:
            rest = self._rest
            if rest is not None:
                self.hashes = rest.hasher._finish(rest, self.states)
                self._rest = None
        return self

    def __repr__(self) -> str:
        return f"PromptHashes(blocks={len(self.hashes)}{'+' if self.partial else ''}, tokens={self.tokens})"


class PromptHasher:
    """Block hashes of chat prompts for one (tokenizer, block_size, seed, extra) setting."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        block_size: int = 16,
        seed: str = DEFAULT_SEED,
        extra: Sequence[str | int] = (),
        cache_size: int = 2048,
        hash_loops: ModuleType | None = None,
    ) -> None:
        """`hash_loops`: the SHA-256 loops (kvgate.index.kv.hash_loops); default: C where built."""
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.seed = seed
        self.extra = tuple(extra)
        self._segments = _LRU(cache_size)
        self._chains = _LRU(cache_size)
        self._seen = _LRU(cache_size)  # keys of leading message runs hashed so far (message_runs)
        # per seed (salts make many): (the segment digests' root, the chain's parent digest)
        self._roots = _LRU(cache_size)
        self._step = 4 * block_size  # packed bytes per block
        self._prefix = extra_prefix(self.extra)
        self._lock = threading.Lock()
        # the model-free tokenizer encodes a segment faster than a cache could look it up
        self._memoize = tokenizer.backend != "text"
        hash_loops = hash_loops or loops()
        self._segment_digests = hash_loops.segment_digests
        self._chain_digests = hash_loops.chain_digests

    def tokens(self, messages: Prompt) -> list[int]:
        materials, pack = self._parts(messages)
        return unpack_tokens(b"".join(pack(k) for k in range(len(materials))))

    def hashes(self, messages: Prompt) -> tuple[list[BlockHash], int]:
        """(block hashes of the rendered prompt, its token count)."""
        out = self.prompt(messages)
        return out.hashes, out.tokens

    def prompt(
        self,
        messages: Prompt,
        known: PromptHashes | None = None,
        until: Callable[[BlockHash], bool] | None = None,
        salt: str | None = None,
        runs: list[int] | None = None,
    ) -> PromptHashes:
        """The prompt's hashes, resuming from the longest run of leading segments whose chain
        state is in `known` (an earlier prompt of the same conversation) or in the cache.

        With `until`, hashing stops (leaving a partial result, see PromptHashes) once the last
        block of a stretch of STOP_CHECK_BLOCKS fails `until`: a router asks "does any replica
        hold this block?", and a prefix match cannot go past a block nobody holds.

        `salt` (an engine's cache_salt) roots the chain elsewhere (kvgate.index.kv.hashing.salted_seed):
        prompts with different salts share no block.

        A TextPrompt is one segment: its text tokenized as the engine tokenizes a completions
        prompt (special tokens added, no template), or its token ids as given. `runs`: the
        messages' message_runs, when the caller has them already."""
        if known is not None:
            known.complete()
        seed = salted_seed(self.seed, salt)
        materials, pack = self._parts(messages)
        root = self._root(seed)
        digests = self._segment_digests(root[0], materials)
        pinned = known.states if known is not None else {}
        # resume from the longest run of segments already hashed
        start, digests_so_far, tail = 0, b"", b""
        states: dict[bytes, ChainState] = {}
        with self._lock:
            for k in range(len(digests) - 1, -1, -1):
                state = pinned.get(digests[k]) or self._chains.get_touch(digests[k])
                if state is not None:
                    start = k + 1
                    digests_so_far, tail = state
                    states[digests[k]] = state
                    break
        left: list[tuple[bytes, bytes]] = []  # segments after a stop: hashed by complete()
        new: list[bytes] = []  # digests of the runs this call hashed: their states go to the shared cache
        for k in range(start, len(materials)):
            if left:
                left.append((digests[k], pack(k)))
                continue
            tail += pack(k)
            digests_so_far, tail, stopped = self._advance(digests_so_far, tail, until, root[1])
            if stopped:
                left.append((digests[k], b""))  # its unhashed blocks are in `tail`
                continue
            states[digests[k]] = (digests_so_far, tail)
            new.append(digests[k])
        if runs is None:
            runs = message_runs(messages) if not isinstance(messages, TextPrompt) else []
        unhashed = len(tail) + sum(len(p) for _, p in left) if left else len(tail)
        tokens = (len(digests_so_far) // 8) * self.block_size + unhashed // 4
        rest = _Rest(self, seed, digests_so_far, tail, left, runs) if left else None
        self._remember(states, new, runs if rest is None else [])  # a partial prompt's runs: at complete()
        return PromptHashes(digests_to_hashes(digests_so_far), tokens, states, rest, runs[-1] if runs else None)

    def _root(self, seed: str) -> tuple[bytes, bytes]:
        """(the segment digests' root, the chain's parent digest) under `seed`."""
        with self._lock:
            root = self._roots.get_touch(seed)
        if root is None:
            material = f"{self.block_size}:{seed}:{self.extra}".encode()
            root = (hashlib.sha256(material).digest(), seed_hash(seed).to_bytes(8, "little"))
            with self._lock:
                self._roots.put(seed, root)
        return root

    def _remember(self, states: dict[bytes, ChainState], hashed: list[bytes], runs: list[int]) -> None:
        """Into the shared caches, under one hold of the lock: the chain states after the segment
        runs this call hashed (`hashed`, keys of `states`) and the message runs it covered."""
        with self._lock:
            self._chains.put_all([(digest, states[digest]) for digest in hashed])
            self._seen.put_all([(run, True) for run in runs])

    def _advance(
        self, chain: bytes, tail: bytes, until: Callable[[BlockHash], bool] | None, parent: bytes
    ) -> tuple[bytes, bytes, bool]:
        """Hash the full blocks of `tail` onto `chain` (`parent`: the seed's digest, the parent of
        a chain's first block): (chain, the unhashed rest of `tail`, whether `until` stopped it early)."""
        step = self._step
        full = len(tail) - len(tail) % step
        if until is None:  # the usual call: one pass, no stretches to check
            if full:
                chain += self._chain_digests(
                    memoryview(tail)[:full], step, chain[-8:] if chain else parent, self._prefix
                )
            return chain, tail[full:], False
        view = memoryview(tail)
        done = 0
        while done < full:
            end = min(full, done + step * STOP_CHECK_BLOCKS)
            chain += self._chain_digests(view[done:end], step, chain[-8:] if chain else parent, self._prefix)
            done = end
            if done < full and not until(int.from_bytes(chain[-8:], "little")):
                return chain, tail[done:], True
        return chain, tail[done:], False

    def _finish(self, rest: _Rest, states: dict[bytes, ChainState]) -> list[BlockHash]:
        """complete()'s work: hash the segments a stop left, as the eager loop would have."""
        chain, tail = rest.chain, rest.tail
        parent = self._root(rest.seed)[1]
        for digest, packed in rest.segments:
            chain, tail, _ = self._advance(chain, tail + packed, None, parent)
            states[digest] = (chain, tail)
        self._remember(states, [digest for digest, _ in rest.segments], rest.runs)
        return digests_to_hashes(chain)

    def _parts(self, prompt: Prompt) -> tuple[list[str] | list[bytes], Callable[[int], bytes]]:
        """(each segment's digest material, segment k's packed token ids on demand). Chat segments
        digest as their text; a completions prompt's one segment carries a marker of its kind, so
        a text never shares a chain state with a chat segment or a token prompt."""
        if isinstance(prompt, TextPrompt):
            if prompt.token_ids is not None:
                packed = pack_tokens(prompt.token_ids)
                return [b"\0ids\0" + hashlib.sha256(packed).digest()], lambda _: packed
            text = prompt.text or ""
            return [b"\0text\0" + text.encode("utf-8", "surrogatepass")], lambda _: self._encode_text(text)
        segments = self.tokenizer.segments(prompt)
        return segments, lambda k: self._encode(segments[k])

    def uncached_chars(self, messages: Prompt) -> int:
        """Characters of content after the longest leading run of `messages` that an earlier
        `prompt()` call hashed (all of them for a new conversation): the part a `prompt()` of
        these messages would tokenise anew, estimated without rendering or tokenising.

        Invariant: 0 ≤ result ≤ total content characters; the total when nothing was seen."""
        if isinstance(messages, TextPrompt):
            return messages.chars
        runs = message_runs(messages)
        with self._lock:
            known = next((k + 1 for k in range(len(runs) - 1, -1, -1) if runs[k] in self._seen), 0)
        return sum(len(content_text(m.get("content"))) for m in messages[known:])

    def _encode(self, segment: str) -> bytes:
        """The segment's token ids, packed (kvgate.index.kv.hashing.pack_tokens)."""
        if not self._memoize:
            return self.tokenizer.packed(segment)
        return self._cached(segment, self.tokenizer.packed)

    def _encode_text(self, text: str) -> bytes:
        """A completions prompt's token ids, packed (cached like a chat segment, under its own key)."""
        return self._cached(("text", text), lambda _: self.tokenizer.packed_text(text))

    def _cached(self, key: Any, encode: Callable[[Any], bytes]) -> bytes:
        with self._lock:
            ids = self._segments.get_touch(key)
        if ids is None:
            ids = encode(key)
            with self._lock:
                self._segments.put(key, ids)
        return ids


def message_runs(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Running keys of the leading runs of raw messages: entry k covers messages[:k+1].

    Invariant: two message lists share entry k when their first k+1 messages have the same roles
    and content texts; lists that differ there share it only when Python's 64-bit hash collides,
    which can cost no more than `uncached_chars`' estimate (where a prompt is hashed, never its
    hashes). Keys are this process's own (str hashes are salted per process): never stored or
    sent. O(characters), at C speed."""
    out: list[int] = []
    d = 0
    for m in messages:  # next_run's step, written out: this loop runs for every prompt
        d = hash((d, m.get("role", "user"), content_text(m.get("content"))))
        out.append(d)
    return out


def next_run(run: int, message: dict[str, Any]) -> int:
    """The message_runs entry after `run` (0 before the first message) for one more message."""
    return hash((run, message.get("role", "user"), content_text(message.get("content"))))
