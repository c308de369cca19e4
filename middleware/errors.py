"""One exception hierarchy; the proxy maps it to HTTP in one place (middleware/server/responses.py)."""

from __future__ import annotations

import json


class KvgateError(Exception):
    """Base class. `status` and `type` follow OpenAI's error JSON."""

    status = 500
    type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def sse(self) -> bytes:
        """The error as an in-band server-sent event, for a stream that already answered 200."""
        return b"data: " + json.dumps(self.to_json(), separators=(",", ":")).encode() + b"\n\n"


class ConfigError(KvgateError):
    """The YAML config is missing, unreadable or invalid; the message names the field."""

    type = "config_error"


class BadRequest(KvgateError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(KvgateError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotFound(KvgateError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RequestNotFound(KvgateError):
    """Feedback on a request id that is unknown, expired, or another tenant's."""

    status = 404
    type = "invalid_request_error"
    code = "request_not_found"


class Forbidden(KvgateError):
    """A valid key that may not do this (the admin API with a tenant key, or with none configured)."""

    status = 403
    type = "invalid_request_error"
    code = "forbidden"


class NotFound(KvgateError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Conflict(KvgateError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class Overloaded(KvgateError):
    """The proxy has `server.max_in_flight` requests in flight already (kvgate.middleware.server.admission)."""

    status = 429
    type = "rate_limit_error"
    code = "overloaded"


class BackendError(KvgateError):
    """The backend (through LiteLLM) failed; carries its message and status when known."""

    status = 502
    type = "backend_error"

    # The backend (or LiteLLM on its behalf) refused the request itself: the caller's problem,
    # passed on with its own status. 401/403 are not: they mean kvgate's backend key is wrong.
    CALLER_STATUSES = frozenset({400, 404, 413, 422, 429})

    def __init__(self, message: str, *, backend_status: int | None = None) -> None:
        super().__init__(message)
        self.backend_status = backend_status
        if backend_status in self.CALLER_STATUSES:
            self.status = backend_status
            self.type = "rate_limit_error" if backend_status == 429 else "invalid_request_error"


class StoreUnavailable(KvgateError):
    """An operator's call (an erasure, an invalidation) could not finish: the store failed. Unlike a
    request's cache work, which a failing store turns into a miss, this must be known and retried."""

    status = 503
    type = "store_error"
    code = "store_unavailable"
