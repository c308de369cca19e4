"""Labelled question pairs (a CSV with question1, question2, is_duplicate; Quora's format): the
input of `kvgate tune` and `kvgate bench semantic`."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

REQUIRED_COLUMNS = ("question1", "question2", "is_duplicate")
TRUE_VALUES = frozenset({"1", "true", "yes"})
FALSE_VALUES = frozenset({"0", "false", "no"})


class BenchInputError(ValueError):
    """A problem with the benchmark's input or arguments, shown to the user as one line."""


@dataclass(frozen=True)
class Pair:
    question1: str
    question2: str
    duplicate: bool


def read_pairs(path: Path, limit: int | None = None) -> tuple[list[Pair], int]:
    """Usable pairs from a CSV (first `limit`), and how many rows were skipped for an empty question.

    Raises BenchInputError for a missing file, missing columns or an unreadable is_duplicate.
    """
    if not path.is_file():
        raise BenchInputError(f"pairs file {path} does not exist" if not path.exists() else f"{path} is not a file")
    pairs: list[Pair] = []
    skipped = 0
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            columns = [c.strip() for c in (reader.fieldnames or [])]
            missing = [c for c in REQUIRED_COLUMNS if c not in columns]
            if missing:
                raise BenchInputError(
                    f"{path}: missing column(s) {', '.join(missing)}; need {', '.join(REQUIRED_COLUMNS)}, "
                    f"found {', '.join(columns) or 'no header'}"
                )
            reader.fieldnames = columns
            for row in reader:
                q1 = (row.get("question1") or "").strip()
                q2 = (row.get("question2") or "").strip()
                if not q1 or not q2:
                    skipped += 1
                    continue
                flag = (row.get("is_duplicate") or "").strip().lower()
                if flag not in TRUE_VALUES | FALSE_VALUES:
                    raise BenchInputError(f"{path} line {reader.line_num}: is_duplicate must be 0 or 1, got {flag!r}")
                pairs.append(Pair(q1, q2, flag in TRUE_VALUES))
                if limit is not None and len(pairs) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise BenchInputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise BenchInputError(f"{path}: not a readable CSV ({exc})") from None
    if not pairs:
        raise BenchInputError(f"{path}: no usable pairs (rows with both questions non-empty)")
    return pairs, skipped
