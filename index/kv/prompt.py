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
27k-character prompt is matched after hashing ~16 blocks instead of ~420. A long segment nobody
tokenised before is then tokenised only as far as that needs (a *lead*, its first characters:
kvgate.index.kv.tokenizer_light.lead_ids) when the lead's blocks already stop the match; the
whole segment is tokenised by `complete()`, which checks the lead against it.

Token ids are kept packed (uint32 bytes, kvgate.index.kv.hashing.pack_tokens) and chains as digest bytes,
so copying, caching and resuming them is C-speed work.

`prompt()` also hands back the chain states it passed (`PromptHashes.states`): a caller that will
soon hash a longer conversation starting with the same segments (the router: prompt + answer)
passes them as `known` and resumes from there even if the shared caches evicted them meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence

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
from kvgate.index.kv.lru import LRU
from kvgate.index.kv.prompt_hashes import ChainState, Left, PromptHashes, Rest
from kvgate.index.kv.tokenizer import ChatTokenizer, content_text
from kvgate.index.kv.tokenizer_light import LEAD_MARGIN_CHARS


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

log = logging.getLogger("kvgate.router")

# With `until`, hashing checks whether to go on once per stretch of this many tokens (at least one
# block): each stretch is one call of the C hashing loop, and a stop comes at most a stretch late.
STOP_CHECK_TOKENS = 256
# Characters of a lead per token the first stretch needs: twice English text's usual four, so the
# lead reaches the stretch's check for all but very long tokens.
LEAD_CHARS_PER_TOKEN = 8
LEAD_FACTOR = 2  # a segment gets a lead when it is at least this many leads long
DEFAULT_TOKENS_PER_CHAR = 0.25  # the estimate before complete() measured one


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
        self._segments = LRU(cache_size)
        self._chains = LRU(cache_size)
        self._seen = LRU(cache_size)  # keys of leading message runs hashed so far (message_runs)
        # per seed (salts make many): (the segment digests' root, the chain's parent digest)
        self._roots = LRU(cache_size)
        self._step = 4 * block_size  # packed bytes per block
        self._prefix = extra_prefix(self.extra)
        self._lock = threading.Lock()
        # the model-free tokenizer encodes a segment faster than a cache could look it up
        self._memoize = tokenizer.backend != "text"
        # a long new segment is matched on a lead of it first (lead_ids), when the tokenizer gives
        # one: enough characters for a stretch and the block after it, at LEAD_CHARS_PER_TOKEN;
        # public so a benchmark can compare with whole segments (False)
        self.leads = self._memoize
        self.stretch = max(1, STOP_CHECK_TOKENS // block_size)  # blocks between two checks of `until`
        self._lead_chars = LEAD_CHARS_PER_TOKEN * (self.stretch + 1) * block_size
        # what complete() last measured; guides the token estimate of segments left as text
        self._tokens_per_char = DEFAULT_TOKENS_PER_CHAR
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
        block of a stretch (`stretch` blocks, STOP_CHECK_TOKENS) fails `until`: a router asks "does any replica
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
        left: list[Left] = []  # segments after a stop: hashed by complete()
        new: list[bytes] = []  # digests of the runs this call hashed: their states go to the shared cache
        resume: ChainState | None = None  # where complete() resumes, when not where hashing stopped
        estimate = 0  # tokens of the segments left as text, estimated
        for k in range(start, len(materials)):
            text = self._lead_text(materials[k]) if until is not None else None
            if left:
                if text is None:
                    left.append(Left(digests[k], pack(k)))
                else:
                    left.append(Left(digests[k], text=text))
                    estimate += round(len(text) * self._tokens_per_char)
                continue
            lead = self.tokenizer.packed_lead(text, self._lead_chars) if text is not None else None
            if lead is not None:
                ahead, rest_tail, stopped = self._advance(digests_so_far, tail + lead, until, root[1])
                if stopped:  # matched on the lead alone: the segment is tokenised whole by complete()
                    resume = (digests_so_far, tail)
                    estimate += max(
                        len(lead) // 4, round(len(text) * len(lead) / 4 / (self._lead_chars - LEAD_MARGIN_CHARS))
                    )
                    left.append(Left(digests[k], text=text, lead=lead))
                    digests_so_far, tail = ahead, rest_tail
                    continue
            tail += pack(k)
            digests_so_far, tail, stopped = self._advance(digests_so_far, tail, until, root[1])
            if stopped:
                left.append(Left(digests[k]))  # its unhashed blocks are in `tail`
                continue
            states[digests[k]] = (digests_so_far, tail)
            new.append(digests[k])
        if runs is None:
            runs = message_runs(messages) if not isinstance(messages, TextPrompt) else []
        rest = None
        if left:
            chain, rest_tail = resume if resume is not None else (digests_so_far, tail)
            tokens = self._tokens_of(chain, rest_tail) + sum(len(s.packed) for s in left) // 4 + estimate
            rest = Rest(self, seed, chain, rest_tail, left, runs)
        else:
            tokens = self._tokens_of(digests_so_far, tail)
        self._remember(states, new, runs if rest is None else [])  # a partial prompt's runs: at complete()
        return PromptHashes(digests_to_hashes(digests_so_far), tokens, states, rest, runs[-1] if runs else None)

    def _tokens_of(self, chain: bytes, tail: bytes) -> int:
        """Tokens hashed into `chain` (8 bytes a block) and left in `tail` (4 bytes a token)."""
        return (len(chain) // 8) * self.block_size + len(tail) // 4

    def _lead_text(self, material: str | bytes) -> str | None:
        """`material` when it is a chat segment long enough that tokenising a lead of it first
        saves work, and not tokenised before (then it is cached whole); None otherwise."""
        if not self.leads or not isinstance(material, str) or len(material) < LEAD_FACTOR * self._lead_chars:
            return None
        with self._lock:
            cached = material in self._segments
        return None if cached else material

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
            end = min(full, done + step * self.stretch)
            chain += self._chain_digests(view[done:end], step, chain[-8:] if chain else parent, self._prefix)
            done = end
            if done < full and not until(int.from_bytes(chain[-8:], "little")):
                return chain, tail[done:], True
        return chain, tail[done:], False

    def finish(self, rest: Rest, states: dict[bytes, ChainState]) -> tuple[list[BlockHash], int]:
        """PromptHashes.complete()'s work: tokenise and hash the segments a stop left, as the
        eager loop would have: (the whole prompt's hashes, its token count). A lead that is not
        how the whole segment begins turns leads off for this hasher (said once, in a warning):
        only the route of the prompts hashed from a lead could have been worse."""
        chain, tail = rest.chain, rest.tail
        parent = self._root(rest.seed)[1]
        for left in rest.segments:
            packed = left.packed
            if left.text is not None:
                packed = self._encode(left.text)
                if left.lead and not packed.startswith(left.lead):
                    self._lead_differs()
                if packed:
                    self._tokens_per_char = len(packed) / 4 / len(left.text)
            chain, tail, _ = self._advance(chain, tail + packed, None, parent)
            states[left.digest] = (chain, tail)
        self._remember(states, [left.digest for left in rest.segments], rest.runs)
        return digests_to_hashes(chain), self._tokens_of(chain, tail)

    def _lead_differs(self) -> None:
        if self.leads:
            self.leads = False
            log.warning(
                "tokenizer %s: tokenising the first characters of a long message gave other ids than the "
                "whole message does; long messages are tokenised whole from now on",
                self.tokenizer.name,
            )

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
