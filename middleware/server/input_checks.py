"""Checks on a parsed chat request that JSON Schema cannot express (proxy side).

Each failure is a BadRequest naming the field, so a client sees what to fix instead of a 5xx
from deep inside the pipeline or LiteLLM.
"""

from __future__ import annotations

import re
from typing import Any

from kvgate.middleware.config import ServerConfig
from kvgate.middleware.errors import BadRequest

TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
# A JSON escape of a UTF-16 surrogate; only then can the parsed text hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def check_token_caps(body: dict[str, Any], server: ServerConfig) -> None:
    """Refuse token budgets above the server's cap (the schema already refuses < 1)."""
    for name in TOKEN_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and value > server.max_tokens_cap:
            raise BadRequest(
                f"{name} {value} is above this server's limit of {server.max_tokens_cap} (server.max_tokens_cap)",
                param=name,
            )


def check_unicode(body: Any, raw: bytes) -> None:
    """Refuse text holding a lone surrogate: valid JSON, not valid Unicode, and it would fail
    later when the request is hashed or sent on."""
    if _SURROGATE_ESCAPE.search(raw):  # cheap pre-check: a paired surrogate (an escaped emoji) is fine
        _check_unicode(body, "body")


def _check_unicode(value: Any, where: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(
                f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode", param=where
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, where)
            _check_unicode(item, f"{where}.{key}" if where != "body" else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{where}.{i}")
