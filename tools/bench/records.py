"""Deterministic clerk's-records text for the KV benchmarks (`kvgate bench kv`, `kvgate bench e2e`):
distinct sentences per seed, multi-turn histories of them, and fitting either to a token budget."""

from __future__ import annotations

import random
from typing import Any, Callable

_ADJ = (
    "red",
    "silent",
    "northern",
    "old",
    "narrow",
    "copper",
    "hollow",
    "bright",
    "salted",
    "broken",
    "quiet",
    "eastern",
    "tall",
    "frozen",
    "painted",
    "distant",
)
_NOUN = (
    "lighthouse",
    "granary",
    "ferry",
    "observatory",
    "mill",
    "archive",
    "bridge",
    "orchard",
    "foundry",
    "harbour",
    "library",
    "tannery",
    "quarry",
    "chapel",
    "market",
    "signal tower",
)
_PLACE = (
    "Ashford",
    "Bellmere",
    "Corrin Bay",
    "Dunhallow",
    "Eskdale",
    "Farrow Point",
    "Glenmoor",
    "Harlow",
    "Ivybridge",
    "Kestrel Cove",
    "Larchmont",
    "Marrow Fen",
)
_VERB = ("stored", "shipped", "lost", "counted", "repaired", "sold", "weighed", "recorded", "moved", "received")
_UNIT = ("barrels", "crates", "tonnes", "sacks", "lanterns", "ledgers", "bales", "casks")


def sentences(seed: int, n: int) -> list[str]:
    """n deterministic, distinct sentences (~20 tokens each) for conversation `seed`."""
    rng = random.Random(seed)
    return [
        f"Record {seed}.{i}: the {rng.choice(_ADJ)} {rng.choice(_NOUN)} at {rng.choice(_PLACE)} "
        f"{rng.choice(_VERB)} {rng.randint(2, 999)} {rng.choice(_UNIT)} on day {rng.randint(1, 365)}."
        for i in range(n)
    ]


def fit(build: Callable[[int], Any], count: Callable[[Any], int], target: int, hi: int) -> tuple[Any, int]:
    """(build(k), its token count) for the largest k in 1..hi whose count is <= target (k = 1 if
    none is); `count` must grow with k."""
    lo, best = 1, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if count(build(mid)) <= target:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    built = build(best)
    return built, count(built)


def history(n_sentences: int, seed: int = 1, turns: int = 4) -> list[dict[str, str]]:
    """A multi-turn chat: `turns` user messages sharing n_sentences of records, each answered
    briefly, then a question."""
    facts = sentences(seed, n_sentences)
    per = max(1, -(-len(facts) // turns))
    msgs = [{"role": "system", "content": "You are a careful clerk. Answer briefly from the records."}]
    for t in range(0, len(facts), per):
        msgs.append({"role": "user", "content": "More records:\n" + "\n".join(facts[t : t + per])})
        msgs.append({"role": "assistant", "content": "Noted."})
    msgs.append({"role": "user", "content": f"What did the {_NOUN[seed % len(_NOUN)]} do in record {seed}.1?"})
    return msgs
