"""OpenAI error JSON (`{"error": {...}}`): the one mapping from an exception to an HTTP answer.

Every refusal and failure of the proxy leaves through `error_response`: the key gate's 401, the
admission gate's 429, the lean chat path, and FastAPI's exception handlers (middleware/server/proxy.py).
A stream that already answered 200 reports its error in-band instead (KvgateError.sse).
"""

from __future__ import annotations

import logging

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from kvgate.middleware.errors import BadRequest, KvgateError

log = logging.getLogger("kvgate.proxy")
CLIENT_CLOSED = 499  # nginx's status for a client that left before its answer: nobody reads it


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str]:
    """(message, field) of a validation error's first problem; the field without FastAPI's "body"."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    return f"invalid request: {field}: {first.get('msg')}", field


def as_error(exc: BaseException) -> KvgateError:
    """Any exception as a KvgateError: a KvgateError as is; a validation error a 400 naming the
    field; Starlette's HTTPException its own status; anything else a 500, logged with its traceback."""
    if isinstance(exc, KvgateError):
        return exc
    if isinstance(exc, (RequestValidationError, ValidationError)):
        message, field = validation_message(exc)
        return BadRequest(message, param=field)
    if isinstance(exc, HTTPException):
        err = KvgateError(str(exc.detail))
        err.status, err.type = exc.status_code, "invalid_request_error"
        return err
    if isinstance(exc, ClientDisconnect):  # also body.ClientGone: the client left, nothing went wrong here
        err = KvgateError("client closed the request")
        err.status, err.type = CLIENT_CLOSED, "invalid_request_error"
        return err
    log.exception("unexpected error", exc_info=exc)
    return KvgateError(f"internal error: {type(exc).__name__}")


def error_response(exc: BaseException, headers: dict[str, str] | None = None) -> JSONResponse:
    """`exc` as OpenAI error JSON with its status (see as_error); `headers` added to the answer."""
    err = as_error(exc)
    extra = exc.headers if isinstance(exc, HTTPException) else None  # e.g. a 405's Allow
    return JSONResponse(err.to_json(), status_code=err.status, headers={**(extra or {}), **(headers or {})} or None)
