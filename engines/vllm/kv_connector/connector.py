"""KvgateConnector: the class vLLM loads. vLLM's KVConnectorFactory imports the module that
`kv_connector_module_path` names ("kvgate.engines.vllm.kv_connector.connector") and takes the class
`kv_connector` names ("KvgateConnector") from it; nothing is registered with vLLM.

vLLM builds it twice: the scheduler's instance decides (get_num_new_matched_tokens: how many
tokens beyond the engine's own cache a tier holds; build_connector_meta: which chunks each step
loads and saves), the worker's instance moves bytes (start_load_kv, wait_for_save). Both open the
same tiers. The scheduler loads a stored prefix only where the gate (gate.py) estimates reading it
faster than prefilling it, from the worker's measurements that travel back in vLLM's stats. A load
estimated short runs before the step's forward pass (on CUDA layer by layer, on the loader's own
stream); a longer one runs beside the engine's steps (background.py: load_async, vLLM parks the
request until get_finished reports it). kv_load_failure_policy "recompute" turns a failed chunk
into a recompute either way. Saves are copied out layer by layer as the forward pass ends each
layer (step_save.py) and written in the background.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable

import torch
import vllm
from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole

from kvgate.engines.vllm.kv_connector import events as ev
from kvgate.engines.vllm.kv_connector.background import BackgroundLoads
from kvgate.engines.vllm.kv_connector.gate import Estimates, chunks_worth_loading, in_background, load_seconds, slowest
from kvgate.engines.vllm.kv_connector.messages import EventBuffer, KvgateEvents, KvgateMetadata
from kvgate.engines.vllm.kv_connector.metrics import KvgatePromMetrics, KvgateStats, deltas
from kvgate.engines.vllm.kv_connector.namespace import check_version, namespace, vllm_parts
from kvgate.engines.vllm.kv_connector.request_book import RequestBook
from kvgate.engines.vllm.kv_connector.settings import build_cipher, build_tiers, chunk_blocks, parse
from kvgate.engines.vllm.kv_connector.staging import StagingPool
from kvgate.engines.vllm.kv_connector.step_clock import StepClock
from kvgate.engines.vllm.kv_connector.step_save import Saves, writer_depth
from kvgate.engines.vllm.kv_connector.worker import Counters, Loader, PagedKV, Saver, SaveSpec
from kvgate.index.kv.chunks import ChunkStore
from kvgate.index.kv.chunks.layer_codec import LayerCodec

# stored bytes per raw 16-bit KV byte: int8/int4 values plus one 16-bit scale per 32 values (quant.py)
STORED_RATIO = {"raw": 1.0, "int8": (1 + 2 / 32) / 2, "int4": (0.5 + 2 / 32) / 2}

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

log = logging.getLogger("vllm.kvgate")  # under vLLM's logger, so its handlers print it


class KvgateConnector(KVConnectorBase_V1):
    """vLLM calls the scheduler-side hooks on the engine core's scheduling thread, inside its step
    loop: time spent there delays every request's next token, and an exception stops the engine. It
    calls the worker-side hooks on each worker's model-runner thread, around the forward pass. Each
    hook says who calls it, when, and what it must not do (vLLM's v1/base.py is the contract)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        """Built by vLLM's KVConnectorFactory at engine start, once per process: the scheduler's
        (role SCHEDULER) and each worker's (WORKER). The one place that may raise: a bad setting or an
        unsupported vLLM stops the engine before it serves."""
        check_version(vllm.__version__)
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tcfg = vllm_config.kv_transfer_config
        self.settings = parse(tcfg.kv_connector_extra_config if tcfg else None)
        if tcfg is not None and getattr(tcfg, "kv_load_failure_policy", "recompute") != "recompute":
            log.warning(
                "kv_load_failure_policy is %r: a missing or damaged KV chunk will FAIL its request. "
                'Set "kv_load_failure_policy": "recompute" so a lost chunk costs a prefill instead.',
                tcfg.kv_load_failure_policy,
            )
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise ValueError(
                f"kvgate's KV connector supports models with one KV cache group; this one has {len(groups)} "
                "(hybrid or sliding-window layouts). Remove --kv-transfer-config for this model."
            )
        self.block_size = vllm_config.cache_config.block_size
        self.is_worker = role == KVConnectorRole.WORKER
        rank = 0
        if self.is_worker:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            rank = get_tensor_model_parallel_rank()
        device = "cpu" if vllm_config.device_config is None else str(vllm_config.device_config.device_type)
        parts = vllm_parts(vllm_config, device)
        self.namespace = namespace(parts, rank)
        # the scheduler has no tensors to measure: both sides size chunks from the config alike
        itemsize = 1 if str(parts["kv_dtype"]).startswith("fp8") else vllm_config.model_config.dtype.itemsize
        block_bytes = 2 * parts["kv_heads"] * parts["head_size"] * self.block_size * parts["layers"] * itemsize
        self.chunk_blocks = chunk_blocks(self.settings, block_bytes, self.block_size)
        self.chunk_stored_bytes = block_bytes * self.chunk_blocks * STORED_RATIO[self.settings.codec]
        self.num_blocks = getattr(kv_cache_config, "num_blocks", None)
        self.estimates = Estimates()
        self._gauges_sent: dict[str, float] = {}
        self.media = ev.media(self.settings)
        self.codec = LayerCodec(self.settings.codec, self.settings.entropy)  # type: ignore[arg-type]
        self.store = ChunkStore(
            build_tiers(self.settings, with_memory=self.is_worker),
            self.namespace,
            self.codec,
            build_cipher(self.settings),
        )
        self.counters = Counters()
        self._reported: dict[str, float] = {}  # counter values already handed to vLLM's stats
        # scheduler side
        self._book = RequestBook(self.block_size, self.chunk_blocks)
        self._events: list[KVCacheEvent] = []
        self._kv_manager: Any = None
        # worker side
        self._kv: PagedKV | None = None
        self._loader: Loader | None = None
        self._background: BackgroundLoads | None = None
        self._saver: Saver | None = None
        self._pool: StagingPool | None = None
        self._save_stream: Any = None
        self._saves: Saves | None = None
        self._clock: StepClock | None = None
        self._worker_events = EventBuffer()
        if self.is_worker:
            self.store.watch_removed(self._removed)
        log.info(
            "kvgate connector (%s): namespace %s, tiers %s, codec %s, %d block(s) per chunk",
            role.name.lower(),
            self.namespace,
            self.settings.tier_names,
            self.codec.name,
            self.chunk_blocks,
        )

    # ---------------------------------------------------------------- scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """Scheduler, once, when vLLM builds its scheduler. build_connector_meta reads the request's
        block ids from this manager; never allocate or free blocks through it."""
        super().bind_kv_cache_manager(kv_cache_manager)
        self._kv_manager = kv_cache_manager

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        """Scheduler, each time it considers a waiting request for a step (again on a later step if it
        stays waiting): the tokens past `num_computed_tokens` a tier holds and the gate lets through, and
        whether they load in the background. At most one lookup per tier (on the scheduling thread), and
        the last call's plan wins; never raises: a tier that cannot answer is a miss."""
        state = self._book.track(request)
        holders: list[str] = []
        plan = self._book.lookup(
            request, num_computed_tokens, lambda hashes: self.store.longest_prefix(hashes, holders)
        )
        tier = slowest(holders[: plan.n_chunks] if plan else [], self.settings.tier_names)
        state.plan, state.background = self._gated(plan, tier)
        return (state.plan.tokens if state.plan else 0), state.background

    def _gated(self, plan: Any, tier: str) -> tuple[Any, bool]:
        """The plan the gate lets through (None: prefill it all), and whether it loads in the
        background; costs are those of `tier`, the slowest one the plan reads from."""
        if plan is None or plan.n_chunks == 0:
            return None, False
        costs = self.estimates.costs(tier)
        if self.settings.gate and not chunks_worth_loading(
            plan.n_chunks, self.chunk_blocks * self.block_size, self.chunk_stored_bytes, costs
        ):
            self.counters.gated_loads += 1
            return None, False
        estimate = load_seconds(self.chunk_stored_bytes * plan.n_chunks, plan.n_chunks, costs)
        return plan, in_background(estimate, self.settings.background_load_ms / 1e3)

    def update_state_after_alloc(self, request: "Request", blocks: Any, num_external_tokens: int) -> None:
        """Scheduler, right after it allocated the request's blocks (for a background load twice:
        before the load, then with num_external_tokens 0). Records the blocks the plan loads into; no
        lookups (the plan is get_num_new_matched_tokens')."""
        self._book.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """Scheduler, once per step, after scheduling it: the loads recorded since the last step and the
        chunks this step completes (to save); vLLM sends it to every worker. Bookkeeping only, no I/O;
        never modify scheduler_output."""
        meta = KvgateMetadata(step_tokens=int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0))
        meta.loads.extend(self._book.take_loads())
        meta.saves.extend(self._book.saves(scheduler_output, self._kv_manager))
        return meta

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Scheduler, once per request, when it finishes or is aborted, before vLLM frees its blocks.
        Forgets it; (False, None): saves copy blocks out in the step that computed them, so vLLM may free
        them at once."""
        self._book.forget(request.request_id)
        return False, None

    def update_connector_output(self, connector_output: Any) -> None:
        """Scheduler, once per step, with the workers' output for it (before get_kv_connector_stats and
        take_events): keeps their KV events, feeds the gate their load and prefill timings. No I/O."""
        got = getattr(connector_output, "kv_cache_events", None)
        if got is not None:
            self._events.extend(got.get_all_events())
        stats = getattr(connector_output, "kv_connector_stats", None)
        step = getattr(stats, "data", None) or {}
        for tier in self.settings.tier_names:
            self.estimates.observe_load(
                step.get(f"tier_bytes:{tier}", 0.0),
                int(step.get(f"tier_chunks:{tier}", 0)),
                step.get(f"tier_seconds:{tier}", 0.0),
                tier,
            )
        self.estimates.observe_prefill(int(step.get("prefill_tokens", 0)), step.get("prefill_seconds", 0.0))

    def reset_cache(self) -> bool:
        """Scheduler, between steps, on `POST /reset_prefix_cache?reset_external=true`: empty the
        shared tiers (disk, remote). Holds the engine while they empty (an operator's request, not the
        serving path); False rather than an exception when that fails."""
        try:
            self.store.clear()
            return True
        except Exception:
            log.exception("emptying the KV tiers failed")
            return False

    def take_events(self) -> Iterable[KVCacheEvent]:
        """Scheduler, once per step, after update_connector_output: the workers' tier events, which
        vLLM publishes with its own. Hands them over once."""
        out, self._events = self._events, []
        return out

    # ---------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Worker, once, after vLLM allocated its paged KV cache, before the first step. Allocates what
        the steps use (staging pool, loaders, writer, streams), so no step allocates."""
        self._kv = PagedKV(kv_caches, self.num_blocks)
        cuda = self._kv.device.type == "cuda"
        staging = self.settings.staging_mb << 20
        self._pool = StagingPool(staging, pinned=cuda)
        group_bytes = staging // 4
        self._loader = Loader(self.store, self._kv, self.counters, self._pool, group_bytes=group_bytes)
        self._background = BackgroundLoads(
            Loader(self.store, self._kv, self.counters, self._pool, layerwise=False, group_bytes=group_bytes)
        )
        depth = writer_depth(self.settings.save_queue, staging, self._kv.block_bytes * self.chunk_blocks, cuda)
        self._saver = Saver(self.store, depth, self.counters, self._stored)
        self._save_stream = torch.cuda.Stream(device=self._kv.device) if cuda else None
        self._saves = Saves(self._kv, self._pool, self._save_stream, group_bytes, self._saver, self.counters)
        self._clock = StepClock(self._kv.device)
        log.info(
            "kvgate connector: %d layers, blocks of %s on %s (%.1f MB of KV per chunk)",
            len(self._kv.layers),
            self._kv.block_shape,
            self._kv.device,
            self._kv.block_bytes * self.chunk_blocks / 1e6,
        )

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Worker, each step, before the forward pass: this step's KvgateMetadata. Starts the step's
        clock; must not block."""
        super().bind_connector_metadata(connector_metadata)
        if self._saves is not None:
            self._saves.begin(connector_metadata.saves if isinstance(connector_metadata, KvgateMetadata) else ())
        if self._clock is not None and isinstance(connector_metadata, KvgateMetadata):
            self._clock.start(connector_metadata.step_tokens, self.counters)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Worker, each step: before the forward pass when the step loads synchronously, else right
        after vLLM launched it. Queues background loads; reads the others here, on the forward path
        (the gate sends here only loads estimated under background_load_ms; on CUDA the copies run on
        the loader's stream, ordered by wait_for_layer_load). Never raises: a failed chunk's blocks go
        to get_block_ids_with_load_errors and are recomputed."""
        meta = self._get_connector_metadata()
        if self._loader is None or self._background is None or not isinstance(meta, KvgateMetadata):
            return
        for spec in meta.loads:
            if spec.background:
                self._background.submit(spec)
                continue
            try:
                self._loader.load(spec)
            except Exception:  # whatever broke, the blocks are recomputed, never served half-written
                log.exception("loading KV for request %s failed; recomputing", spec.req_id)
                self._loader.fail(spec)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Worker, in each attention layer's forward, before it reads its KV: the engine's stream waits
        for that layer's scatter (nothing on the CPU). Once per layer per step: no I/O, no host wait."""
        if self._loader is not None:
            self._loader.wait_for_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        """Worker, in each attention layer's forward, after it wrote its KV: starts copying that
        layer's rows of the step's chunks to save (on CUDA on the save stream, so the copy overlaps
        the next layers; step_save.py). Must not block or raise: a failure drops the step's saves."""
        if self._saves is not None:
            self._saves.layer(layer_name)

    def wait_for_save(self) -> None:
        """Worker, each step after the forward pass (and the draft model's), metadata still bound:
        closes the step's loads and clock, copies out what save_kv_layer did not and hands each chunk
        to the background writer. Never writes to a tier here: the writer does, or drops the save
        when behind."""
        if self._loader is not None:
            self._loader.finish_step()
        if self._clock is not None:
            self._clock.stop(self.counters)
        if self._saves is not None:
            self._saves.end()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Worker, each step after wait_for_save, before get_block_ids_with_load_errors: requests whose
        background load ended (failed or not), which vLLM schedules again. No deferred saves to report
        (request_finished never defers freeing)."""
        done = self._background.take_finished() if self._background else set()
        return None, (done or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Worker, each step after get_finished: blocks whose chunk could not be loaded (missing,
        damaged, misshapen), each reported once; vLLM recomputes them (kv_load_failure_policy recompute)."""
        failed = self._loader.take_failed() if self._loader else set()
        return failed | (self._background.take_failed() if self._background else set())

    def _stored(self, spec: SaveSpec) -> None:
        self._worker_events.add(ev.stored(spec.block_hashes, self.block_size, m) for m in self.media.values())

    def _removed(self, chunk_hashes: list[int]) -> None:
        self._worker_events.add(ev.removed(list(chunk_hashes), m) for m in self.media.values())

    def get_kv_connector_kv_cache_events(self) -> KvgateEvents | None:
        """Worker, each step after the forward pass: the tiers' events since the last step, or None.
        Takes a lock the writer thread and store evictions hold only to append."""
        return self._worker_events.take()

    def get_kv_connector_stats(self) -> KvgateStats | None:
        """Both sides, each step: the worker's go with its output, the scheduler's after
        update_connector_output. Counter increments since the last call (the scheduler adds the gate's
        estimates when they change), None when nothing moved; reads counters only."""
        if self._pool is not None:
            self.counters.staging_allocs = self._pool.allocs
        self.counters.decrypt_failures = self.store.auth_failures
        step = deltas(self.counters, self._reported)
        if not self.is_worker:  # the scheduler's instance also reports the gate's estimates when they move
            gauges = self.estimates.gauges(self.settings.tier_names)
            if gauges != self._gauges_sent:
                step.update(gauges)
                self._gauges_sent = gauges
        return KvgateStats(data=step) if any(step.values()) else None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Asked by vLLM when it builds its config, before the engine starts. Layer-by-layer loads make
        each attention layer's stream wait on an event; a captured CUDA graph would replay without
        that wait, so attention must run outside the graphs."""
        return True

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvgateStats:
        """vLLM's stats logger (the front-end process), for each step's aggregated stats: counters
        sum, gauges keep the latest (KvgateStats)."""
        return KvgateStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls, vllm_config: Any, metric_types: Any, labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
    ) -> KvgatePromMetrics:
        """vLLM's Prometheus logger, once at start-up (front-end process): the counters and gauges on
        the engine's /metrics."""
        return KvgatePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        """Each side, once, as its process shuts down: waits for the queued background loads and
        saves (nothing else runs then), then stops their threads."""
        if self._background is not None:
            self._background.drain()
            self._background.close()
        if self._saver is not None:
            self._saver.drain()
            self._saver.close()
        c = self.counters
        log.info(
            "kvgate connector: %d loads (%d chunks, %.1f MB, %.2f s, %d errors); %d chunks saved, %d dropped",
            c.loads,
            c.loaded_chunks,
            c.loaded_bytes / 1e6,
            c.load_s,
            c.load_errors,
            c.saved_chunks,
            c.dropped_saves,
        )
