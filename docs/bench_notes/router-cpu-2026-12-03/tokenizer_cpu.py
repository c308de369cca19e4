"""CPU to tokenize every chat segment `kvgate bench vllm`'s conversations bring (each user
message and each 16-token answer, once, as precise mode tokenizes a new segment), with the fast
tokenizer's `encode_batch` (ids and character offsets) and `encode_batch_fast` (ids only),
alternated over rounds, one thread, SmolLM2's tokenizer. Asserts both give the same ids.

    python tokenizer_cpu.py [--conversations 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as `kvgate serve` runs it: no thread pool

from tokenizers import Tokenizer  # noqa: E402

from kvgate.engines.vllm.launch import default_model_dir  # noqa: E402
from kvgate.index.kv.tokenizer import load_tokenizer  # noqa: E402
from kvgate.tools.bench.trace import load_trace  # noqa: E402
from kvgate.tools.bench.vllm_arena import DEFAULT_TRACE  # noqa: E402
from kvgate.tools.bench.vllm_arena_workload import group_conversations, select, user_texts  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--conversations", type=int, default=32)
p.add_argument("--rounds", type=int, default=5)
args = p.parse_args()

rust = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
chat = load_tokenizer(str(default_model_dir()))
convs, _ = select(group_conversations(load_trace(DEFAULT_TRACE)), 4, 64, 16, 3500)
answer = " ".join(f"w{i}" for i in range(16))
segments: list[str] = []
for conv in convs[: args.conversations]:
    messages: list[dict[str, str]] = []
    seen: set[str] = set()
    for text in user_texts(conv, 64):
        messages = [*messages, {"role": "user", "content": text}]
        for seg in chat.segments(messages):
            if seg not in seen:
                seen.add(seg)
                segments.append(seg)
        messages = [*messages, {"role": "assistant", "content": answer}]
chars = sum(map(len, segments))
ids = [rust.encode_batch([s], add_special_tokens=False)[0].ids for s in segments]
assert ids == [rust.encode_batch_fast([s], add_special_tokens=False)[0].ids for s in segments]
tokens = sum(map(len, ids))
print(f"{len(segments)} segments, {chars} characters, {tokens} tokens ({tokens / (args.conversations * 4):.0f} per request)")
took: dict[str, list[float]] = {"encode_batch": [], "encode_batch_fast": []}
for _ in range(args.rounds):
    for name in took:
        encode = getattr(rust, name)
        cpu = time.process_time()
        for s in segments:
            encode([s], add_special_tokens=False)
        took[name].append(time.process_time() - cpu)
for name, spent in took.items():
    per_token = statistics.fmean(spent) / tokens * 1e6
    print(
        f"{name}: {statistics.fmean(spent) * 1e3:.0f} ms in all (rounds {', '.join(f'{s * 1e3:.0f}' for s in spent)}), "
        f"{per_token:.2f} µs per token, {statistics.fmean(spent) / (args.conversations * 4) * 1e3:.2f} ms per request"
    )
ratios = [f / b for f, b in zip(took["encode_batch_fast"], took["encode_batch"])]
print(f"fast / batch by round: {', '.join(f'{r:.3f}' for r in ratios)}; mean {statistics.fmean(ratios):.3f}")
