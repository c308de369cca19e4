"""API-key gate for the proxy: one ASGI middleware in front of every route.

It sits before routing, so every endpoint — including ones added later, the OpenAPI document and
unknown paths — needs a key once `auth.keys` is set; only OPEN_PATHS stay open. Handlers still
derive the tenant from the token (proxy.authorise), but cannot forget the check.
"""
from __future__ import annotations

import hmac
import ipaddress
from typing import Any, Awaitable, Callable

from starlette.responses import JSONResponse

from middleware.errors import Unauthorized

OPEN_PATHS = frozenset({"/health"})  # liveness probes carry no key
LOOPBACK_NAMES = frozenset({"localhost"})

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, raw bytes; None without one."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() or None if scheme.lower() == b"bearer" else None
    return None


def key_allowed(token: bytes | None, keys: frozenset[bytes]) -> bool:
    """Constant-time against every key, so response timing does not leak a key's prefix."""
    if token is None:
        return False
    return any(hmac.compare_digest(token, key) for key in keys)


class KeyGate:
    """Refuses (401, OpenAI error JSON) every HTTP request without a configured key."""

    def __init__(self, app: ASGIApp, keys: frozenset[str], open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.keys = frozenset(k.encode() for k in keys)
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.keys and scope["type"] == "http" and scope["path"] not in self.open_paths:
            token = bearer_token(scope.get("headers") or [])
            if not key_allowed(token, self.keys):
                err = Unauthorized("missing or unknown API key" if token is None else "invalid API key")
                response = JSONResponse(err.to_json(), status_code=err.status, headers={"www-authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume it reaches beyond this machine
        return False


def bind_warning(host: str, keys: list[str]) -> str | None:
    """What `kvgate serve` should warn about before binding `host`, if anything."""
    if is_loopback(host):
        return None
    if not keys:
        return (f"binding to {host} with no auth.keys: anyone who can reach this address can use "
                "the backends and read cached answers; set auth.keys or bind 127.0.0.1")
    return f"binding to {host}: the proxy is reachable beyond this machine (auth.keys is set)"
