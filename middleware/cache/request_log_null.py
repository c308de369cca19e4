"""NullRequestLog: the request log of a proxy whose `feedback.enabled` is false.

It keeps nothing, so no request id can be judged: `get` finds none, and the pipeline does not
even call `record` (kvgate.middleware.cache.response_cache). No directory or Redis key is made for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kvgate.index.storage.softfail import Batch
from kvgate.middleware.cache.request_log import RequestRecord


class NullRequestLog:
    """RequestLog that keeps no record."""

    def record(self, request_id: str, record: RequestRecord) -> None:
        return None

    def get(self, request_id: str) -> RequestRecord | None:
        return None

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        yield Batch()  # nothing written, nothing to lose

    def stats(self) -> dict[str, int]:
        return {"storage_errors": 0}

    def erase_tenant(self, tenant: str) -> int:
        return 0

    def close(self) -> None:
        return None
