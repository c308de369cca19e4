"""AdminClient: a running proxy's admin API from Python, and `kvgate admin ...` on top of it:
erase a tenant, invalidate tagged answers, print a key's tenant id. The contract is
middleware/server/governance.py's; a refusal comes back as AdminError with the proxy's OpenAI
error message. Keys are read from environment variables the command names, never from its
arguments (which other users of the machine can read)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Any
from urllib.parse import quote

import httpx

from kvgate.index.responses.tags import model_tag, system_tag

TIMEOUT_S = 600.0  # an erasure is a pass over the stores


def tenant_id(api_key: str) -> str:
    """The tenant id a proxy gives a caller of this API key (kvgate.middleware.server.proxy.tenant_of)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:24]


class AdminError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class AdminClient:
    """`key`: an admin key (auth.admin_keys), or for `invalidate(own=True)` a tenant's own key."""

    def __init__(self, base_url: str, key: str, timeout_s: float = TIMEOUT_S) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, headers={"authorization": f"Bearer {key}"}
        )

    def erase_tenant(self, tenant: str) -> dict[str, Any]:
        """DELETE /v1/admin/tenants/{tenant}: counts per layer and the tenant's new salt epoch."""
        return self._call("DELETE", f"/v1/admin/tenants/{quote(tenant, safe='')}")

    def invalidate(
        self, tags: list[str], tenant: str | None = None, sweep: bool = False, own: bool = False
    ) -> dict[str, Any]:
        """How many answers tagged with any of `tags` were removed: every tenant's or `tenant`'s
        (POST /v1/admin/invalidate, an admin key), or with `own` the key's tenant's own
        (POST /v1/cache/invalidate, a tenant's key)."""
        body: dict[str, Any] = {"tags": list(tags), "sweep": sweep}
        if tenant is not None:
            body["tenant"] = tenant
        return self._call("POST", "/v1/cache/invalidate" if own else "/v1/admin/invalidate", json=body)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._http.request(method, path, **kwargs)
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        if response.status_code >= 400:
            error = payload.get("error") if isinstance(payload, dict) else None
            message = error.get("message") if isinstance(error, dict) else response.text[:200]
            raise AdminError(response.status_code, str(message))
        return payload

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kvgate admin erase-tenant | invalidate | tenant-id`."""
    sub = parser.add_subparsers(dest="admin", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default="http://127.0.0.1:8080", help="the proxy (default http://127.0.0.1:8080)")
    common.add_argument(
        "--key-env",
        default="KVGATE_ADMIN_KEY",
        help="NAME of the environment variable holding the key to send (default KVGATE_ADMIN_KEY)",
    )
    erase = sub.add_parser(
        "erase-tenant",
        parents=[common],
        help="remove a tenant's answers, vectors, feedback marks and request ids; give it a new salt epoch (its KV no longer matches)",
    )
    erase.add_argument("tenant", nargs="?", help="the tenant id (see tenant-id)")
    erase.add_argument("--tenant-key-env", help="NAME of a variable holding the tenant's API key, instead of its id")
    inv = sub.add_parser("invalidate", parents=[common], help="remove every answer with any of the given tags")
    inv.add_argument("--tag", action="append", default=[], help="a tag, e.g. doc:123@v4 (repeatable)")
    inv.add_argument(
        "--system-prompt-file",
        type=argparse.FileType("r"),
        help="answers made under the system prompt that is this file's exact text",
    )
    inv.add_argument("--model-revision", help="answers made with this model revision")
    inv.add_argument("--tenant", help="only this tenant's answers (with an admin key)")
    inv.add_argument("--own", action="store_true", help="--key-env holds a tenant's key: its own answers only")
    inv.add_argument("--sweep", action="store_true", help="read every entry instead of the tag index")
    ident = sub.add_parser("tenant-id", help="print the tenant id a proxy gives an API key")
    ident.add_argument("--tenant-key-env", required=True, help="NAME of a variable holding the API key")


def main(args: argparse.Namespace) -> int:
    if args.admin == "tenant-id":
        key = _env(args.tenant_key_env)
        return 2 if key is None else print(tenant_id(key)) or 0
    key = _env(args.key_env)
    if key is None:
        return 2
    try:
        with AdminClient(args.url, key) as client:
            if args.admin == "erase-tenant":
                tenant = args.tenant
                if args.tenant_key_env:
                    tenant_key = _env(args.tenant_key_env)
                    if tenant_key is None:
                        return 2
                    tenant = tenant_id(tenant_key)
                if not tenant:
                    print("kvgate admin erase-tenant: give a tenant id or --tenant-key-env", file=sys.stderr)
                    return 2
                out = client.erase_tenant(tenant)
            else:
                tags = list(args.tag)
                if args.system_prompt_file is not None:
                    tags.append(system_tag(args.system_prompt_file.read()))
                if args.model_revision:
                    tags.append(model_tag(args.model_revision))
                if not tags:
                    print(
                        "kvgate admin invalidate: give --tag, --system-prompt-file or --model-revision", file=sys.stderr
                    )
                    return 2
                out = client.invalidate(tags, args.tenant, args.sweep, own=args.own)
    except AdminError as exc:
        print(f"kvgate admin {args.admin}: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"kvgate admin {args.admin}: {args.url} unreachable ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2))
    return 0


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    if not value:
        print(f"kvgate admin: the environment variable {name} is not set", file=sys.stderr)
        return None
    return value
