"""One request's steps on the model: start (load KV), feed a prefill slice, decode a token,
finish (store KV, build the Completion). The worker (kvgate.engines.replica.worker) decides which
request takes the next step; this module only knows how to take it.

Invariants
- The token that ends a run (EOS, a stop string's last token, the max_tokens-th token, one
  sampled after a cancel) is never fed back, so a run's cache holds KV for prompt + answer[:-1]
  at most, and only that is stored (kvgate.engines.replica.kv_io).
- A cancelled run stops within one step and still stores the full chunks it computed.
- With exact_prefill, a run that loads KV from the store computes bit for bit the logits of a
  cold run; without it they agree up to float rounding (~1e-5 in the logits), which in practice
  leaves greedy output unchanged. exact_prefill feeds the prompt in slices of exactly one chunk
  starting at a chunk boundary (prefill_slice = preempt_slice = chunk_tokens), so a cold run
  computes chunk i's KV, and every later slice, with the same forward shapes over the same inputs
  as a run that loads chunks 0..i-1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kvgate.engines.replica.announce import Announcer
from kvgate.engines.replica.kv_io import KVIO
from kvgate.engines.replica.sampling import generator, sample
from kvgate.engines.replica.text import Detokenizer, StopMatcher
from kvgate.engines.replica.types import Completion, Counters, Job


@dataclass
class Run:
    """A started request on the worker: its KV cache and how far it has got."""

    job: Job
    started: float
    cache: Any
    loaded: int  # chunks loaded from the store
    cached: int  # prompt tokens whose KV was loaded (chunks + tail)
    pos: int  # next prompt token to feed
    load_s: float
    gen: torch.Generator | None
    detok: Detokenizer
    stops: StopMatcher
    prefill_s: float = 0.0
    decoding: bool = False  # the prompt is fed and the first token picked
    answer: list[int] = field(default_factory=list)
    finish: str = "length"
    ttft_s: float = 0.0
    t_decode: float = 0.0


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every end-of-sequence id the generation config, the model config or the tokenizer names."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return frozenset(ids)


class ModelRunner:
    """Takes requests' steps on one causal LM (thread-confined: the engine's worker).
    Prefill slices are `preempt_slice` tokens while anything else is started or waiting, else
    `prefill_slice`."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        kv: KVIO,
        announcer: Announcer,
        counters: Counters,
        prefill_slice: int,
        preempt_slice: int,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.kv = kv
        self.announcer = announcer
        self.counters = counters
        self.prefill_slice = prefill_slice
        self.preempt_slice = preempt_slice
        self.eos = eos_ids(model, tokenizer)

    def begin(self, job: Job) -> Run:
        """Load the job's longest stored prefix (never the whole prompt: one token must be fed)."""
        started = time.perf_counter()
        loaded = self.kv.load(job.tokens, reserve=job.max_tokens)
        return Run(
            job=job,
            started=started,
            cache=loaded.cache,
            loaded=loaded.chunks,
            cached=loaded.cached,
            pos=loaded.cached,
            load_s=time.perf_counter() - started,
            gen=generator(job.params),
            detok=Detokenizer(self.tokenizer),
            stops=StopMatcher(job.params.stop),
        )

    def prefill_step(self, run: Run, contended: bool) -> bool:
        """Feed the next slice of the prompt; after the last one, pick the first token.
        True when the run is done (cancelled, or a one-token answer)."""
        if run.job.cancelled.is_set():
            run.finish = "cancelled"
            return True
        step = self.preempt_slice if contended else self.prefill_slice
        tokens = run.job.tokens
        t0 = time.perf_counter()
        logits = self._forward(tokens[run.pos : run.pos + step], run.cache)
        run.pos = min(len(tokens), run.pos + step)
        run.prefill_s += time.perf_counter() - t0
        if run.pos < len(tokens):
            return False
        run.decoding = True
        run.t_decode = time.perf_counter()
        return self._accept(run, sample(logits, run.job.params, run.gen))

    def decode_step(self, run: Run) -> bool:
        """Feed the last answer token and pick the next; True when the run is done."""
        if run.job.cancelled.is_set():
            run.finish = "cancelled"
            return True
        logits = self._forward([run.answer[-1]], run.cache)
        return self._accept(run, sample(logits, run.job.params, run.gen))

    def finish(self, run: Run) -> Completion:
        """Store the new full chunks of prompt + answer, keep the partial one after them, count."""
        job, answer = run.job, run.answer
        tokens = job.tokens
        if run.decoding:
            rest = run.stops.flush()
            if rest and run.finish != "cancelled":
                job.sink(rest)
        decode_s = time.perf_counter() - run.t_decode if run.decoding else 0.0
        t0 = time.perf_counter()
        stored, held = self.kv.save(tokens + answer, run.cache, run.loaded)
        self.announcer.stored(held, tokens + answer)
        store_s = time.perf_counter() - t0
        c = self.counters
        c.stored_chunks += stored
        c.prompt_tokens += len(tokens)
        c.cached_tokens += run.cached
        c.completion_tokens += len(answer)
        c.prefill_s += run.prefill_s
        c.load_s += run.load_s
        if run.finish == "cancelled":
            c.cancelled += 1
        else:
            c.completed += 1
        return Completion(
            text=run.stops.text if run.decoding else "",
            finish_reason=run.finish,
            prompt_tokens=len(tokens),
            cached_tokens=run.cached,
            completion_tokens=len(answer),
            stored_chunks=stored,
            queue_s=run.started - job.arrived,
            load_s=run.load_s,
            prefill_s=run.prefill_s,
            ttft_s=run.ttft_s,
            decode_s=decode_s,
            store_s=store_s,
            token_ids=tuple(answer),
        )

    def hold_background(self, held: bool) -> None:
        """Hold the store's background copies while a prompt is prefilled (kvgate.index.kv.chunks.promoter)."""
        if self.kv.store is not None:
            self.kv.store.hold_background(held)

    def _accept(self, run: Run, token: int) -> bool:
        """Take a sampled token: EOS, stop string, max_tokens or a cancel end the run (the token
        that ends it is never fed back)."""
        job = run.job
        if run.ttft_s == 0.0:
            run.ttft_s = time.perf_counter() - job.arrived
        if token in self.eos:
            run.finish = "stop"
            return True
        run.answer.append(token)
        piece = run.stops.feed(run.detok.add(token))
        if piece:
            job.sink(piece)
        if run.stops.stopped:
            run.finish = "stop"
        elif len(run.answer) >= job.max_tokens:
            run.finish = "length"
        elif job.cancelled.is_set():
            run.finish = "cancelled"
        else:
            return False
        return True

    def _forward(self, ids: list[int], cache: Any) -> torch.Tensor:
        """Feed `ids` after what `cache` holds (extending it in place); logits of the last one."""
        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long), past_key_values=cache, use_cache=True, logits_to_keep=1
            )
        return out.logits[0, -1]
