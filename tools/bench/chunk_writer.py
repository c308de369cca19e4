"""A disk-tier writer process for crash tests: verify what is stored, then write chunks until killed.

    python -m kvgate.tools.bench.chunk_writer --dir D --budget-mb 32 [--verify-only]

On start it opens a ChunkStore over a DiskTier in D (as a restarted `kvgate replica` does) and
checks every stored chunk: it must decode (checksum, key) and equal, tensor for tensor, the
deterministic chunk of its hash (`det_chunk`). It prints one JSON line
{"verified", "corrupt_detected", "wrong"}: "corrupt_detected" are chunks the codec rejected (a
reader would get a miss), "wrong" are chunks that decoded but hold other data (must be 0). Then it
writes new deterministic chunks in a loop (eviction running under the budget), printing
"writing" once, until it is killed.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from kvgate.index.kv.chunks import ChunkStore, DiskTier
from kvgate.index.kv.chunks.codec import CorruptChunk, KVChunk, decode_chunk

NAMESPACE = "crash-test:float32"
SHAPE = (4, 2, 256, 64)  # layers, kv heads, tokens, head dim: 1 MiB of float32 per chunk


def det_chunk(h: int) -> KVChunk:
    """The chunk stored under hash h: values derived from h alone."""
    layers, heads, tokens, dim = SHAPE
    base = torch.arange(heads * tokens * dim, dtype=torch.float32).reshape(heads, tokens, dim)
    salt = float(h % 100_003)
    return [(base + salt + 2 * i, base - salt - 2 * i - 1) for i in range(layers)]


def same(a: KVChunk, b: KVChunk) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def verify(store: ChunkStore, tier: DiskTier) -> dict[str, int]:
    prefix = store.key(0)[:-16]
    out = {"verified": 0, "corrupt_detected": 0, "wrong": 0}
    for key in tier.keys():
        if not key.startswith(prefix):
            continue
        h = int(key[len(prefix) :], 16)
        try:
            data = tier.get(key)
            if data is None:  # evicted by another process meanwhile
                continue
            chunk = decode_chunk(data, key)
        except CorruptChunk:
            out["corrupt_detected"] += 1
            continue
        if same(chunk, det_chunk(h)):
            out["verified"] += 1
        else:
            out["wrong"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chunk_writer")
    p.add_argument("--dir", required=True)
    p.add_argument("--budget-mb", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="where this run's hashes start")
    p.add_argument("--verify-only", action="store_true")
    args = p.parse_args(argv)
    tier = DiskTier(args.dir, args.budget_mb << 20)
    store = ChunkStore([tier], NAMESPACE)
    print(json.dumps(verify(store, tier)), flush=True)
    if args.verify_only:
        store.close()
        return 0
    print("writing", flush=True)
    i = 0
    while True:
        h = ((args.seed << 32) + i) * 0x9E3779B97F4A7C15 % 2**64
        store.put_many([h], [det_chunk(h)])
        i += 1


if __name__ == "__main__":
    sys.exit(main())
