"""This engine's prefill rate, measured for the gate (gate.py) on the engine's own steps.

A step counts when it computes at least MIN_TOKENS tokens, so prefill dominates it (a decode
step's fixed costs would understate the rate). It is timed from vLLM binding the step's connector
metadata (before the forward pass) to wait_for_save (after it), less the step's own synchronous
loads. On CUDA the forward pass runs ahead of the host, so the clock records events on the engine's
stream and reads them once they complete: device time, never launch time.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kvgate.engines.vllm.kv_connector.specs import Counters

MIN_TOKENS = 512


class StepClock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._device = device
        self._start: Any = None
        self._tokens = 0
        self._load_s = 0.0
        self._pending: list[tuple[Any, Any, int]] = []  # CUDA: (start, end, tokens) not yet complete

    def start(self, tokens: int, counters: Counters) -> None:
        self._tokens, self._load_s = tokens, counters.load_s
        if tokens < MIN_TOKENS:
            self._start = None
        elif self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self._device))
        else:
            self._start = time.perf_counter()

    def stop(self, counters: Counters) -> None:
        if self._start is not None:
            if self.cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record(torch.cuda.current_stream(self._device))
                self._pending.append((self._start, end, self._tokens))
            else:
                seconds = time.perf_counter() - self._start - (counters.load_s - self._load_s)
                if seconds > 0:
                    counters.prefill_tokens += self._tokens
                    counters.prefill_s += seconds
            self._start = None
        still = []
        for start, end, tokens in self._pending:
            if end.query():
                counters.prefill_tokens += tokens
                counters.prefill_s += start.elapsed_time(end) / 1e3
            else:
                still.append((start, end, tokens))
        self._pending = still
