"""One exception hierarchy; the proxy maps it to HTTP in one place (proxy.error_response)."""
from __future__ import annotations


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


class BackendError(KvgateError):
    """The backend (through LiteLLM) failed; carries its message and status when known."""

    status = 502
    type = "backend_error"

    def __init__(self, message: str, *, backend_status: int | None = None) -> None:
        super().__init__(message)
        self.backend_status = backend_status
