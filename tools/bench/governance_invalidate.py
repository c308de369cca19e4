"""Invalidation, for `kvgate bench governance` (its `invalidate` object): by a client's tag, by the
system prompt's hash and by the model revision (an engine restarted with another one), against
the services of governance_stack.py (both proxies: response cache on disk and on Redis).

Tenant C asks, through each proxy, about `docs` documents per set, each question twice (a miss,
stored; then an exact hit, whose `x-kvgate-entry-id` names the entry):
  tag       with `x-kvgate-tags: doc:<run>@v1`;
  keep      with another tag (a control: invalidating the first tag leaves these served);
  system    with a system prompt of this run (kvgate tags them `system:<hash>`);
  revision  plain;
  window    plain (answered the moment the restarted engine is up, below).
Then `POST /v1/admin/invalidate` of the client tag on each proxy and every tag question asked
again: a hit served by an entry seen before the invalidation is a stale answer. The same for the
system prompt's tag. Then engine 1 is restarted from another directory of the same weights (its
`root` in /v1/models, the revision kvgate tags answers with, changes); once it answers, the
window set is asked at once (what the proxies serve before their next health round asks the
engine again: reported, no goal), and once each proxy logged the new revision, the revision and
keep sets (all answers made under the old revision). Each set is asked once more after: hits
again, from the fresh entries (the cache still works).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from kvgate.tools.bench.governance_stack import STORES, Reply, Stack, conversation, document

QUESTION = "Which box holds the most marbles?"
SETS = ("tag", "keep", "system", "revision", "window")
NOTICED = "now serves model revision"  # the proxies' log line when a replica's revision changed


def run_invalidate(
    stack: Stack,
    *,
    docs: int = 2,
    doc_tokens: int = 256,
    restart: int = 1,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    tag, keep = f"doc:{stack.token}@v1", f"doc:{stack.token}-keep@v1"
    system = f"You are the archive assistant of run {stack.token}. Answer in one sentence."

    def messages(name: str, store: int, i: int) -> list[dict[str, str]]:
        doc = document(3000 + 1000 * SETS.index(name) + 100 * store + i, doc_tokens)
        return conversation(doc, QUESTION, system if name == "system" else None)

    def ask(name: str, store: str, i: int) -> Reply:
        tags = {"tag": [tag], "keep": [keep]}.get(name)
        return stack.ask(store, "c", messages(name, STORES.index(store), i), tags=tags)

    def replay(name: str) -> list[Reply]:
        return [ask(name, store, i) for store in STORES for i in range(docs)]

    progress(f"governance invalidate: tenant C plants {len(SETS)} sets of {docs} documents through each proxy")
    seen: dict[str, set[int]] = {}
    planted_hits: dict[str, int] = {}
    for name in SETS:
        for store in STORES:
            for i in range(docs):
                ask(name, store, i)
        again = replay(name)
        seen[name] = {r.entry_id for r in again if r.hit and r.entry_id is not None}
        planted_hits[name] = sum(r.hit for r in again)

    def outcome(name: str, stale_ids: set[int], removed: int | None) -> dict[str, Any]:
        first = replay(name)
        fresh = replay(name)
        return {
            "stale_served": sum(r.hit and r.entry_id in stale_ids for r in first),
            "hits_after": sum(r.hit for r in first),
            "replayed": len(first),
            "hits_before": planted_hits[name],
            "removed": removed,
            "fresh_hits_again": sum(r.hit for r in fresh),
        }

    progress("governance invalidate: by client tag")
    removed = sum(int(p.invalidate([tag])["removed"]) for p in stack.proxies.values())
    by_tag = outcome("tag", seen["tag"], removed)
    kept = replay("keep")
    by_tag["other_tag_kept_hits"] = sum(r.hit and r.entry_id in seen["keep"] for r in kept)

    progress("governance invalidate: by system prompt hash")
    from kvgate.index.responses.tags import system_tag

    removed = sum(int(p.invalidate([system_tag(system)])["removed"]) for p in stack.proxies.values())
    by_system = outcome("system", seen["system"], removed)

    progress(f"governance invalidate: by model revision: restarting engine {restart} from another directory")
    roots_before = stack.engines.roots()
    logged = {s: p.log_count(NOTICED) for s, p in stack.proxies.items()}
    restart_s = stack.engines.restart(restart, f"r2-{stack.token}")
    ready = time.monotonic()
    waited: dict[str, float | None] = {s: None for s in stack.proxies}

    def watch() -> None:  # when each proxy logs the new revision, while the window set is asked
        while any(v is None for v in waited.values()) and time.monotonic() < ready + 60:
            for store, proxy in stack.proxies.items():
                if waited[store] is None and proxy.log_count(NOTICED) > logged[store]:
                    waited[store] = round(time.monotonic() - ready, 3)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    window = replay("window")  # at once: before the proxies' next health round, maybe
    watcher.join()
    old = seen["revision"] | seen["keep"] | seen["window"]
    by_revision = outcome("revision", old, None)
    keep_after = outcome("keep", old, None)
    by_revision.update(
        {
            "restart_s": round(restart_s, 1),
            "roots_before": roots_before,
            "roots_after": stack.engines.roots(),
            "noticed_after_ready_s": waited,
            "other_set_stale_served": keep_after["stale_served"],
            "other_set_replayed": keep_after["replayed"],
            "other_set_fresh_hits_again": keep_after["fresh_hits_again"],
            "window": {
                "replayed_at_ready": len(window),
                "stale_served": sum(r.hit and r.entry_id in old for r in window),
            },
        }
    )
    stale = {
        "by_tag": by_tag["stale_served"],
        "by_system_prompt": by_system["stale_served"],
        "by_revision": by_revision["stale_served"] + by_revision["other_set_stale_served"],
    }
    return {
        "by_tag": by_tag,
        "by_system_prompt": by_system,
        "by_revision": by_revision,
        "stale_served": stale,
        "controls": {"planted_hits": planted_hits, "docs_per_set_and_store": docs},
        "goals": {f"{k}_stale_0": v == 0 for k, v in stale.items()}
        | {"revision_noticed": all(v is not None for v in waited.values())},
        "seconds": round(time.perf_counter() - t0, 1),
    }
