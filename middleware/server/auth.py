"""API-key gate for the proxy: one ASGI middleware in front of every route.

It sits before routing, so every endpoint — including ones added later, the OpenAPI document and
unknown paths — needs a key once `auth.keys` is set; only OPEN_PATHS stay open. Handlers still
derive the tenant from the token (proxy.authorise), but cannot forget the check.

The admin API (paths under ADMIN_PREFIX, middleware/server/admin.py) has keys of its own,
`auth.admin_keys`: this gate lets one through on those paths as well as a key of `auth.keys`, so
an admin key need not be a tenant key too; the admin API then demands an admin key itself.

The dashboard (GET /ui, GET /v1/stats) also takes HTTP Basic credentials whose password is a key:
a browser cannot add a bearer header to a page it navigates to, but it shows its own login prompt
on a Basic challenge and then sends the credentials with the page's requests. Only read-only GETs
of the dashboard accept them, so a browser that remembers them cannot be used for cross-site
requests that change anything.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from typing import Any, Awaitable, Callable

from starlette.responses import Response

from kvgate.middleware.errors import Unauthorized
from kvgate.middleware.server.responses import error_response

OPEN_PATHS = frozenset({"/health", "/ready"})  # liveness and readiness probes carry no key
ADMIN_PREFIX = "/v1/admin/"  # the admin API (middleware/server/admin.py): auth.admin_keys pass the gate here
BASIC_PATHS = ("/ui", "/v1/stats")  # these and what lies under them: the dashboard (see above)
BASIC_CHALLENGE = 'Basic realm="kvgate", charset="UTF-8"'
LOGIN_PAGE = (
    b"<!doctype html><title>kvgate: sign in</title><h1 id=login>kvgate dashboard: sign in</h1>"
    b"<p>This page needs an API key. Your browser asks for a user name (any) and a password: "
    b"one of the proxy's <code>auth.keys</code>. Reload to try again.</p>"
)
LOOPBACK_NAMES = frozenset({"localhost"})

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of a request's first `Authorization` header when it says `Bearer <token>`, raw
    bytes; None without one."""
    for name, value in headers:
        if name == b"authorization":
            return bearer_of(value)
    return None


def bearer_of(authorization: bytes | None) -> bytes | None:
    """The token of an `Authorization` header's value when it says `Bearer <token>`; None otherwise."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(b" ")
    return token.strip() or None if scheme.lower() == b"bearer" else None


def bearer_text(scope: Scope) -> str | None:
    """The bearer token of a request's scope, decoded as Starlette decodes headers (latin-1);
    None without one. Where a tenant's token is read (proxy handlers; the chat path reads the
    header's value from its own map of the headers, through `text_of_bearer`)."""
    return text_of_bearer(bearer_token(scope.get("headers") or []))


def text_of_bearer(token: bytes | None) -> str | None:
    return token.decode("latin-1") if token is not None else None


def basic_password(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The password of an `Authorization: Basic base64(user:password)` header; None without one."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, encoded = value.partition(b" ")
            if scheme.lower() != b"basic":
                return None
            try:
                _, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return None
            return password or None if sep else None
    return None


def on_dashboard(path: str, method: str) -> bool:
    """Whether a request is a read of the dashboard (Basic credentials accepted)."""
    return method in ("GET", "HEAD") and any(path == p or path.startswith(p + "/") for p in BASIC_PATHS)


def key_allowed(token: bytes | None, keys: frozenset[bytes]) -> bool:
    """Constant-time against every key, so response timing does not leak a key's prefix."""
    if token is None:
        return False
    return any(hmac.compare_digest(token, key) for key in keys)


class KeyGate:
    """Refuses (401, OpenAI error JSON) every HTTP request without a configured key."""

    def __init__(
        self,
        app: ASGIApp,
        keys: frozenset[str],
        open_paths: frozenset[str] = OPEN_PATHS,
        admin_keys: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.keys = frozenset(k.encode() for k in keys)
        self.open_paths = open_paths
        self.admin_keys = frozenset(k.encode() for k in admin_keys)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.keys and scope["type"] == "http" and scope["path"] not in self.open_paths:
            headers = scope.get("headers") or []
            token = bearer_token(headers)
            dashboard = on_dashboard(scope["path"], scope.get("method", ""))
            if dashboard and token is None:
                token = basic_password(headers)
            if not key_allowed(token, self.keys) and not self._admin(scope["path"], token):
                await _refusal(token, dashboard, headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _admin(self, path: str, token: bytes | None) -> bool:
        """An admin key on an admin path (only asked once a tenant key was refused)."""
        return bool(self.admin_keys) and path.startswith(ADMIN_PREFIX) and key_allowed(token, self.admin_keys)


def _refusal(token: bytes | None, dashboard: bool, headers: list[tuple[bytes, bytes]]) -> Response:
    """401: OpenAI error JSON; on the dashboard a Basic challenge (the browser's login prompt),
    with a sign-in page instead of JSON for a browser."""
    err = Unauthorized("missing or unknown API key" if token is None else "invalid API key")
    if not dashboard:
        return error_response(err, {"www-authenticate": "Bearer"})
    challenge = {"www-authenticate": BASIC_CHALLENGE}
    accept = next((v for k, v in headers if k == b"accept"), b"")
    if b"text/html" in accept:
        return Response(LOGIN_PAGE, status_code=err.status, media_type="text/html", headers=challenge)
    return error_response(err, challenge)


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
        return (
            f"binding to {host} with no auth.keys: anyone who can reach this address can use "
            "the backends and read cached answers; set auth.keys or bind 127.0.0.1"
        )
    return f"binding to {host}: the proxy is reachable beyond this machine (auth.keys is set)"
