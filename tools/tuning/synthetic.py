"""Synthetic training pairs: a question and a minimally edited copy that asks something else.

Embeddings put "lose weight in a week" and "... in a month" next to each other; a verifier learns
to tell them apart only if it sees such pairs. Each `edit_*` function is pure: given a question it
returns a changed question that needs a different answer (or None when the edit does not apply).
The kinds: number, unit/time span, year/month, named entity, negation, comparative, swapped roles.
`swap_symmetric` gives the opposite lesson: "A vs B" ↔ "B vs A" asks the same thing (a positive).

Choices that need variety (which number, which entity) come from a hash of the text, so the same
input always gives the same output.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable, Iterable, Sequence

# pairs of words that change the answer when exchanged; each is replaced in both directions
UNIT_SWAPS = (
    ("week", "month"),
    ("day", "year"),
    ("hour", "minute"),
    ("weeks", "months"),
    ("days", "years"),
    ("hours", "minutes"),
    ("km", "miles"),
    ("kg", "pounds"),
    ("kilograms", "pounds"),
    ("meters", "feet"),
    ("celsius", "fahrenheit"),
    ("dollars", "euros"),
    ("usd", "inr"),
    ("gb", "tb"),
    ("mb", "gb"),
    ("morning", "night"),
    ("weekly", "monthly"),
    ("daily", "yearly"),
    ("seconds", "minutes"),
)
COMPARATIVE_SWAPS = (
    ("better", "worse"),
    ("best", "worst"),
    ("more", "less"),
    ("most", "least"),
    ("bigger", "smaller"),
    ("higher", "lower"),
    ("faster", "slower"),
    ("cheaper", "costlier"),
    ("easier", "harder"),
    ("before", "after"),
    ("increase", "decrease"),
    ("advantages", "disadvantages"),
    ("pros", "cons"),
    ("largest", "smallest"),
    ("richest", "poorest"),
    ("strongest", "weakest"),
    ("good", "bad"),
    ("safe", "dangerous"),
    ("gain", "lose"),
    ("buy", "sell"),
    ("start", "stop"),
    ("male", "female"),
    ("men", "women"),
    ("old", "new"),
    ("first", "last"),
    ("above", "below"),
    ("increase", "reduce"),
)
AUXILIARIES = (
    "is",
    "are",
    "was",
    "were",
    "can",
    "could",
    "should",
    "would",
    "will",
    "do",
    "does",
    "did",
    "has",
    "have",
)
MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
FALLBACK_ENTITIES = (
    "India",
    "China",
    "Japan",
    "Germany",
    "France",
    "Canada",
    "Brazil",
    "Australia",
    "Python",
    "Java",
    "Google",
    "Apple",
    "Microsoft",
    "Amazon",
    "Facebook",
    "Tesla",
    "Delhi",
    "Mumbai",
    "London",
    "Paris",
    "Tokyo",
    "Obama",
    "Trump",
    "Hillary Clinton",
)

_CONTRACTIONS = {
    "can't": "can",
    "won't": "will",
    "don't": "do",
    "doesn't": "does",
    "isn't": "is",
    "aren't": "are",
    "didn't": "did",
    "shouldn't": "should",
    "wouldn't": "would",
}
_SUBJECTS = frozenset({"i", "you", "we", "they", "he", "she", "it", "people", "someone", "one"})
_NOT_PARTIES = frozenset({"is", "are", "was", "it", "much", "far", "even", "way", "lot", "any", "no", "that", "this"})
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.]*\d)")
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")
_WORD = re.compile(r"[A-Za-z][\w'-]*")
_CAPITAL = re.compile(r"(?<=\s)([A-Z][a-z]+(?:\s[A-Z][a-z]+)?)(?![\w])")
_THAN = re.compile(r"\b([\w'+#-]+) (\w+er|better|worse|more \w+|less \w+) than ([\w'+#-]+)\b", re.I)
_FROM_TO = re.compile(r"\bfrom ([\w'+#-]+) to ([\w'+#-]+)\b", re.I)
_X_TO_Y = re.compile(r"(?<=\s)([A-Z][\w]*) (?:to|into) ([A-Z][\w]*)\b")
_VS = re.compile(r"(?<=\s)([A-Z][\w'+#-]*) (vs\.?|versus|or) ([A-Z][\w'+#-]*)(?=[?,.]|$)")


def pick(text: str, options: Sequence[str], salt: str = "") -> str:
    """A deterministic choice among `options` for `text`."""
    digest = hashlib.sha256(f"{salt}\0{text}".encode()).digest()
    return options[int.from_bytes(digest[:4], "big") % len(options)]


def _keep_case(original: str, word: str) -> str:
    if original.isupper() and len(original) > 1:
        return word.upper()
    return word[:1].upper() + word[1:] if original[:1].isupper() else word


def _swap_words(text: str, swaps: Iterable[tuple[str, str]]) -> str | None:
    """Exchange the first word of `text` found in `swaps` with its partner."""
    table: dict[str, str] = {}
    for a, b in swaps:
        table.setdefault(a, b)
        table.setdefault(b, a)
    for match in _WORD.finditer(text):
        word = match.group(0)
        partner = table.get(word.lower())
        if partner:
            return text[: match.start()] + _keep_case(word, partner) + text[match.end() :]
    return None


def edit_number(text: str) -> str | None:
    """Change one number (not a year): 5 → 10, 1000 → 2000, 3.5 → 4.5."""
    for match in _NUMBER.finditer(text):
        raw = match.group(1)
        if _YEAR.fullmatch(raw):
            continue
        value = float(raw)
        factor = pick(text, ("double", "plus", "minus_or_plus", "ten"))
        if factor == "double":
            new = value * 2
        elif factor == "ten":
            new = value * 10 if value < 1000 else value / 10
        elif factor == "minus_or_plus" and value > 1:
            new = value - 1
        else:
            new = value + 1
        out = f"{new:g}" if "." in raw else str(int(new))
        if out != raw:
            return text[: match.start(1)] + out + text[match.end(1) :]
    return None


def edit_unit(text: str) -> str | None:
    """Exchange a unit or time span: week ↔ month, km ↔ miles."""
    return _swap_words(text, UNIT_SWAPS)


def edit_date(text: str) -> str | None:
    """Move a year (2016 → 2017 or 2015) or a month name to another."""
    year = _YEAR.search(text)
    if year:
        new = int(year.group(1)) + (1 if pick(text, ("up", "down")) == "up" else -1)
        return text[: year.start(1)] + str(new) + text[year.end(1) :]
    for match in _WORD.finditer(text):
        word = match.group(0)
        if word.lower() in MONTHS and word.lower() != "may":  # "may" is usually the verb
            other = pick(text, [m for m in MONTHS if m not in (word.lower(), "may")])
            return text[: match.start()] + _keep_case(word, other) + text[match.end() :]
    return None


def edit_entity(text: str, entities: Sequence[str] = FALLBACK_ENTITIES) -> str | None:
    """Replace a capitalised name (not the first word) with another one from `entities`."""
    for match in _CAPITAL.finditer(text):
        name = match.group(1)
        if name.split()[0].lower() in AUXILIARIES or name.lower() in ("i", "what", "how", "why"):
            continue
        choices = [e for e in entities if e.lower() != name.lower() and e.lower() not in text.lower()]
        if choices:
            return text[: match.start(1)] + pick(text, choices, "entity") + text[match.end(1) :]
    return None


def edit_negation(text: str) -> str | None:
    """Insert or remove a negation: 'how can I lose' ↔ 'how can I not lose', 'can't' → 'can',
    'without' → 'with'."""
    words = text.split(" ")
    for i, word in enumerate(words):
        low = word.lower()
        if low in ("not", "never") and i > 0:
            return " ".join(words[:i] + words[i + 1 :])
        stem = _CONTRACTIONS.get(low)
        if stem:
            return " ".join(words[:i] + [_keep_case(word, stem)] + words[i + 1 :])
        if low == "without":
            return " ".join(words[:i] + [_keep_case(word, "with")] + words[i + 1 :])
    if words[0].lower() in AUXILIARIES and len(words) >= 4:
        # yes/no question: "Can dogs eat chocolate?" → "Can dogs not eat chocolate?"
        return " ".join(words[:2] + ["not"] + words[2:])
    for i in range(len(words) - 2):
        # auxiliary + pronoun subject → negate right after the subject ("why do people not like X")
        if words[i].lower() in AUXILIARIES and words[i + 1].lower() in _SUBJECTS:
            return " ".join(words[: i + 2] + ["not"] + words[i + 2 :])
    return None


def edit_comparative(text: str) -> str | None:
    """Turn a comparison or a direction around: better ↔ worse, more ↔ less, before ↔ after."""
    return _swap_words(text, COMPARATIVE_SWAPS)


def edit_roles(text: str) -> str | None:
    """Swap who does what: 'A faster than B' → 'B faster than A', 'from X to Y' → 'from Y to X',
    'USD to EUR' → 'EUR to USD'."""
    match = _THAN.search(text)
    if match and match.group(1).lower() != match.group(3).lower() and match.group(1).lower() not in _NOT_PARTIES:
        return (
            text[: match.start(1)]
            + match.group(3)
            + text[match.end(1) : match.start(3)]
            + match.group(1)
            + text[match.end(3) :]
        )
    for pattern in (_FROM_TO, _X_TO_Y):
        match = pattern.search(text)
        if match and match.group(1).lower() != match.group(2).lower():
            a, b = match.group(1), match.group(2)
            return text[: match.start(1)] + b + text[match.end(1) : match.start(2)] + a + text[match.end(2) :]
    return None


def swap_symmetric(text: str) -> str | None:
    """'A vs B' → 'B vs A', 'A or B?' → 'B or A?': the same question (a positive pair)."""
    match = _VS.search(text)
    if not match or match.group(1).lower() == match.group(3).lower():
        return None
    return text[: match.start(1)] + match.group(3) + f" {match.group(2)} " + match.group(1) + text[match.end(3) :]


NEGATIVE_EDITS: tuple[tuple[str, Callable[[str], str | None]], ...] = (
    ("number", edit_number),
    ("unit", edit_unit),
    ("date", edit_date),
    ("entity", edit_entity),
    ("negation", edit_negation),
    ("comparative", edit_comparative),
    ("roles", edit_roles),
)


def hard_negatives(questions: Iterable[str], per_question: int = 1) -> list[tuple[str, str, str]]:
    """(question, edited question, kind) for up to `per_question` edits that apply to each question.

    Which edits are tried first rotates with a hash of the question, so every kind is represented.
    """
    out: list[tuple[str, str, str]] = []
    for text in questions:
        start = int.from_bytes(hashlib.sha256(text.encode()).digest()[:2], "big") % len(NEGATIVE_EDITS)
        made = 0
        for k in range(len(NEGATIVE_EDITS)):
            kind, edit = NEGATIVE_EDITS[(start + k) % len(NEGATIVE_EDITS)]
            changed = edit(text)
            if changed and changed.strip() != text.strip():
                out.append((text, changed, kind))
                made += 1
                if made >= per_question:
                    break
    return out


def symmetric_positives(questions: Iterable[str]) -> list[tuple[str, str]]:
    """(question, the same question with its two options swapped) where it applies."""
    return [(q, s) for q in questions if (s := swap_symmetric(q)) and s != q]
