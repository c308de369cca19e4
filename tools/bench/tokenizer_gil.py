"""How late the event loop runs while a worker thread tokenizes long prompts: precise mode's
tokenizer (`TransformersTokenizer.packed`) against the fast tokenizer's plain `encode`, which
holds the GIL for its whole call.

The proxy hashes a long prompt on a worker thread so that its event loop keeps serving the other
requests' streams; a tokenizer call that holds the GIL stops the loop for as long as it runs. One
thread tokenizes `--words` words over and over while the loop sleeps `--nap-ms` at a time; the
lag is how much later than asked each nap ends. Run it on an otherwise idle machine:

    python -m kvgate.tools.bench.tokenizer_gil [--model-dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

from kvgate.tools.bench.stats import write_json

TEXT = "The quick brown fox jumps over the lazy dog, and then some more words follow here. "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-dir", type=Path, default=None, help="a model dir with a fast tokenizer (default: SmolLM2's)"
    )
    p.add_argument("--words", type=int, default=12000, help="words per tokenized text")
    p.add_argument("--naps", type=int, default=200, help="loop naps measured per case")
    p.add_argument("--nap-ms", type=float, default=5.0)
    p.add_argument("--json", type=Path, default=None)


def loop_lag_ms(encode: Callable[[str], Any] | None, text: str, naps: int, nap_s: float) -> dict[str, float]:
    """Mean and max lag of `naps` naps of the loop while a thread runs `encode(text)` in a loop
    (None: no thread, the idle baseline)."""
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            encode(text)  # type: ignore[misc]

    async def measure() -> list[float]:
        lags = []
        for _ in range(naps):
            asked = time.perf_counter()
            await asyncio.sleep(nap_s)
            lags.append((time.perf_counter() - asked - nap_s) * 1000)
        return lags

    thread = threading.Thread(target=work, daemon=True) if encode is not None else None
    if thread is not None:
        thread.start()
    try:
        lags = asyncio.run(measure())
    finally:
        stop.set()
        if thread is not None:
            thread.join()
    return {"mean_ms": round(statistics.fmean(lags), 3), "max_ms": round(max(lags), 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tokenizers import Tokenizer

    from kvgate.engines.vllm.launch import default_model_dir
    from kvgate.index.kv.tokenizer import load_tokenizer

    model_dir = args.model_dir or default_model_dir()
    tokenizer = load_tokenizer(str(model_dir))
    rust = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = " ".join((TEXT * (args.words // len(TEXT.split()) + 1)).split()[: args.words])
    started = time.perf_counter()
    tokens = len(tokenizer.packed(text)) // 4
    cases: dict[str, Callable[[str], Any] | None] = {
        "idle": None,
        "packed": tokenizer.packed,  # what precise mode calls
        "plain_encode": lambda t: rust.encode(t, add_special_tokens=False),
    }
    out: dict[str, Any] = {
        "model_dir": str(model_dir),
        "tokens_per_text": tokens,
        "one_call_ms": round((time.perf_counter() - started) * 1000, 1),
    }
    for name, encode in cases.items():
        out[name] = loop_lag_ms(encode, text, args.naps, args.nap_ms / 1000)
        print(
            f"[tokenizer-gil] {name:13s} loop lag mean {out[name]['mean_ms']:.2f} ms, max {out[name]['max_ms']:.2f} ms"
        )
    if args.json:
        write_json(args.json, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
