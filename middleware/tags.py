"""A request's cache tags: the client's (`x-kvgate-tags: doc:123@v4, team:a`, the SDK's
`cache_tags=[...]`), checked here, and the ones kvgate adds from the request itself (the system
prompt's hash). The model revision's tag is added where the entry is stored
(kvgate.index.responses.semantic); what each tag means: kvgate.index.responses.tags.
"""

from __future__ import annotations

from typing import Any

from kvgate.index.responses.tags import MAX_TAGS, system_tag, tag_problem
from kvgate.middleware.canonical import canonical_json
from kvgate.middleware.errors import BadRequest
from kvgate.middleware.request import SYSTEM_ROLES, RequestView, text_of

TAGS_HEADER = "x-kvgate-tags"


def parse_tags(value: Any, param: str = TAGS_HEADER, client: bool = True) -> tuple[str, ...]:
    """The tags of a header's text (comma separated) or of a list; BadRequest naming `param` for
    anything else, more than MAX_TAGS (a client's), or a tag outside the alphabet."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise BadRequest(f"`{param}` must be a list of tags like ['doc:123@v4']", param=param)
    if client and len(value) > MAX_TAGS:
        raise BadRequest(f"`{param}`: at most {MAX_TAGS} tags per request, got {len(value)}", param=param)
    for tag in value:
        problem = tag_problem(tag, client)
        if problem is not None:
            raise BadRequest(f"`{param}`: {problem}", param=param)
    return tuple(dict.fromkeys(value))


def system_prompt(messages: list[dict[str, Any]]) -> str | None:
    """The text `system_tag` hashes: the system and developer messages' contents in order, joined
    by a newline (a content that is not text, as canonical JSON); None without such a message."""
    parts = []
    for message in messages:
        if message.get("role") in SYSTEM_ROLES:
            content = message.get("content")
            text = text_of(content)
            parts.append(text if text is not None else canonical_json(content))
    return "\n".join(parts) if parts else None


def entry_tags(view: RequestView) -> list[str]:
    """What an answer to `view` is tagged with before the store adds the model revision."""
    system = system_prompt(view.messages)
    return [*view.control.tags, *([system_tag(system)] if system is not None else [])]
