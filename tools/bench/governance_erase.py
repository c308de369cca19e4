"""Erasing a tenant everywhere, for `kvgate bench governance` (its `erase` object), against the
services of governance_stack.py: real Redis and disk, two engines with kvgate's KV connector
(encrypted disk and Redis tiers), two `kvgate serve` proxies (response cache on disk / on Redis).

1. Tenant A plants, through each proxy, `docs` long documents that each carry a canary (an access
   code naming the run), asks about each (a miss, stored with a client tag that is the canary too,
   since tags are kept in the clear), asks again (an exact hit: it was stored), and asks another
   question about the same document with `no-cache` (the engines reuse the document's prefix:
   cached tokens > 0). The KV chunks the tiers gained meanwhile are A's.
2. Tenant B plants its own documents the same way; its fixed replay (every question again) is a
   hit each; its `no-cache, no-store` variants show the engines' reuse of B's prefixes.
3. Before the erasure: the raw scans (governance_scan.py) for A's canary and A's answer texts,
   and for the nonces of A's salt records (one per proxy: each keeps them in its own store); A's
   entries read with the master key; A's chunks opened under A's salts, derived from the salt
   secret and those records (a control: they are readable before); with vLLM, A's first document
   sent straight to the engine that did not answer it, with A's salt (a control: the tiers would
   load it).
4. `DELETE /v1/admin/tenants/{A}` on both proxies.
5. After: the raw scans again (plaintext_found), A's entries (none may remain), A's next requests
   (its planted questions again: a miss in the response cache, 0 cached tokens in the engine, 0
   chunks loaded from the tiers by either engine: the connector's counters on vLLM's /metrics),
   B's fixed replay again (other_tenant_hit_ratio = after / before), then A's old chunks opened
   under every salt that can be derived from the salt secret and what the stores hold now: each
   salt record found there at every epoch up to the highest, and the salts of the secret, the
   tenant and an epoch alone (none may open: the erasure overwrote the old nonces, which the
   scans must not find either), and under A's new salts (none may open). A control: the old
   salts the bench kept from before the erasure still open the chunks the tiers hold (what
   someone who copied a record before the erasure could read until the tiers evict them).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import httpx

from kvgate.tools.bench.governance_scan import chunk_keys, entries_by_tenant, openable_chunks, scan_layers
from kvgate.tools.bench.governance_stack import MODEL, STOP, STORES, Reply, Stack, conversation, document

QUESTION = "What is the access code? Answer with the code only."
VARIANT = "How many facts are listed above?"
SETTLE_S = 2.0  # the connector writes chunks on a background thread


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 3) if den else None


def _direct(stack: Stack, engine: int, messages: list[dict[str, str]], salt: str) -> int:
    """A request straight to one engine with this cache_salt; its cached tokens."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": stack.max_tokens,
        "temperature": 0,
        "stop": STOP,
        "cache_salt": salt,
    }
    r = httpx.post(f"{stack.engines.api_bases[engine]}/chat/completions", json=body, timeout=600)
    if r.status_code != 200:
        raise RuntimeError(f"engine {engine}: HTTP {r.status_code}: {r.text[:300]}")
    return int(((r.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _derivable_salts(stack: Stack, name: str, records: dict[str, Any]) -> list[str]:
    """Every cache_salt of tenant `name` computable from the salt secret and `records` (what the
    stores hold of it): each record's nonce at every epoch up to the highest found, and the salts
    the secret, the tenant and an epoch alone make."""
    found = [r for r in records.values() if r is not None]
    top = max((r.epoch for r in found), default=0)
    salts = {stack.salt_without_nonce(name, e) for e in range(top + 1)}
    salts |= {stack.salt(name, r._replace(epoch=e)) for r in found for e in range(top + 1)}
    return sorted(salts)


def _delta(after: dict[str, float] | None, before: dict[str, float] | None, name: str) -> int | None:
    return None if after is None or before is None else int(after[name] - before[name])


def run_erase(
    stack: Stack, *, docs: int = 3, doc_tokens: int = 256, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    canary = f"kvgcanary{stack.token}"
    tenant_a, tenant_b = stack.tenant("a"), stack.tenant("b")
    a_docs = {
        s: [document(1000 + 100 * j + i, doc_tokens, f"{canary}-{s}-{i}") for i in range(docs)]
        for j, s in enumerate(STORES)
    }
    b_docs = {s: [document(2000 + 100 * j + i, doc_tokens) for i in range(docs)] for j, s in enumerate(STORES)}
    keys_before = chunk_keys(stack.engines)

    progress(f"governance erase: tenant A plants {docs} documents with canaries through each proxy")
    planted: list[tuple[str, Reply]] = []
    a_stored = a_variant_cached = 0
    for store in STORES:
        for doc in a_docs[store]:
            first = stack.ask(store, "a", conversation(doc, QUESTION), tags=[canary])
            a_stored += stack.ask(store, "a", conversation(doc, QUESTION)).cache == "exact"
            a_variant_cached += stack.ask(store, "a", conversation(doc, VARIANT), control="no-cache").cached_tokens
            planted.append((store, first))
    time.sleep(SETTLE_S)
    keys_a = chunk_keys(stack.engines)
    a_chunks = {tier: keys - keys_before.get(tier, set()) for tier, keys in keys_a.items()}

    progress(f"governance erase: tenant B plants {docs} documents through each proxy, then its fixed replay")
    b_answers = []
    for store in STORES:
        for doc in b_docs[store]:
            b_answers.append(stack.ask(store, "b", conversation(doc, QUESTION)).text)

    def b_replay() -> dict[str, Any]:
        hits = total = cached = prompt = 0
        for store in STORES:
            for doc in b_docs[store]:
                hits += stack.ask(store, "b", conversation(doc, QUESTION)).cache == "exact"
                total += 1
                variant = stack.ask(store, "b", conversation(doc, VARIANT), control="no-cache, no-store")
                cached, prompt = cached + variant.cached_tokens, prompt + variant.prompt_tokens
        return {
            "hits": hits,
            "replayed": total,
            "hit_ratio": _ratio(hits, total),
            "engine_cached_fraction": _ratio(cached, prompt),
        }

    b_before = b_replay()
    answers = {r.text.strip() for _, r in planted}
    distinct = sorted(a for a in answers if len(a) >= 12 and not any(a in b for b in b_answers))
    needles = [canary.encode()] + [a.encode() for a in distinct]

    progress("governance erase: scans and controls before the erasure")
    plain_before = scan_layers(stack, needles)
    entries_before = entries_by_tenant(stack)
    records_before = stack.records("a")
    salts_old = {store: stack.salt("a", r) for store, r in records_before.items() if r is not None}
    old_nonces = [r.nonce for r in records_before.values() if r is not None]
    nonce_needles = [n.hex().encode() for n in old_nonces] + old_nonces  # as stored (hex), and raw
    nonces_before = sum(v for v in scan_layers(stack, nonce_needles).values() if v)
    readable_before = openable_chunks(stack.engines, stack.master_hex, a_chunks, list(salts_old.values()))
    tier_control = None
    counters0 = stack.counters()
    if counters0 is not None:
        store, reply = planted[0]
        other = 1 - int((reply.replica or "v0")[1:])
        cached = _direct(stack, other, conversation(a_docs[store][0], QUESTION), salts_old[store])
        counters1 = stack.counters()
        tier_control = {
            "engine": other,
            "cached_tokens": cached,
            "loaded_chunks": _delta(counters1, counters0, "vllm:kvgate_loaded_chunks_total"),
        }

    progress("governance erase: DELETE /v1/admin/tenants/{A} on both proxies")
    erased, erase_s = {}, {}
    for store, proxy in stack.proxies.items():
        t = time.perf_counter()
        erased[store] = proxy.erase(tenant_a)
        erase_s[store] = round(time.perf_counter() - t, 3)

    progress("governance erase: scans after, A's next requests, B's replay again")
    plain_after = scan_layers(stack, needles)
    entries_after = entries_by_tenant(stack)
    keys_now = chunk_keys(stack.engines)
    still_stored = {tier: len(keys & keys_now.get(tier, set())) for tier, keys in a_chunks.items()}
    before_next = stack.counters()
    nexts = [stack.ask(store, "a", conversation(doc, QUESTION)) for store in STORES for doc in a_docs[store]]
    after_next = stack.counters()
    b_after = b_replay()
    records_after = stack.records("a")
    derivable = _derivable_salts(stack, "a", records_after)
    readable_derived_after = openable_chunks(stack.engines, stack.master_hex, a_chunks, derivable)
    readable_kept_after = openable_chunks(stack.engines, stack.master_hex, a_chunks, list(salts_old.values()))
    salts_new = [stack.salt("a", r) for r in records_after.values() if r is not None]
    readable_new_after = openable_chunks(stack.engines, stack.master_hex, a_chunks, salts_new)
    nonces_after = sum(v for v in scan_layers(stack, nonce_needles).values() if v)

    layers: dict[str, Any] = {}
    for store in STORES:
        name = f"response_{store}"
        body = erased[store]
        layers[name] = {
            "erased": body["erased"],
            "salt_epoch": body["salt_epoch"],
            "scrubbed": body["scrubbed"],
            "erase_s": erase_s[store],
            "tenant_entries_before": entries_before[name].get(tenant_a, 0),
            "tenant_entries_after": entries_after[name].get(tenant_a, 0),
            "other_tenant_entries_before": entries_before[name].get(tenant_b, 0),
            "other_tenant_entries_after": entries_after[name].get(tenant_b, 0),
            "plaintext_before": plain_before[name],
            "plaintext_after": plain_after[name],
        }
    for tier in ("kv_disk", "kv_redis"):
        if tier not in a_chunks:
            layers[tier] = None
            continue
        layers[tier] = {
            "tenant_chunks": len(a_chunks[tier]),
            "still_stored_after": still_stored[tier],
            "readable_old_salt_before": readable_before[tier],
            "readable_new_salt_after": readable_new_after[tier],
            "readable_derived_salt_after": readable_derived_after[tier],
            "readable_kept_old_salt_after": readable_kept_after[tier],
            "plaintext_before": plain_before[tier],
            "plaintext_after": plain_after[tier],
        }
    layers["engine_prefix_cache"] = {
        "variant_cached_tokens_before": a_variant_cached,
        "next_cached_tokens_after": sum(r.cached_tokens for r in nexts),
    }
    layers["logs"] = {"plaintext_before": plain_before["logs"], "plaintext_after": plain_after["logs"]}

    loaded = _delta(after_next, before_next, "vllm:kvgate_loaded_chunks_total")
    next_request = {
        "requests": len(nexts),
        "response_cache_hits": sum(r.hit for r in nexts),
        "cached_tokens": sum(r.cached_tokens for r in nexts),
        "tier_loaded_chunks": loaded,
        "tier_loads": _delta(after_next, before_next, "vllm:kvgate_loads_total"),
        "prompt_tokens_mean": round(sum(r.prompt_tokens for r in nexts) / max(1, len(nexts)), 1),
    }
    next_miss = next_request["response_cache_hits"] == 0 and next_request["cached_tokens"] == 0 and not loaded
    plaintext = sum(v for v in plain_after.values() if v)
    readable_after = {
        "entries": sum(e.get(tenant_a, 0) for e in entries_after.values()),
        "chunks_new_salt": sum(readable_new_after.values()),
        "chunks_derived_salt": sum(readable_derived_after.values()),
    }
    salt_records = {
        "records_before": {s: None if r is None else r.epoch for s, r in records_before.items()},
        "records_after": {s: None if r is None else r.epoch for s, r in records_after.items()},
        "salts_derived_after": len(derivable),
        "old_nonce_found_before": nonces_before,
        "old_nonce_found_after": nonces_after,
    }
    ratio = _ratio(b_after["hits"], b_before["hits"]) if b_before["hits"] else None
    return {
        "counts_per_layer": layers,
        "plaintext_found": plaintext,
        "plaintext_found_before": sum(v for v in plain_before.values() if v),
        "readable_after": readable_after,
        "salt_records": salt_records,
        "next_request_miss": next_miss,
        "next_request": next_request,
        "other_tenant_hit_ratio": ratio,
        "other_tenant": {"before": b_before, "after": b_after},
        "controls": {
            "tenant_stored_hits": a_stored,
            "tenant_chunks_readable_before": sum(readable_before.values()),
            "tenant_chunks_readable_kept_old_salt_after": sum(readable_kept_after.values()),
            "tier_load_with_old_salt": tier_control,
        },
        "needles": {"canary": 1, "answer_texts": len(distinct)},
        "docs_per_store": docs,
        "tenants": 2,
        "goals": {
            "plaintext_0": plaintext == 0,
            "readable_0": not any(readable_after.values()),
            "old_nonce_0": nonces_after == 0 and nonces_before > 0,
            "next_request_miss": next_miss,
            "other_tenant_hit_ratio_1": ratio == 1.0,
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }
