"""Section `catchup` of `kvgate bench scaleout`: how long a proxy's local view (FAISS vectors, LRU)
takes to become current, for `--catchup-sizes` entries (384-dim vectors, ~0.4 KB answers):

  open_s_redis    a proxy starting on a Redis that holds N entries (SCAN + pipelined reads)
  follow_s_redis  a running proxy reading N entries another proxy added (the Stream + reads)
  open_s_local    anchor: a proxy starting on a local cache dir that holds the same N entries
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from kvgate.index.responses.entries.base import CacheEntry, EntryStore
from kvgate.index.responses.entries.disk import DiskEntryStore
from kvgate.index.responses.entries.redis import RedisEntryStore
from kvgate.index.responses.semantic import SemanticIndex
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.tools.redis_proc import RedisServer

if TYPE_CHECKING:
    from kvgate.tools.bench.scaleout import Context

DIM = 384
BATCH = 1000


def fill(store: EntryStore, n: int, seed: int) -> None:
    """n semantic entries over 16 scopes, written in transactions of BATCH."""
    rng = np.random.default_rng(seed)
    answer = {"choices": [{"message": {"role": "assistant", "content": "x" * 300}}]}
    for start in range(0, n, BATCH):
        ids = store.allocate(min(BATCH, n - start))
        vecs = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        store.put_many(
            [(CacheEntry(i, f"scope-{i % 16}", answer, None, f"question {i}"), v) for i, v in zip(ids, vecs)]
        )


def opened(store: EntryStore) -> tuple[SemanticIndex, float]:
    started = time.perf_counter()
    index = SemanticIndex(None, DIM, entries=store, max_entries=None, follow_interval_s=0.25)
    return index, time.perf_counter() - started


def redis_store(server: RedisServer) -> RedisEntryStore:
    return RedisEntryStore(RedisLink(LinkSettings(server.url)), DIM)  # the config's default timeouts


def one_size(ctx: Context, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": n}
    with RedisServer() as server:
        follower, _ = opened(redis_store(server))  # running before the writes: it follows them
        writer = redis_store(server)
        fill(writer, n, ctx.args.seed)
        started = time.perf_counter()
        follower.catch_up(force=True)
        out["follow_s_redis"] = round(time.perf_counter() - started, 3)
        assert len(follower.eviction) == n, f"followed {len(follower.eviction)} of {n}"
        fresh, out["open_s_redis"] = opened(redis_store(server))
        assert len(fresh.eviction) == n
        out["open_s_redis"] = round(out["open_s_redis"], 3)
        for index in (follower, fresh):
            index.close()
        writer.close()
    local = DiskEntryStore(ctx.work / f"catchup-{n}", DIM)
    fill(local, n, ctx.args.seed)
    local.close()
    index, took = opened(DiskEntryStore(ctx.work / f"catchup-{n}", DIM))
    assert len(index.eviction) == n
    out["open_s_local"] = round(took, 3)
    index.close()
    return out


def run(ctx: Context) -> dict[str, Any]:
    sizes = [int(s) for s in ctx.args.catchup_sizes.split(",") if s.strip()]
    return {"sizes": [one_size(ctx, n) for n in sizes]}
