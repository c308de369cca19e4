"""Mooncake-format traces: one JSON object a line with `timestamp` (ms), `input_length`,
`output_length` (tokens) and `hash_ids` (one id per `block_tokens`-token prompt block).

Each hash id maps to the same deterministic text block every time, so equal id prefixes are equal
text prefixes. With the `text` tokenizer (one token per character) a block of 512 tokens is 512
characters, and a request's prompt is its blocks joined and cut to `input_length` characters.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ALPHABET = string.ascii_lowercase + "      "  # ~1 space in 5 characters: word-like text


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read a trace; a bad line raises ValueError naming the line and the field."""
    out: list[TraceRequest] = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                req = TraceRequest(
                    float(row["timestamp"]),
                    int(row["input_length"]),
                    int(row.get("output_length", 1)),
                    tuple(int(h) for h in row["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a Mooncake trace line ({type(exc).__name__}: {exc})") from None
            out.append(req)
            if limit and len(out) >= limit:
                break
    if not out:
        raise ValueError(f"{path}: no requests")
    return sorted(out, key=lambda r: r.timestamp_ms)


@lru_cache(maxsize=200_000)
def block_text(hash_id: int, block_tokens: int = 512) -> str:
    """The deterministic text of one hash id: same id, same text, in every process."""
    seed = int.from_bytes(hashlib.sha256(f"kvgate-trace:{hash_id}".encode()).digest()[:8], "little")
    rng = random.Random(seed)
    return "".join(rng.choices(ALPHABET, k=block_tokens))


def prompt_text(req: TraceRequest, block_tokens: int = 512) -> str:
    text = "".join(block_text(h, block_tokens) for h in req.hash_ids)
    return text[: req.input_length] if req.input_length <= len(text) else text
