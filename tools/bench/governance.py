"""`kvgate bench governance --json FILE`: what the data-governance features cost and whether they hold.

The JSON has one object per part:
  encryption  encryption at rest, with and without, same run (kvgate.tools.bench.governance_crypto):
              disk_load_gbps_plain / _encrypted (the KV connector's disk tier), hit_p50_ms_plain /
              _encrypted and hit_p99_ms_plain / _encrypted (exact hits through the proxy), then
              semantic hits, page-cache loads, bytes per token and the goals' verdicts;
  tamper      changed entries and chunks (kvgate.tools.bench.governance_tamper): {tried, served,
              errors} (goal: served 0, errors 0), per way and store;
  erase       a tenant's erasure everywhere (kvgate.tools.bench.governance_erase): counts_per_layer,
              plaintext_found, readable_after (its chunks under every salt still derivable),
              salt_records (its old nonces found), next_request_miss, other_tenant_hit_ratio and
              the goals' verdicts;
  invalidate  invalidation by client tag, by system-prompt hash and by model revision (an engine
              restarted with another) (kvgate.tools.bench.governance_invalidate): by_tag,
              by_system_prompt, by_revision, each with its stale answers served.
erase and invalidate share one set of services (kvgate.tools.bench.governance_stack: Redis, two
engines, two `kvgate serve` proxies), started for the first of them and stopped at the end;
`--engine fake` runs them without vLLM (no KV tiers: those figures are null).
`--parts` runs a subset; a part without a harness is reported as null.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.stats import write_json


def _encryption(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    from kvgate.tools.bench.governance_crypto import run_encryption

    return run_encryption(
        args.dir,
        chunks=args.chunks,
        repeats=args.repeats,
        rounds=args.rounds,
        semantic_rounds=args.semantic_rounds,
        semantic_queries=args.semantic_queries,
        page_cache=args.page_cache,
        progress=progress,
    )


def _tamper(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    from kvgate.tools.bench.governance_tamper import run_tamper

    return run_tamper(args.dir, per_way=args.tamper_per_way, progress=progress)


def _stack(args: argparse.Namespace, progress: Callable[[str], None]) -> Any:
    """The services erase and invalidate share: started by the first, stopped by `run`."""
    stack = getattr(args, "governance_stack", None)
    if stack is None:
        from kvgate.tools.bench.governance_stack import Stack

        work = Path(tempfile.mkdtemp(prefix="governance-stack-", dir=args.dir))
        stack = Stack(work, args.engine, progress, max_tokens=args.max_tokens)
        args.governance_stack = stack
    return stack


def _erase(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    from kvgate.tools.bench.governance_erase import run_erase

    stack = _stack(args, progress)
    return {
        "engine": args.engine,
        **run_erase(stack, docs=args.tenant_docs, doc_tokens=args.doc_tokens, progress=progress),
    }


def _invalidate(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    from kvgate.tools.bench.governance_invalidate import run_invalidate

    stack = _stack(args, progress)
    return {
        "engine": args.engine,
        **run_invalidate(stack, docs=args.invalidate_docs, doc_tokens=args.doc_tokens, progress=progress),
    }


# part name → its harness (args, progress) → JSON object; None: no harness (reported as null)
PARTS: dict[str, Callable[[argparse.Namespace, Callable[[str], None]], dict[str, Any]] | None] = {
    "encryption": _encryption,
    "tamper": _tamper,
    "erase": _erase,
    "invalidate": _invalidate,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench governance`."""
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--chunks", type=int, default=24, help="KV chunks per disk tier (about 4.3 MB each, int8)")
    p.add_argument("--repeats", type=int, default=5, help="timed disk-tier loads per arm (median reported)")
    p.add_argument("--rounds", type=int, default=10, help="rounds of exact hits over the seeded questions")
    p.add_argument("--semantic-rounds", type=int, default=2, help="rounds of semantic lookups over the paraphrases")
    p.add_argument("--semantic-queries", type=int, default=None, help="paraphrases per round (default: all)")
    p.add_argument(
        "--page-cache",
        choices=["fadvise", "auto", "global", "none"],
        default="fadvise",
        help="how a disk-tier load's files leave the page cache first (fadvise: only those files; "
        "auto/global also write /proc/sys/vm/drop_caches, which every process on the machine feels)",
    )
    p.add_argument("--tamper-per-way", type=int, default=3, help="entries and chunks changed per way and store")
    p.add_argument(
        "--engine",
        choices=["vllm", "fake"],
        default="vllm",
        help="erase and invalidate: behind the proxies, two real vLLM servers with kvgate's KV connector "
        "(`make install`), or two fake vLLM-shaped servers (no KV tiers)",
    )
    p.add_argument("--tenant-docs", type=int, default=3, help="erase: documents each tenant plants through each proxy")
    p.add_argument("--invalidate-docs", type=int, default=2, help="invalidate: documents per set and proxy")
    p.add_argument(
        "--doc-tokens",
        type=int,
        default=256,
        help="tokens of each document's facts by vllm_kv_client.first_message's estimate (the prompt, "
        "in the model's own tokens, is longer: check prompt_tokens in the JSON)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="tokens an answer may have (answers end at a '.' first)")
    p.add_argument("--dir", type=Path, default=None, help="where the stores go (default: $TMPDIR)")
    p.add_argument("--json", type=Path, default=None)


def run(
    args: argparse.Namespace, progress: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
) -> dict[str, Any]:
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}; known: {list(PARTS)}")
    if args.engine == "vllm" and {"erase", "invalidate"} & set(wanted):
        from kvgate.engines.vllm.launch import vllm_available, vllm_python

        if not vllm_available():
            raise ValueError(
                f"erase and invalidate run against real vLLM, whose environment is missing "
                f"({vllm_python()}): run `make install`, or pass --engine fake or --parts encryption,tamper"
            )
    started = time.perf_counter()
    result: dict[str, Any] = {"machine": machine_info()}
    try:
        for name in PARTS:
            harness = PARTS[name]
            result[name] = harness(args, progress) if name in wanted and harness is not None else None
    finally:
        stack = getattr(args, "governance_stack", None)
        if stack is not None:
            stack.close()
            args.governance_stack = None
            if args.dir is None:  # a --dir of the caller's keeps the stores and logs
                shutil.rmtree(stack.work, ignore_errors=True)
    result["duration_s"] = round(time.perf_counter() - started, 1)
    return result


def main(args: argparse.Namespace) -> int:
    """Run, print the summary, write --json; 0 when every goal measured is met, 1 otherwise, 2 on bad options."""
    try:
        result = run(args)
    except ValueError as exc:
        print(f"kvgate bench governance: error: {exc}", file=sys.stderr)
        return 2
    ok = True
    enc = result.get("encryption")
    if enc:
        print(
            f"disk-tier load GB/s: plain {enc['disk_load_gbps_plain']}, encrypted {enc['disk_load_gbps_encrypted']} "
            f"({enc['disk_load_ratio']}x); from the page cache {enc['page_cache_load_gbps_plain']} / "
            f"{enc['page_cache_load_gbps_encrypted']}"
        )
        print(
            f"exact hit p50/p99 ms: plain {enc['hit_p50_ms_plain']}/{enc['hit_p99_ms_plain']}, encrypted "
            f"{enc['hit_p50_ms_encrypted']}/{enc['hit_p99_ms_encrypted']}; semantic p50 plain "
            f"{enc['semantic_hit_p50_ms_plain']}, encrypted {enc['semantic_hit_p50_ms_encrypted']}"
        )
        print(
            f"bytes per token: plain {enc['bytes_per_token_plain']}, encrypted {enc['bytes_per_token_encrypted']}; "
            f"goals: {enc['goals']}"
        )
        ok = ok and all(enc["goals"].values())
    tamper = result.get("tamper")
    if tamper:
        print(f"tamper: {tamper['tried']} tried, {tamper['served']} served, {tamper['errors']} errors")
        ok = ok and tamper["served"] == 0 and tamper["errors"] == 0
    erase = result.get("erase")
    if erase:
        nxt = erase["next_request"]
        nonces = erase["salt_records"]
        print(
            f"erase: plaintext found {erase['plaintext_found']} (before: {erase['plaintext_found_before']}), "
            f"old salt nonces found {nonces['old_nonce_found_after']} (before: {nonces['old_nonce_found_before']}), "
            f"readable after {erase['readable_after']}; next request: {nxt['response_cache_hits']} cache hits, "
            f"{nxt['cached_tokens']} cached tokens, {nxt['tier_loaded_chunks']} chunks loaded; "
            f"other tenant's hit ratio {erase['other_tenant_hit_ratio']}x; goals: {erase['goals']}"
        )
        ok = ok and all(erase["goals"].values())
    invalidate = result.get("invalidate")
    if invalidate:
        print(f"invalidate: stale answers served {invalidate['stale_served']}; goals: {invalidate['goals']}")
        ok = ok and all(invalidate["goals"].values())
    write_json(args.json, result)
    return 0 if ok else 1
