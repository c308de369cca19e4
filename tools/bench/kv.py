"""`kvgate bench kv`: what the KV chunk store saves on one long prompt, in process.

One ReplicaEngine (the packaged SmolLM2-135M, greedy) over a real ChunkStore (MemoryTier +
DiskTier in a temporary directory) answers the same ≈ --history-tokens-token conversation in
four stored states, rebuilt identically before every run (clear every tier, then put back the
same encoded prefix chunks):

    cold            nothing stored: the whole prompt is prefilled
    warm_ram        the prompt's prefix chunks in the memory tier (and the disk tier), the
                    partial chunk after them in the engine's RAM tail cache
    warm_disk       memory tier and RAM tails emptied, page cache dropped: the chunks and the
                    spilled tail (engines/replica/tails.py) come from the disk tier's files
    warm_disk_pagecache  the same with the files still in the page cache (what a replica sees
                    for chunks written or read recently)

TTFT and its load/prefill parts are the engine's own timings (Completion.ttft_s / load_s /
prefill_s); each mode's figure is the median over --repeats runs, runs interleaved mode by mode.
`identical_output` compares the greedy answer (token ids and text) of every run.

Load bandwidth, in bytes of decoded tensors per second: `disk_load_gbps` = store.get_many of the
same chunks with the memory tier cleared (DiskTier.get + decode_chunk: SQLite row, file read
into a fresh buffer, XXH3 check, no copy; plus the promotion into the memory tier), `ram_load_gbps` = get_many served by the memory tier (decode only), and
`raw_disk_read_gbps` = a plain sequential read in 8 MiB blocks of one file of the chunks' total
size in the same directory. Before every disk read the page cache is dropped "where possible":
`sync`, then posix_fadvise(DONTNEED) on every file concerned, then (if we may: root) writing 1 to
/proc/sys/vm/drop_caches. The JSON says which methods ran and how many bytes of the files were
still resident afterwards (mincore). `disk_read_gbps` / `decode_gbps` split disk_load_gbps into
DiskTier.get alone (encoded bytes/s) and decode_chunk alone (checksum + views). No figure is
pass/fail.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

GB = 1e9
READ_BLOCK = 8 << 20
MODES = ("cold", "warm_ram", "warm_disk", "warm_disk_pagecache")

# -- deterministic text (also used by `kvgate bench e2e`) ----------------------------------------

_ADJ = ("red", "silent", "northern", "old", "narrow", "copper", "hollow", "bright", "salted", "broken",
        "quiet", "eastern", "tall", "frozen", "painted", "distant")
_NOUN = ("lighthouse", "granary", "ferry", "observatory", "mill", "archive", "bridge", "orchard", "foundry",
         "harbour", "library", "tannery", "quarry", "chapel", "market", "signal tower")
_PLACE = ("Ashford", "Bellmere", "Corrin Bay", "Dunhallow", "Eskdale", "Farrow Point", "Glenmoor", "Harlow",
          "Ivybridge", "Kestrel Cove", "Larchmont", "Marrow Fen")
_VERB = ("stored", "shipped", "lost", "counted", "repaired", "sold", "weighed", "recorded", "moved", "received")
_UNIT = ("barrels", "crates", "tonnes", "sacks", "lanterns", "ledgers", "bales", "casks")


def sentences(seed: int, n: int) -> list[str]:
    """n deterministic, distinct sentences (~20 tokens each) for conversation `seed`."""
    rng = random.Random(seed)
    return [f"Record {seed}.{i}: the {rng.choice(_ADJ)} {rng.choice(_NOUN)} at {rng.choice(_PLACE)} "
            f"{rng.choice(_VERB)} {rng.randint(2, 999)} {rng.choice(_UNIT)} on day {rng.randint(1, 365)}."
            for i in range(n)]


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


# -- page cache --------------------------------------------------------------------------------------

def files_under(directory: Path) -> list[Path]:
    return [Path(root) / f for root, _, names in os.walk(directory) for f in names]


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of `paths` in the page cache (mincore), or None where that cannot be asked."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name or not hasattr(mmap, "PROT_READ"):
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for path in paths:
        try:
            size = path.stat().st_size
            if size == 0:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            rc = libc.mincore(addr, size, vec)
            libc.munmap(addr, size)
            if rc != 0:
                return None
            total += sum(b & 1 for b in vec) * page
        finally:
            os.close(fd)
    return total


class PageCache:
    """Drops the page cache of given files as well as this process may (see module docstring)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # auto | fadvise | global | none
        self.methods: set[str] = set()
        self.resident_after: list[int] = []
        self.global_failed = False

    def drop(self, paths: Sequence[Path]) -> None:
        if self.mode == "none":
            return
        os.sync()
        if self.mode in ("auto", "fadvise") and hasattr(os, "posix_fadvise"):
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    self.methods.add("posix_fadvise")
                except OSError:
                    pass
                finally:
                    os.close(fd)
        data = [p for p in paths if not p.name.startswith("cache.db")]  # SQLite maps its db: not droppable
        left = resident_bytes(data)
        if self.mode in ("auto", "global") and not self.global_failed:
            try:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("1\n")
                self.methods.add("drop_caches")
                left = resident_bytes(data)
            except OSError:
                self.global_failed = True
        if left is not None:
            self.resident_after.append(left)

    def report(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "applied": bool(self.methods),
            "methods": sorted(self.methods),
            "drop_caches_refused": self.global_failed,
            "max_resident_bytes_after_drop": max(self.resident_after) if self.resident_after else None,
        }


# -- machine ----------------------------------------------------------------------------------------

def filesystem_of(path: Path) -> dict[str, str] | None:
    """Device and type of the mount holding `path` (from /proc/mounts)."""
    try:
        mounts = [line.split()[:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    real = str(path.resolve())
    best = max((m for m in mounts if len(m) == 3 and (real == m[1] or real.startswith(m[1].rstrip("/") + "/"))),
               key=lambda m: len(m[1]), default=None)
    return {"device": best[0], "mount": best[1], "type": best[2]} if best else None


def machine_info(path: Path | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                                 if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        info["mem_total_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1)
    except (ValueError, OSError):
        pass
    if path is not None:
        info["filesystem"] = filesystem_of(path)
    return info


# -- the benchmark ------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history-tokens", type=int, default=2000, help="target prompt length (tokens)")
    p.add_argument("--repeats", type=int, default=3, help="runs per stored state (median reported)")
    p.add_argument("--io-repeats", type=int, default=5, help="timed chunk loads / raw reads (median reported)")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length (greedy)")
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--exact-prefill", action="store_true", help="the engine's exact_prefill (bit-identical warm logits)")
    p.add_argument("--dir", type=Path, default=None, help="where the store's temporary directory goes (default: $TMPDIR)")
    p.add_argument("--drop-page-cache", default="auto", choices=["auto", "fadvise", "global", "none"],
                   help="auto: posix_fadvise, then /proc/sys/vm/drop_caches where writable (global: only the "
                        "latter)")
    p.add_argument("--json", type=Path, default=None)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.history_tokens < 2 * args.chunk_tokens:
        raise ValueError(f"--history-tokens must be at least 2 chunks ({2 * args.chunk_tokens})")
    if args.repeats < 1 or args.io_repeats < 1:
        raise ValueError("--repeats and --io-repeats must be >= 1")
    import torch

    from index.chunks import ChunkStore, DiskTier, MemoryTier, chunk_hashes, decode_chunk
    from engines.replica.engine import ReplicaEngine
    from engines.replica.model import load_model, model_namespace

    log = lambda msg: print(f"[kv] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if args.threads:
        torch.set_num_threads(args.threads)
    from index.chunks.allocator import keep_freed_memory

    keep_freed_memory()  # as `kvgate replica` does at start
    t_start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="kvgate-bench-kv-", dir=args.dir))
    disk_dir = work / "kv"
    memory, disk = MemoryTier(4 << 30), DiskTier(disk_dir, 16 << 30)
    store = ChunkStore([memory, disk], namespace=model_namespace(model))
    engine = None
    cache = PageCache(args.drop_page_cache)
    try:
        engine = ReplicaEngine(model, tokenizer, store, chunk_tokens=args.chunk_tokens, exact_prefill=args.exact_prefill)
        ct = args.chunk_tokens
        messages, n_prompt = fit(history, lambda m: len(engine.tokens(m)), args.history_tokens,
                                 hi=max(4, args.history_tokens // 4))
        tokens = engine.tokens(messages)
        hashes = chunk_hashes(tokens, ct)[: (n_prompt - 1) // ct]  # what the engine can load
        log(f"prompt: {n_prompt} tokens, {len(hashes)} loadable chunks of {ct}; model {engine.namespace}, "
            f"{torch.get_num_threads()} torch threads, store in {work}")

        def generate() -> Any:
            return engine.generate(messages, max_tokens=args.max_tokens)

        engine.generate([{"role": "user", "content": "hi"}], max_tokens=1)  # first forward is slow
        store.clear()
        generate()  # warm-up at full length; leaves the prefix chunks stored
        snapshot = [(store.key(h), memory.get(store.key(h))) for h in hashes]
        tails = engine.tails.snapshot()  # the partial chunk after the last full one (RAM part)
        if any(data is None for _, data in snapshot):
            raise RuntimeError("the warm-up run did not store the prompt's prefix chunks (store budget too small?)")
        stored_bytes = sum(len(d) for _, d in snapshot)
        on_disk = [(key, bytes(disk.get(key) or b"")) for key in disk.keys()]  # chunks + the spilled tail

        def rebuild(memory_too: bool) -> None:
            store.clear()
            engine.tails.clear()
            for key, data in on_disk:
                disk.put(key, data)
            for key, data in snapshot if memory_too else ():
                memory.put(key, data)
            if memory_too:
                engine.tails.restore(tails)

        runs: dict[str, list[Any]] = {m: [] for m in MODES}
        for r in range(args.repeats):
            for mode in MODES:
                if mode == "cold":
                    store.clear()
                    engine.tails.clear()
                else:
                    rebuild(memory_too=mode == "warm_ram")
                    if mode == "warm_disk":
                        cache.drop(files_under(disk_dir))
                runs[mode].append(generate())
            c = {m: runs[m][-1] for m in MODES}
            log(f"repeat {r + 1}/{args.repeats}: " + "  ".join(f"{m} {c[m].ttft_s * 1000:.0f} ms" for m in MODES))

        # chunk load bandwidth: disk tier (page cache dropped), memory tier; then a raw file read
        rebuild(memory_too=False)
        disk_s: list[float] = []
        ram_s: list[float] = []
        get_s: list[float] = []
        decode_s: list[float] = []
        decoded = 0
        for _ in range(args.io_repeats):
            store.clear("memory")
            cache.drop(files_under(disk_dir))
            t0 = time.perf_counter()
            chunks = store.get_many(hashes)
            disk_s.append(time.perf_counter() - t0)
            if len(chunks) != len(hashes):
                raise RuntimeError(f"disk tier returned {len(chunks)} of {len(hashes)} chunks")
            decoded = sum(k.nbytes + v.nbytes for ch in chunks for k, v in ch)
            del chunks
            if not all(memory.contains(store.key(h)) for h in hashes):
                raise RuntimeError("chunks read from disk were not promoted into the memory tier")
            t0 = time.perf_counter()
            chunks = store.get_many(hashes)
            ram_s.append(time.perf_counter() - t0)
            if len(chunks) != len(hashes):
                raise RuntimeError("memory tier did not serve the chunks")
            del chunks
            cache.drop(files_under(disk_dir))  # the same read, split: tier reads, then decodes
            t0 = time.perf_counter()
            blobs = [(key, disk.get(key)) for key, _ in snapshot]
            get_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for key, data in blobs:
                decode_chunk(data, key)
            decode_s.append(time.perf_counter() - t0)
            del blobs

        raw_path = work / "raw.bin"
        with open(raw_path, "wb") as f:
            for _, data in snapshot:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        raw_s: list[float] = []
        buf = bytearray(READ_BLOCK)
        for _ in range(args.io_repeats):
            cache.drop([raw_path])
            read = 0
            t0 = time.perf_counter()
            with open(raw_path, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    read += n
            raw_s.append(time.perf_counter() - t0)
            if read != stored_bytes:
                raise RuntimeError(f"raw read {read} bytes of {stored_bytes}")
    finally:
        if engine is not None:
            engine.close()
        store.close()
        shutil.rmtree(work, ignore_errors=True)

    def mode_summary(cs: list[Any]) -> dict[str, Any]:
        return {
            "ttft_s": _median([c.ttft_s for c in cs]), "load_s": _median([c.load_s for c in cs]),
            "prefill_s": _median([c.prefill_s for c in cs]),
            "ttft_runs_s": [c.ttft_s for c in cs], "load_runs_s": [c.load_s for c in cs],
            "prefill_runs_s": [c.prefill_s for c in cs],
            "cached_tokens": cs[0].cached_tokens, "prefilled_tokens": cs[0].prompt_tokens - cs[0].cached_tokens,
        }

    modes = {m: mode_summary(runs[m]) for m in MODES}
    answers = [c for m in MODES for c in runs[m]]
    reference = answers[0]
    identical = all(c.token_ids == reference.token_ids and c.text == reference.text for c in answers)
    disk_gbps = _gbps(decoded, _median(disk_s))
    raw_gbps = _gbps(stored_bytes, _median(raw_s))
    cold, ram, dsk = (modes[m]["ttft_s"] for m in ("cold", "warm_ram", "warm_disk"))
    return {
        "history_tokens": n_prompt,
        "requested_history_tokens": args.history_tokens,
        "chunk_tokens": args.chunk_tokens,
        "loaded_chunks": len(hashes),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "model": engine.namespace,
        "exact_prefill": args.exact_prefill,
        "torch_threads": torch.get_num_threads(),
        "ttft_cold_s": cold,
        "ttft_warm_ram_s": ram,
        "ttft_warm_disk_s": dsk,
        "ttft_warm_disk_pagecache_s": modes["warm_disk_pagecache"]["ttft_s"],
        "warm_ram_speedup": cold / ram,
        "warm_disk_speedup": cold / dsk,
        "modes": modes,
        "identical_output": identical,
        "answer_text": reference.text,
        "answer_token_ids": list(reference.token_ids),
        "stored_bytes": stored_bytes,
        "decoded_bytes": decoded,
        "disk_load_gbps": disk_gbps,
        "disk_load_runs_s": disk_s,
        "ram_load_gbps": _gbps(decoded, _median(ram_s)),
        "ram_load_runs_s": ram_s,
        "disk_read_gbps": _gbps(stored_bytes, _median(get_s)),
        "disk_read_runs_s": get_s,
        "decode_gbps": _gbps(decoded, _median(decode_s)),
        "decode_runs_s": decode_s,
        "raw_disk_read_gbps": raw_gbps,
        "raw_disk_read_runs_s": raw_s,
        "raw_read_block_bytes": READ_BLOCK,
        "disk_vs_raw": disk_gbps / raw_gbps,
        "page_cache": cache.report(),
        "machine": machine_info(work.parent),
        "wall_s": time.perf_counter() - t_start,
    }


def main(args: argparse.Namespace) -> int:
    try:
        result = run(args)
    except ValueError as exc:
        print(f"kvgate bench kv: error: {exc}", file=sys.stderr)
        return 2
    m = result["modes"]
    print(f"prompt {result['history_tokens']} tokens, {result['loaded_chunks']} chunks of {result['chunk_tokens']} "
          f"loadable ({result['stored_bytes'] / 1e6:.0f} MB), median of {result['repeats']}")
    print(f"{'state':22s} {'ttft':>9s} {'load':>9s} {'prefill':>9s} {'cached':>7s} {'speedup':>8s}")
    for name in MODES:
        s = m[name]
        print(f"{name:22s} {s['ttft_s'] * 1000:7.0f}ms {s['load_s'] * 1000:7.0f}ms {s['prefill_s'] * 1000:7.0f}ms "
              f"{s['cached_tokens']:7d} {result['ttft_cold_s'] / s['ttft_s']:7.2f}x")
    pc = result["page_cache"]
    print(f"load GB/s: disk tier {result['disk_load_gbps']:.2f} (its reads {result['disk_read_gbps']:.2f}, decode "
          f"{result['decode_gbps']:.2f})  raw file read {result['raw_disk_read_gbps']:.2f} (disk/raw "
          f"{result['disk_vs_raw']:.2f})  memory tier {result['ram_load_gbps']:.2f}")
    print(f"page cache dropped: {', '.join(pc['methods']) or 'no'} (resident after drop: {pc['max_resident_bytes_after_drop']} B)"
          f"; identical output: {result['identical_output']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0
