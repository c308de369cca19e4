"""Per-tenant cache salts for the engines' prefix caches.

An engine such as vLLM shares one prefix cache across every request, so one tenant could learn
from the time to first token whether another tenant sent a prompt. vLLM keys a request's blocks
by its `cache_salt` too (in the first block's extra keys), so requests with different salts never
share cached blocks. kvgate sets that salt on every request of a tenant-scoped route:

    salt = HMAC-SHA256(secret, "tenant" NUL tenant NUL "epoch" NUL epoch NUL "nonce" NUL nonce
                               [NUL "client" NUL client_salt])[:32 hex]

- the secret never leaves the proxy, so a salt cannot be guessed from a tenant (or its key);
- the epoch and the 32-byte random nonce are the tenant's salt record
  (kvgate.middleware.routing.epochs), kept only in the store the proxies share: erasing a tenant
  overwrites both, so every salt it had changes and, the old nonce gone, none of them can be
  computed again, even with the secret (the KV chunks sealed under them stay unreadable);
- a `cache_salt` the client sent is folded in, never used alone, so a client cannot pick another
  tenant's salt;
- the same tenant always gets the same salt (for one secret and record), so its own prefixes stay
  reusable, across restarts and across the proxies that share the store.
Without a record source (tools, tests) the message is the tenant's part alone. Without a tenant
(scope shared) the client's own salt, if any, goes through as it is.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Callable

from kvgate.index.storage.env import secret_from_env
from kvgate.middleware.routing.epochs import TenantSalt

log = logging.getLogger("kvgate.salt")
SECRET_FILE = "salt.key"


class Salter:
    def __init__(self, secret: bytes, record: Callable[[str], TenantSalt] | None = None) -> None:
        if len(secret) < 16:
            raise ValueError("the cache-salt secret must be at least 16 bytes")
        self._secret = secret
        self._record = record  # tenant → its salt record (Epochs.record)

    def salt(self, tenant: str | None, client_salt: object = None) -> str | None:
        """The engine's cache_salt for this request (see the module docstring); None = unsalted."""
        client = client_salt if isinstance(client_salt, str) and client_salt else None
        if tenant is None:
            return client
        msg = b"tenant\0" + tenant.encode()
        if self._record is not None:
            record = self._record(tenant)
            msg += b"\0epoch\0%d\0nonce\0" % record.epoch + record.nonce  # fixed length: the client part stays apart
        if client is not None:
            msg += b"\0client\0" + client.encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()[:32]


def load_secret(cache_dir: Path, env_name: str | None) -> bytes:
    """The secret from the variable `env_name` names, else from <cache_dir>/salt.key (made once,
    random, readable by this user only). Proxies that share engines must share the secret."""
    if env_name:
        return (secret_from_env(env_name, "auth.salt_secret_env") or "").encode()
    path = Path(cache_dir) / SECRET_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secret)
    finally:
        os.close(fd)
    return secret
