"""The keys' text: deterministic JSON of a request's parts and the SHA-256 digests over it.

Pure functions, no state: the same parts give the same text and the same digest in every
process and every release that keeps KEY_VERSION, so stored answers stay findable across
restarts and are shared between processes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import orjson

KEY_VERSION = 1
# shape checks at C speed: ONLY_STR.issuperset(map(type, items)) holds when every item is a str
ONLY_STR = frozenset({str})
ONLY_DICT = frozenset({dict})
_INT64 = 1 << 63  # orjson writes integers within 64 bits; json.dumps any


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, None-valued dict keys dropped at every level.

    Invariant: the text is `json.dumps(…, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False, default=str)` of the cleaned value, byte for byte (keys made before
    stay valid). orjson writes it when every leaf is a str, bool, None or 64-bit int, where the two
    agree (much faster on long conversations); floats (whose text differs: 1e-05 vs 0.00001) and
    anything else go through json.dumps."""
    kind = type(value)
    if kind is str:  # a key's scalar parts (route, model, tenant): no cleaning to do
        try:
            return orjson.dumps(value).decode()
        except orjson.JSONEncodeError:  # a lone surrogate, which json.dumps writes as it is
            return json.dumps(value, ensure_ascii=False)
    elif value is None or kind is bool or (kind is int and -_INT64 <= value < _INT64):
        return orjson.dumps(value).decode()
    if kind is dict and ONLY_STR.issuperset(map(type, value)) and ONLY_STR.issuperset(map(type, value.values())):
        try:  # the usual message: string keys and values, nothing to clean (checked at C speed)
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONEncodeError:
            pass
    clean, plain = _drop_none(value)
    if plain:
        try:
            return orjson.dumps(clean, option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONEncodeError:  # e.g. a lone surrogate, which json.dumps writes as it is
            pass
    return json.dumps(clean, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _drop_none(value: Any) -> tuple[Any, bool]:
    """(value without None-valued dict keys, tuples as lists, pydantic objects dumped; whether
    orjson renders it as json.dumps does)."""
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return value, True
    if isinstance(value, int):
        return value, -_INT64 <= value < _INT64
    if isinstance(value, Mapping):
        out, plain = {}, True
        for k, v in value.items():
            if v is not None:
                out[str(k)], p = _drop_none(v)
                plain = plain and p
        return out, plain
    if isinstance(value, (list, tuple)):
        items = [_drop_none(v) for v in value]
        return [v for v, _ in items], all(p for _, p in items)
    if hasattr(value, "model_dump"):  # pydantic objects passed by SDK users (e.g. litellm Message)
        return _drop_none(value.model_dump())
    return value, False


@dataclass(frozen=True)
class Rendered:
    """A part already written as canonical JSON (`canonical_list`): digest uses its text as is."""

    text: str


_TEXT_PARTS = frozenset({str, type(None), Rendered})  # what `digest` writes in one orjson call
_OWN_DATACLASSES = orjson.OPT_PASSTHROUGH_DATACLASS  # a Rendered goes to `_fragment`, not out as a dict


def canonical_list(rendered: Sequence[str]) -> Rendered:
    """The canonical JSON of a list from its items' canonical JSON texts.

    Invariant: canonical_list([canonical_json(x) for x in xs]).text == canonical_json(xs), since
    both writers join list items with a bare comma; so a conversation's messages are written
    once and shared by the exact key (all of them) and the scope (the earlier ones)."""
    return Rendered("[" + ",".join(rendered) + "]")


def plain_list(messages: Sequence[Any]) -> Rendered | None:
    """canonical_list of `messages` written in one pass at C speed, when every message is a dict of
    str keys to str values (where orjson writes what canonical_json writes item by item); None
    otherwise, and where orjson refuses a text (a lone surrogate), which the item-by-item writer takes."""
    if not (
        ONLY_DICT.issuperset(map(type, messages))
        and ONLY_STR.issuperset(map(type, chain.from_iterable(messages)))
        and ONLY_STR.issuperset(map(type, chain.from_iterable(map(dict.values, messages))))
    ):
        return None
    try:
        return Rendered(orjson.dumps(messages, option=orjson.OPT_SORT_KEYS).decode())
    except orjson.JSONEncodeError:
        return None


def digest(*parts: Any) -> str:
    """sha256 over the canonical JSON of `parts`; equal inputs ⇔ equal digests (up to sha256).
    Each part is written on its own (see canonical_json), joined as json.dumps joins a list.
    Parts that are all strings, None or Rendered (the usual key: its dict parts rendered by the
    caller) are written by one orjson call, which writes each of them as canonical_json does."""
    if _TEXT_PARTS.issuperset(map(type, parts)):
        try:
            return hashlib.sha256(
                orjson.dumps([KEY_VERSION, *parts], default=_fragment, option=_OWN_DATACLASSES)
            ).hexdigest()
        except orjson.JSONEncodeError:  # a lone surrogate: json.dumps writes it as it is
            pass
    text = "[" + ",".join(map(_part_text, (KEY_VERSION, *parts))) + "]"
    return hashlib.sha256(text.encode()).hexdigest()


def rendered(value: Any) -> Rendered:
    """`value` written once as canonical JSON, for the several digests it is a part of."""
    return Rendered(canonical_json(value))


def _part_text(part: Any) -> str:
    return part.text if type(part) is Rendered else canonical_json(part)


def _fragment(part: Any) -> orjson.Fragment:
    if type(part) is Rendered:
        return orjson.Fragment(part.text)
    raise TypeError  # orjson turns it into JSONEncodeError: the part-by-part writer takes it
