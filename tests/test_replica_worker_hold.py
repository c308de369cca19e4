"""The replica's worker holds the store's background copies (kvgate.index.kv.chunks.promoter) from before a
request's load until its prompt is prefilled, and lets them go while it only decodes or idles.

The runner here records the order of the worker's calls (the Runner protocol is the seam between
scheduling and the model); tests/test_replica.py runs the worker with the real model."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from kvgate.engines.replica.types import Completion, Counters, Job, SamplingParams
from kvgate.engines.replica.worker import Worker


@dataclass
class _Run:
    job: Job
    pos: int = 0
    decoding: bool = False
    load_s: float = 0.0
    prefill_s: float = 0.0
    decoded: int = 0


@dataclass
class RecordingRunner:
    calls: list[str] = field(default_factory=list)

    def begin(self, job: Job) -> Any:
        self.calls.append("begin")
        return _Run(job)

    def prefill_step(self, run: Any, contended: bool) -> bool:
        self.calls.append("prefill")
        run.pos = min(len(run.job.tokens), run.pos + 2)
        run.decoding = run.pos == len(run.job.tokens)
        return False

    def decode_step(self, run: Any) -> bool:
        self.calls.append("decode")
        run.decoded += 1
        return run.decoded >= run.job.max_tokens

    def finish(self, run: Any) -> Completion:
        self.calls.append("finish")
        return Completion(
            text="",
            finish_reason="length",
            prompt_tokens=len(run.job.tokens),
            cached_tokens=0,
            completion_tokens=run.decoded,
            stored_chunks=0,
            queue_s=0,
            load_s=0,
            prefill_s=0,
            ttft_s=0,
            decode_s=0,
            store_s=0,
            token_ids=(),
        )

    def hold_background(self, held: bool) -> None:
        self.calls.append("hold" if held else "release")


def test_copies_are_held_from_the_load_to_the_end_of_the_prefill() -> None:
    runner = RecordingRunner()
    worker = Worker(runner, Counters(), max_running=1)  # type: ignore[arg-type]
    done = threading.Event()
    worker.submit(
        Job(
            tokens=list(range(6)),
            params=SamplingParams(),
            max_tokens=3,
            sink=lambda e: done.set() if isinstance(e, Completion) else None,
        )
    )
    assert done.wait(10)
    worker.close(10)
    calls = runner.calls
    assert calls[:5] == ["hold", "begin", "prefill", "prefill", "prefill"]  # held before the load queues copies
    assert calls[5] == "release" and set(calls[6 : calls.index("finish")]) == {"decode"}  # decoding: let go
    assert calls.count("hold") == 1
