"""Which embedder made a cache's vectors: recorded beside the entries, checked when the cache opens.

Vectors of two embedders are not comparable (a tuned model moves every question), so a cache
holds one embedder's vectors only. The first process to open a cache records the configured
embedder's identity (kvgate.index.responses.embedder.model_identity): `<cache_dir>/embedder.id` with the local
store, `<key_prefix>embedder` on Redis. A later start with another embedder is a ConfigError
naming `embedder.model_path`: the user points the route at a fresh cache (a new `cache_dir`, or a
new `store.key_prefix`), or deletes the old one. A cache made before marks existed is claimed by
whichever embedder opens it first. Redis out of reach skips the check (the store serves misses
until it answers; the next start checks).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import redis

from kvgate.index.storage.redis_link import RedisLink
from kvgate.middleware.config import Config
from kvgate.middleware.errors import ConfigError

log = logging.getLogger("kvgate.store")
MARK_FILE = "embedder.id"


def refusal(where: str, stored: str, configured: str) -> ConfigError:
    """The error of a cache whose vectors came from another embedder."""
    return ConfigError(
        f"embedder.model_path: the cache at {where} holds vectors of embedder {stored!r}, but the configured "
        f"embedder is {configured!r}; vectors of two embedders do not mix. Use a fresh cache_dir "
        f"(or store.key_prefix with store: redis), or delete the old cache, to start with this embedder"
    )


def claim(config: Config, link: RedisLink | None, identity: str) -> None:
    """Record `identity` as the cache's embedder, or raise the refusal if another one is recorded."""
    if link is None:
        _claim_file(config.cache_dir / MARK_FILE, identity)
        return
    key = f"{config.store.key_prefix}embedder"
    try:
        link.run("embedder-mark", lambda r: r.set(key, identity, nx=True))
        stored = link.run("embedder-mark", lambda r: r.get(key))
    except redis.exceptions.RedisError as exc:
        log.warning("embedder mark on Redis not checked (%s)", exc)
        return
    stored_text = stored.decode() if isinstance(stored, bytes) else stored
    if stored_text is not None and stored_text != identity:
        raise refusal(f"Redis {link.where} ({key})", stored_text, identity)


def _claim_file(path: Path, identity: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: of two processes starting on a fresh dir, one writes, the other reads and compares
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        stored = path.read_text().strip()
        if stored and stored != identity:
            raise refusal(str(path.parent), stored, identity) from None
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(identity + "\n")
