"""Removals over HTTP: a tenant's erasure, and the invalidation of tagged answers.

    DELETE /v1/admin/tenants/{tenant}  (admin key)
           → 200 {"object": "tenant.erased", "tenant", "erased": {"entries", "vectors",
                  "feedback_marks", "request_log"}, "salt_epoch", "scrubbed"}
    POST   /v1/admin/invalidate  body {"tags": [TAG, ...], "tenant"?, "sweep"?}
           → 200 {"object": "cache.invalidated", "tags", "tenant", "removed"}
           with an admin key: every tenant's entries, or only "tenant"'s; with a tenant key (one
           of auth.keys): the caller's entries only ("tenant" may name the caller, nobody else: 403)
    POST   /v1/cache/invalidate  (a tenant's own key)  the same as a tenant key on the admin path

`tenant` is the id the proxy keys a tenant's data by: the first 24 hex digits of SHA-256 of its
API key (kvgate.middleware.server.proxy.tenant_of; `kvgate admin tenant-id` prints it), or the SDK's
tenant / `cache={"namespace": ...}`. The erasure takes middleware/server/admin.py's key check;
/v1/admin/invalidate takes an admin key, or a configured tenant key for that tenant's own entries
(a proxy without auth.keys has no tenant keys, so there only an admin key opens it); the same
tenant call is also under /v1/cache/, beside the tenant's feedback. "sweep": read every entry instead of the
tag index (see kvgate.index.responses.governance). Tags are checked as a client's are, except that
kvgate's own model: and system: tags may be named.

The work is kvgate.middleware.cache.governance's, in a worker thread (a pass over the stores).
Every proxy process on the same store sees the result: the entries and records are deleted in
the shared store, other processes' vectors follow its change log, and the salt epoch is read
from it (within store.follow_interval_s).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from kvgate.middleware.cache.governance import Governance
from kvgate.middleware.config import Config
from kvgate.middleware.errors import BadRequest, Forbidden, NotFound, Unauthorized
from kvgate.middleware.server.auth import ADMIN_PREFIX, bearer_text, key_allowed
from kvgate.middleware.server.body import parse_json, read_body
from kvgate.middleware.tags import parse_tags

log = logging.getLogger("kvgate.admin")
MAX_TENANT_CHARS = 200
MAX_INVALIDATE_TAGS = 256


class InvalidateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tags: list[str] = Field(min_length=1, max_length=MAX_INVALIDATE_TAGS)
    tenant: str | None = Field(None, min_length=1, max_length=MAX_TENANT_CHARS)
    sweep: bool = False


def add_governance(
    app: FastAPI, config: Config, require_admin: Callable[[Request], None], tenant_of: Callable[[str | None], str]
) -> None:
    """Register the three routes on `app` (the proxy's create_app calls this once)."""

    def governance(request: Request) -> Governance:
        found = getattr(request.app.state.pipeline, "governance", None)
        if found is None:
            raise NotFound("this proxy's pipeline keeps no governance (built without one)")
        return found

    @app.delete(f"{ADMIN_PREFIX}tenants/{{tenant}}", tags=["admin"], dependencies=[Depends(require_admin)])
    async def erase_tenant(request: Request, tenant: str) -> dict[str, Any]:
        if not 0 < len(tenant) <= MAX_TENANT_CHARS:
            raise BadRequest(f"a tenant id has 1 to {MAX_TENANT_CHARS} characters", param="tenant")
        outcome = await asyncio.to_thread(governance(request).erase_tenant, tenant)
        log.info("admin: tenant %s erased: %s", tenant, outcome.to_json()["erased"])
        return outcome.to_json()

    async def invalidate(request: Request, tenant: str | None, own: bool) -> dict[str, Any]:
        raw = await read_body(request.scope, request.receive, config.server.max_body_bytes)
        body = InvalidateBody.model_validate(await parse_json(raw, InvalidateBody))
        tags = parse_tags(body.tags, param="tags", client=False)
        if own and body.tenant not in (None, tenant):
            raise Forbidden(
                "a tenant key invalidates its own entries only; another tenant's need an admin key "
                "(POST /v1/admin/invalidate)",
                param="tenant",
            )
        tenant = tenant if own else body.tenant
        outcome = await asyncio.to_thread(governance(request).invalidate, tags, tenant, body.sweep)
        log.info(
            "invalidated %d entries tagged %s (%s)",
            outcome.removed,
            list(tags),
            "every tenant" if tenant is None else f"tenant {tenant}",
        )
        return outcome.to_json()

    body_schema = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": InvalidateBody.model_json_schema()}},
        }
    }

    tenant_keys = frozenset(k.encode() for k in config.auth.keys)

    def admin_or_tenant(request: Request) -> str | None:
        """None for an admin key (any tenant); the caller's tenant for one of auth.keys (its own
        entries); the admin check's refusal for anything else."""
        try:
            require_admin(request)
            return None
        except (Forbidden, Unauthorized):
            token = bearer_text(request.scope)
            if token is None or not key_allowed(token.encode("latin-1"), tenant_keys):
                raise
            return tenant_of(token)

    @app.post(f"{ADMIN_PREFIX}invalidate", tags=["admin"], openapi_extra=body_schema)
    async def admin_invalidate(request: Request, caller: str | None = Depends(admin_or_tenant)) -> dict[str, Any]:
        return await invalidate(request, caller, own=caller is not None)

    @app.post("/v1/cache/invalidate", openapi_extra=body_schema)
    async def tenant_invalidate(request: Request) -> dict[str, Any]:
        # the key gate in front of every route let only a configured key this far (with auth.keys
        # set); the tenant is derived from it as the chat path derives it
        return await invalidate(request, tenant_of(bearer_text(request.scope)), own=True)
