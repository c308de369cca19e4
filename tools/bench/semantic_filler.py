"""Realistic filler for `kvgate bench semantic --entries N`: real questions, deterministic variants
of them, and the held-out queries that go with them.

Random unit vectors make a poor filler: no query comes near them (|cos| ~ 0.05), so the nearest
neighbour stands out and the HNSW search is easy. Real questions crowd the space the queries
land in, as a production cache does. Sources: every question of a QQP-format CSV (question1,
question2, is_duplicate) and of GPTCache's mock data ([{origin, similar}]).

Split (deterministic: a hash of the text, HELD_OUT_PERCENT of the pairs):
* paraphrase queries: of a held-out duplicate pair (a QQP duplicate, or a mock pair), the second
  question is a query and is never stored; the first is stored like any other question, so the
  right hit returns it or one of its variants (`Query.expected` is its base id);
* unrelated queries: of a held-out non-duplicate pair, both questions stay out; one is a query
  that should miss (its nearest stored neighbour is some other question; a hit there is wrong);
* every other distinct question is a base of the filler.

Filler order: the bases (shuffled with a fixed seed), then rounds of one variant of every base:
a prefix ("Can you tell me ..."), a suffix ("... Thanks!"), a synonym from a small list, a
number changed, two words swapped, or a casual lowercase form, one or two of them, chosen from a
hash of (text, round). Every text is distinct and none equals a query. The order does not depend
on N: the first N texts are the same for every N, so one embedding cache (kvgate.tools.bench.embed_cache)
serves every size.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from kvgate.tools.tuning.pairs import BenchInputError
from kvgate.tools.tuning.synthetic import edit_number

HELD_OUT_PERCENT = 10
GENERATOR_VERSION = "1"  # bump when the texts change: the embedding cache is keyed by it
SHUFFLE_SEED = 13
PREFIXES = (
    "Can you tell me {}",
    "I'd like to know: {}",
    "Quick question: {}",
    "Does anyone know {}",
    "I was wondering, {}",
    "Please explain: {}",
    "Help me out here: {}",
    "Serious question: {}",
)
SUFFIXES = (
    "{} Thanks!",
    "{} Any ideas?",
    "{} Please help.",
    "{} Asking for a friend.",
    "{} I need a quick answer.",
    "{} Thanks in advance.",
)
SYNONYMS = (
    ("best", "top"),
    ("good", "great"),
    ("way", "method"),
    ("learn", "study"),
    ("buy", "purchase"),
    ("make", "create"),
    ("get", "obtain"),
    ("start", "begin"),
    ("big", "large"),
    ("help", "assist"),
    ("use", "utilize"),
    ("job", "position"),
    ("money", "cash"),
    ("improve", "boost"),
    ("easy", "simple"),
    ("hard", "difficult"),
    ("people", "folks"),
    ("think", "believe"),
    ("quickly", "fast"),
    ("important", "crucial"),
    ("difference", "distinction"),
    ("choose", "pick"),
    ("find", "locate"),
    ("fix", "repair"),
    ("happen", "occur"),
    ("country", "nation"),
    ("famous", "well-known"),
    ("movie", "film"),
    ("phone", "mobile"),
    ("car", "vehicle"),
    ("cheap", "inexpensive"),
    ("begin", "start"),
    ("reason", "cause"),
    ("idea", "notion"),
    ("life", "existence"),
)
_SYNONYM = {a: b for a, b in SYNONYMS}
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


@dataclass(frozen=True)
class Query:
    """A measured semantic request: `kind` is "paraphrase" (its `expected` base is stored),
    "unrelated" (nothing of its pair is stored) or, in the benchmark, "seed" (a hand-written
    paraphrase of a question seeded through the proxy; `expected` is the seed's index)."""

    kind: str
    text: str
    expected: int | None


@dataclass(frozen=True)
class FillerText:
    """One filler entry: its text and the id of the base question it derives from."""

    text: str
    base: int


@dataclass
class RealFiller:
    """The bases, the held-out queries and a digest of the inputs (for the embedding cache)."""

    bases: list[str]
    paraphrases: list[Query]
    unrelated: list[Query]
    digest: str
    sources: dict[str, int] = field(default_factory=dict)

    def texts(self, n: int) -> list[FillerText]:
        """The first n filler texts (bases, then rounds of variants; see the module docstring)."""
        out: list[FillerText] = []
        for item in self._stream():
            if len(out) >= n:
                break
            out.append(item)
        if len(out) < n:
            raise BenchInputError(f"the filler questions give only {len(out)} distinct texts, {n} asked")
        return out

    def _stream(self) -> Iterator[FillerText]:
        seen = set(self.bases) | {q.text for q in self.paraphrases} | {q.text for q in self.unrelated}
        for i, text in enumerate(self.bases):
            yield FillerText(text, i)
        for rnd in range(1, 64):
            added = 0
            for i, text in enumerate(self.bases):
                new = variant(text, rnd, seen)
                if new is not None:
                    seen.add(new)
                    added += 1
                    yield FillerText(new, i)
            if not added:
                return


def variant(text: str, rnd: int, taken: set[str] | frozenset[str] = frozenset()) -> str | None:
    """A deterministic edited copy of `text` for round `rnd` that is not in `taken` (None when
    a few tries found none). Pure apart from reading `taken`."""
    rng = random.Random(zlib.crc32(text.encode()) * 1_000_003 + rnd)
    for _ in range(8):
        kinds = rng.sample(EDITS, 2 if rng.random() < 0.4 else 1)
        out: str | None = text
        for edit in kinds:
            out = edit(out, rng) if out is not None else None
        if out is not None and out != text and out not in taken:
            return out
    return None


def _lower_first(text: str) -> str:
    """ "What is X?" -> "what is X?"; "I ...", "USA ..." and "iPhone ..." are kept."""
    first = text.split(" ", 1)[0]
    if first == "I" or first.startswith("I'") or any(c.isupper() for c in first[1:]):
        return text
    return text[:1].lower() + text[1:]


def _prefix(text: str, rng: random.Random) -> str | None:
    return rng.choice(PREFIXES).format(_lower_first(text))


def _suffix(text: str, rng: random.Random) -> str | None:
    return rng.choice(SUFFIXES).format(text)


def _synonym(text: str, rng: random.Random) -> str | None:
    words = [m for m in _WORD.finditer(text) if m.group(0).lower() in _SYNONYM]
    if not words:
        return None
    m = rng.choice(words)
    word, new = m.group(0), _SYNONYM[m.group(0).lower()]
    new = new[:1].upper() + new[1:] if word[:1].isupper() else new
    return text[: m.start()] + new + text[m.end() :]


def _number(text: str, rng: random.Random) -> str | None:
    return edit_number(text)


def _swap(text: str, rng: random.Random) -> str | None:
    words = text.split(" ")
    if len(words) < 4:
        return None
    i = rng.randrange(1, len(words) - 2)  # never the first word nor the last (it carries the "?")
    words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def _casual(text: str, rng: random.Random) -> str | None:
    out = text.rstrip("?").rstrip()
    return out[:1].lower() + out[1:] if out else None


EDITS: tuple[Callable[[str, random.Random], str | None], ...] = (_prefix, _suffix, _synonym, _number, _swap, _casual)


def _held_out(text: str) -> bool:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") % 100 < HELD_OUT_PERCENT


def load_real_filler(pairs_path: Path, positives_path: Path | None) -> RealFiller:
    """Read the sources and split them (see the module docstring). Raises BenchInputError for a
    missing or malformed file."""
    from kvgate.tools.tuning.pairs import read_pairs

    pairs, _ = read_pairs(pairs_path)
    positives = _read_positives(positives_path) if positives_path is not None else []
    digest = hashlib.sha256(GENERATOR_VERSION.encode())
    for path in (pairs_path, positives_path):
        if path is not None:
            digest.update(path.read_bytes())
    duplicates = [(p.question1, p.question2) for p in pairs if p.duplicate] + positives
    others = [(p.question1, p.question2) for p in pairs if not p.duplicate]
    para_pairs = [(a, b) for a, b in duplicates if a != b and _held_out(a + "\0" + b)]
    unrelated_pairs = [(a, b) for a, b in others if _held_out(a + "\0" + b)]
    held = {b for _, b in para_pairs} | {t for pair in unrelated_pairs for t in pair}
    everything = [t for p in pairs for t in (p.question1, p.question2)] + [t for pair in positives for t in pair]
    bases = sorted({t for t in everything if t not in held})
    random.Random(SHUFFLE_SEED).shuffle(bases)
    base_id = {t: i for i, t in enumerate(bases)}
    paraphrases = _ordered([Query("paraphrase", b, base_id[a]) for a, b in para_pairs if a in base_id])
    unrelated = _ordered([Query("unrelated", b, None) for _, b in unrelated_pairs])
    sources = {
        "pairs": len(pairs),
        "positives": len(positives),
        "bases": len(bases),
        "paraphrase_queries": len(paraphrases),
        "unrelated_queries": len(unrelated),
    }
    return RealFiller(bases, paraphrases, unrelated, digest.hexdigest(), sources)


def _ordered(queries: list[Query]) -> list[Query]:
    """Distinct texts in a fixed pseudo-random order (so the first k mix QQP and mock data)."""
    unique = {q.text: q for q in queries}
    return sorted(unique.values(), key=lambda q: hashlib.sha256(q.text.encode()).digest())


def _read_positives(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise BenchInputError(f"positives file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BenchInputError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, list) or not all(isinstance(d, dict) and "origin" in d and "similar" in d for d in data):
        raise BenchInputError(f'{path}: expected a list of {{"origin": ..., "similar": ...}} objects')
    return [
        (str(d["origin"]).strip(), str(d["similar"]).strip())
        for d in data
        if str(d["origin"]).strip() and str(d["similar"]).strip()
    ]


def interleave(*lists: Sequence[Query], limit: int) -> list[Query]:
    """Round-robin over `lists` until `limit` items (or all are used): kinds evenly spread in time."""
    out: list[Query] = []
    iters = [iter(x) for x in lists]
    while iters and len(out) < limit:
        for it in list(iters):
            item = next(it, None)
            if item is None:
                iters.remove(it)
            elif len(out) < limit:
                out.append(item)
    return out


def filler_base(content: str) -> int | None:
    """The base id in a filler entry's answer (see `filler_answer`), None for other answers."""
    m = re.fullmatch(r"filler answer #(\d+)", content)
    return int(m.group(1)) if m else None


def filler_answer(base: int) -> str:
    """The stored answer of a filler entry derived from base `base`."""
    return f"filler answer #{base}"
