"""Which requests' cache work runs on the event loop, and which in a worker thread.

A hop to a worker thread is not free: in a proxy relaying all-miss traffic with small prompts,
the lookup and the record of each miss cost more CPU per request in worker threads than inline
(the threads and the event loop contend for the GIL on every hand-off). Work that grows with the prompt
must still stay off the loop. So a request runs its cache steps inline only when they are cheap
*and bounded*: local stores (no network round trip), no embedding (no semantic tier), and a prompt
small enough that tokenising and hashing it stays short; the step after the answer also
needs the answer (hashed after the prompt for the router's records) within the same bound.
Everything else hops.

Pure functions; each limit says what it bounds where it is defined.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

from kvgate.middleware.canonical import ONLY_DICT, ONLY_STR

# The cold cost of hashing a prompt (kvgate.index.kv.prompt.PromptHasher, nothing cached) grows with its
# characters. A prompt whose leading messages were hashed before resumes from there (the
# conversation's earlier turns, a shared system prompt): only its new characters are tokenised.
# A hop is not free: two thread wake-ups and GIL hand-offs, and when engines keep every core busy
# each wake-up first waits for a core. What a hop buys is a loop that serves other requests
# meanwhile: `text` / `codepoints` tokenise in Python, so a worker thread yields the GIL to the
# loop every switch interval, and an HF fast tokenizer's encode runs with the GIL released
# (kvgate.index.kv.tokenizer_light.encode_ids). So with either tokenizer a turn with more new text
# than INLINE_NEW_CHARS hops; an HF tokenizer's characters cost more than the `text` one's, so
# the bound errs towards hopping for it.
# The whole prompt (what is digested at C speed for the keys and the hash resume) is bounded by
# INLINE_TOTAL_CHARS. Long continuations run inline add more to the tail of every other request's
# time to first token than their hops cost, so long prompts keep hopping.
INLINE_TOTAL_CHARS = 16 * 1024
INLINE_NEW_CHARS = 4096


def prompt_chars(messages: Any) -> int:
    """Characters of text in `messages` (string contents and text parts), without copying them;
    -1 when `messages` is not a list of dicts (validation rejects it, cheaply, wherever it runs).

    Invariant: O(number of messages and parts), never O(characters)."""
    if not isinstance(messages, list):
        return -1
    if set(map(type, messages)) == ONLY_DICT:  # the usual list: string contents, summed at C speed
        contents = list(map(dict.get, messages, repeat("content")))
        if set(map(type, contents)) == ONLY_STR:
            return sum(map(len, contents))
    total = 0
    for m in messages:
        if not isinstance(m, dict):
            return -1
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                total += len(text) if isinstance(text, str) else 0
    return total


def new_chars_limit(*, local_stores: bool, semantic: bool, tokenizer: str | None) -> int | None:
    """The most *new* prompt characters (not hashed before) for which a route's cache work may
    run on the event loop; None: never (always a worker thread).

    `tokenizer`: the route's routing tokenizer (None: the route has no replicas, hashes nothing
    but its keys). Invariant: None when a step could wait on the network (a Redis store) or
    embed (a semantic tier); otherwise INLINE_NEW_CHARS, whichever tokenizer the route hashes with."""
    if not local_stores or semantic:
        return None
    if tokenizer is None:
        return INLINE_TOTAL_CHARS
    return INLINE_NEW_CHARS


def runs_inline(total_chars: int, new_chars: int, limit: int | None) -> bool:
    """Whether a request's cache steps run on the event loop: its route allows it, and both its
    prompt (`total_chars`) and the part of it not hashed before (`new_chars`) are small.

    Invariant: False whenever limit is None or total_chars > INLINE_TOTAL_CHARS."""
    return limit is not None and total_chars <= INLINE_TOTAL_CHARS and new_chars <= limit
