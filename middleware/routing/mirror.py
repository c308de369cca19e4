"""Approximate mode's prefix index shaped like the engines' caches: their block size and size.

Owns which block size approximate mode hashes prompts with and each replica's bound in the prefix
index, from what the replicas' engines say of themselves (EngineInfo: vLLM reports both). May
import kvgate.index.kv and the routing config; nothing of the proxy.

- Block size. An engine caches whole blocks only. Hashes cut finer make the index count as cached
  the tail of a block the engine never keeps: up to a block less one token of every prompt, and a
  short head every prompt shares (a chat template's system prompt) as a match on every replica.
  With a model tokenizer and no `routing.prefix.block_size`, the first engine that reports its
  block size sets the hashes' (APPROXIMATE_BLOCK_TOKENS until then). The index is emptied when
  the size changes: hashes of two sizes never match. A configured size that differs from an
  engine's is kept and said once.
- Size. With a model tokenizer and no `capacity_blocks` (the route's or the replica's), a
  replica's bound is its engine's KV cache in blocks (tokens / block size), so the index forgets
  what the engine must have evicted.
- With the `text` tokenizer blocks count characters, not the engine's tokens: nothing is taken.

Invariant: while an engine's size is known, its replica's bound in the index is that size in
blocks of the block size the hashes use now.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import ChatTokenizer
from kvgate.middleware.engines.base import EngineInfo
from kvgate.middleware.routing_config import PrefixConfig

log = logging.getLogger("kvgate.router")


class EngineMirror:
    def __init__(
        self,
        route: str,
        prefix: PrefixConfig,
        index: PrefixIndex,
        hasher: PromptHasher,
        fixed: set[str],
        on_hasher: Callable[[PromptHasher], None],
    ) -> None:
        """hasher: the one in use now; fixed: replicas whose bound is configured
        (replicas[].capacity_blocks); on_hasher receives the hasher to use from now on when the
        block size changes."""
        tokens = prefix.tokenizer != "text"
        self.route = route
        self.index = index
        self.seed = prefix.seed
        self.tokenizer: ChatTokenizer = hasher.tokenizer
        self.takes_block_size = tokens and prefix.block_size is None
        self.takes_size = tokens and prefix.capacity_blocks is None
        self.block_size = hasher.block_size
        self.compares = tokens and prefix.block_size is not None
        self._fixed = set(fixed)
        self._cache_tokens: dict[str, int] = {}  # replica → its engine's KV cache in tokens
        self._said: set[tuple[str, int]] = set()
        self._on_hasher = on_hasher
        self._lock = threading.Lock()

    def added(self, name: str, capacity_blocks: int | None) -> None:
        """A replica joined at run time (its own bound, if configured, stays)."""
        with self._lock:
            if capacity_blocks is not None:
                self._fixed.add(name)

    def forget(self, name: str) -> None:
        with self._lock:
            self._fixed.discard(name)
            self._cache_tokens.pop(name, None)

    def engine_found(self, name: str, info: EngineInfo) -> None:
        """Replica `name`'s engine described itself: take its block size and size where ours are not set."""
        hasher = None
        with self._lock:
            size = info.block_size
            if size and self.takes_block_size and size != self.block_size:
                log.info(
                    "route %s: approximate routing hashes blocks of %d tokens, as replica %s's engine caches them",
                    self.route,
                    size,
                    name,
                )
                self.block_size = size
                hasher = PromptHasher(self.tokenizer, size, seed=self.seed)
            elif size and self.compares and size != self.block_size and (name, size) not in self._said:
                self._said.add((name, size))
                log.warning(
                    "route %s: replica %s's engine caches blocks of %d tokens, routing.prefix.block_size "
                    "says %d: the index counts as cached parts of blocks the engine does not keep (leave "
                    "routing.prefix.block_size out to use the engine's)",
                    self.route,
                    name,
                    size,
                    self.block_size,
                )
            if info.kv_cache_tokens and self.takes_size and name not in self._fixed:
                self._cache_tokens[name] = info.kv_cache_tokens
            bounds = {n: max(1, tokens // self.block_size) for n, tokens in self._cache_tokens.items()}
            if hasher is not None:  # hashes of the old size never match again
                for replica in self.index.replicas:
                    self.index.cleared(replica)
                self._on_hasher(hasher)
        for replica, blocks in bounds.items():
            if replica in self.index.replicas:
                self.index.resize(replica, blocks)
