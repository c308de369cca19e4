"""Tags of a response entry, and the index terms a store files an entry under.

Every entry carries tags (`CacheEntry.tags`) that say what its answer depends on, so an operator
can remove the answers a change makes wrong (`POST /v1/admin/invalidate`):
  model:<revision>   the backend model's revision when the answer was made (the engine's report or
                     the route's `model_revision`); a revision outside the tag alphabet, or longer
                     than a tag may be, is written as its digest (`model_tag`)
  system:<16 hex>    SHA-256 of the system prompt (`system_tag`), on chat requests that have one
  anything else      the client's own (`x-kvgate-tags`, the SDK's `cache_tags`), e.g. `doc:123@v4`
A store also files each entry under `tenant:<digest of its tenant>` (`index_terms`), so one
tenant's entries are found without reading the others'; that term is no tag, and the digest keeps
tenant names out of key names.

Pure functions; the alphabet keeps a tag usable inside a store's key (no separator, no space).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable

MODEL = "model:"
SYSTEM = "system:"
TENANT = "tenant:"
RESERVED = (MODEL, SYSTEM, TENANT)  # prefixes kvgate writes itself: a client's tag may not start with one
MAX_TAG_CHARS = 200
MAX_TAGS = 16  # client tags per request
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=~-]*")
ALPHABET = "letters, digits and . _ : @ / + = ~ - (starting with a letter or digit)"


def tag_problem(tag: Any, client: bool = True) -> str | None:
    """Why `tag` is not a valid tag (None when it is). A client's tag may not use a reserved
    prefix; an operator's (invalidate) may name model: and system: tags, never tenant: terms."""
    if not isinstance(tag, str) or not tag:
        return "a tag must be a non-empty string"
    if len(tag) > MAX_TAG_CHARS:
        return f"tag {tag[:40]!r}… is longer than {MAX_TAG_CHARS} characters"
    if not TAG_RE.fullmatch(tag):
        return f"tag {tag!r} may hold only {ALPHABET}"
    reserved = RESERVED if client else (TENANT,)
    if tag.startswith(reserved):
        return f"tag {tag!r}: the prefixes {', '.join(reserved)} are kvgate's own"
    return None


def digest16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def system_tag(system_prompt: str) -> str:
    """`system:` + the first 16 hex digits of SHA-256 of the system prompt's text (the texts of a
    request's system and developer messages, in order, joined by a newline)."""
    return SYSTEM + digest16(system_prompt)


def model_tag(revision: str) -> str:
    """`model:<revision>`, or `model:<digest16 of it>` when the revision is not a valid tag."""
    tag = MODEL + revision
    return tag if tag_problem(tag, client=False) is None else MODEL + digest16(revision)


def tenant_term(tenant: str) -> str:
    """The index term of a tenant's entries (a digest: no tenant name in a key)."""
    return TENANT + hashlib.sha256(tenant.encode()).hexdigest()[:32]


def index_terms(tags: Iterable[str] | None, tenant: str | None) -> list[str]:
    """What a store files an entry under: its tags and, with a tenant, its tenant term."""
    terms = list(dict.fromkeys(tags or ()))
    return terms + [tenant_term(tenant)] if tenant is not None else terms


def revision_tag(tags: Iterable[str] | None) -> str | None:
    """The entry's model: tag, if it has one."""
    return next((t for t in tags or () if t.startswith(MODEL)), None)
