"""The scheduler side's record of its requests between vLLM's hooks: per request the plan of its
last lookup and the chunks saved so far, the loads recorded once vLLM allocated their blocks, and
what each step then loads and saves (the LoadSpecs and SaveSpecs that KvgateMetadata carries to the
workers). Bookkeeping only: the tiers are asked through the callable the connector passes to
`lookup`, and nothing here imports vLLM (tested without it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from kvgate.engines.vllm.kv_connector.plan import LoadPlan, chunks_to_save, low64, plan_load
from kvgate.engines.vllm.kv_connector.specs import LoadSpec, SaveSpec

log = logging.getLogger("vllm.kvgate")  # under vLLM's logger, so its handlers print it


@dataclass
class TrackedRequest:
    request: Any
    saved_upto: int | None = None  # first chunk not yet saved; None until first scheduled
    plan: Any = None  # the LoadPlan of the last get_num_new_matched_tokens
    background: bool = False  # that plan loads beside the engine's steps


class RequestBook:
    """The requests the scheduler's connector instance knows of, by request id. Only the scheduling
    thread touches it."""

    def __init__(self, block_size: int, chunk_blocks: int) -> None:
        self.block_size = block_size
        self.chunk_blocks = chunk_blocks
        self._reqs: dict[str, TrackedRequest] = {}
        self._to_load: dict[str, tuple[Any, list[int], bool]] = {}  # plan, block ids, in the background

    def track(self, request: Any) -> TrackedRequest:
        """The record of `request`, made the first time it is seen."""
        return self._reqs.setdefault(request.request_id, TrackedRequest(request))

    def lookup(
        self, request: Any, num_computed_tokens: int, longest_prefix: Callable[[list[int]], int]
    ) -> LoadPlan | None:
        """What `request` can load past `num_computed_tokens` (plan.py's plan_load over its blocks'
        hashes; `longest_prefix` asks the tiers). None when nothing is stored or a tier cannot answer."""
        hashes = [low64(h) for h in request.block_hashes]
        try:
            return plan_load(
                hashes, request.num_tokens, num_computed_tokens, self.block_size, self.chunk_blocks, longest_prefix
            )
        except Exception:  # a tier that cannot answer is a miss
            log.exception("looking up KV chunks failed; prefilling instead")
            return None

    def allocated(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """vLLM allocated `request`'s blocks: record the load its plan makes into them, if any."""
        state = self._reqs.get(request.request_id)
        if num_external_tokens <= 0 or state is None or state.plan is None:
            return
        self._to_load[request.request_id] = (state.plan, list(blocks.get_block_ids()[0]), state.background)

    def forget(self, request_id: str) -> None:
        self._reqs.pop(request_id, None)
        self._to_load.pop(request_id, None)

    def _chunk(self, request: Any, c: int, block_ids: list[int]) -> tuple[int, list[int], list[int], str | None]:
        """Chunk c of `request`: its key hash (its last block's), its blocks' hashes and block ids, and
        the request's cache_salt (a sealed chunk's key: only the tenant's current salt opens it)."""
        cb = self.chunk_blocks
        blocks = [low64(h) for h in request.block_hashes[c * cb : (c + 1) * cb]]
        return blocks[-1], blocks, list(block_ids[c * cb : (c + 1) * cb]), getattr(request, "cache_salt", None)

    def take_loads(self) -> list[LoadSpec]:
        """The loads recorded since the last step, handed over once."""
        loads = []
        for req_id, (plan, block_ids, background) in self._to_load.items():
            request = self._reqs[req_id].request
            span = range(plan.first_chunk, plan.first_chunk + plan.n_chunks)
            chunks = [self._chunk(request, c, block_ids) for c in span]
            loads.append(
                LoadSpec(
                    req_id,
                    [key for key, *_ in chunks],
                    [ids for _, _, ids, _ in chunks],
                    plan.skip_blocks,
                    background,
                    getattr(request, "cache_salt", None),
                )
            )
        self._to_load.clear()
        return loads

    def saves(self, scheduler_output: Any, kv_manager: Any) -> list[SaveSpec]:
        """The chunks this step completes, to save; `kv_manager` (vLLM's KV cache manager, None
        until bound) gives their block ids."""
        out: list[SaveSpec] = []
        scheduled = [(r.req_id, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        scheduled += list(zip(cached.req_ids, cached.num_computed_tokens))
        for req_id, computed in scheduled:
            state = self._reqs.get(req_id)
            if state is None or kv_manager is None:
                continue
            if state.saved_upto is None:  # loaded or engine-cached before
                state.saved_upto = (computed // self.block_size) // self.chunk_blocks
            after = computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            todo = chunks_to_save(
                state.saved_upto, after, len(state.request.block_hashes), self.block_size, self.chunk_blocks
            )
            if not todo:  # most decode steps: nothing converted, nothing looked up
                continue
            block_ids = kv_manager.get_block_ids(req_id)[0]
            out.extend(SaveSpec(*self._chunk(state.request, c, block_ids)) for c in todo)
            state.saved_upto = todo.stop
        return out
