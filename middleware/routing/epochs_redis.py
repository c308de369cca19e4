"""RedisEpochStore: salt epochs on the shared Redis of `store: redis`, so every proxy of a fleet
salts a tenant alike. Keys under the store's prefix P: `P salt-epochs` (hash: tenant digest →
epoch) and `P salt-gen` (the generation counter), bumped together in one MULTI/EXEC. Neither
expires: an erased tenant's epoch must outlive every block cached under its old salt."""
from __future__ import annotations

import redis

from kvgate.index.storage.redis_link import RedisLink


class RedisEpochStore:
    def __init__(self, link: RedisLink, key_prefix: str) -> None:
        self.link = link
        self.where = link.where
        self.failures: tuple[type[BaseException], ...] = (redis.exceptions.RedisError,)
        self._epochs, self._gen = f"{key_prefix}salt-epochs", f"{key_prefix}salt-gen"

    def generation(self) -> int:
        return int(self.link.run("lookup", lambda r: r.get(self._gen)) or 0)

    def epochs(self) -> dict[str, int]:
        raw = self.link.run("lookup", lambda r: r.hgetall(self._epochs))
        return {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}

    def bump(self, digest: str) -> int:
        def write(r: redis.Redis) -> int:
            pipe = r.pipeline(transaction=True)
            pipe.hincrby(self._epochs, digest, 1)
            pipe.incr(self._gen)
            return int(pipe.execute()[0])

        return self.link.run("store", write)

    def close(self) -> None:
        """The link is the response store's: it closes it."""
