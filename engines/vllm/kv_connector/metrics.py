"""The connector's counters in vLLM's own stats: each step's increments travel from the worker to
the engine's stats logger (vLLM's KVConnectorStats), which logs them ("KV Transfer metrics") and
adds them to Prometheus counters on the engine's /metrics, `vllm:kvgate_<name>_total`.

Counted: loads (requests that loaded before their step), background_loads (beside the steps),
loaded_chunks, loaded_bytes, load_errors (chunks missing, damaged or misshapen at load time:
recomputed), saved_chunks, dropped_saves (the writer was behind), load_seconds,
background_load_seconds and save_copy_seconds (the first and last on the forward path),
staging_allocs (host staging buffers allocated: none once warm), unstaged_copies, decrypt_failures
(sealed chunks that did not authenticate: `encryption_key_env`), gated_loads
(stored prefixes the gate prefilled instead), prefill_tokens and prefill_seconds (the steps the
gate's prefill rate is measured on). Gauges: the gate's current estimates (`GAUGES`), reported by
the scheduler's instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from kvgate.engines.vllm.kv_connector.specs import Counters

FIELDS = {  # stats key → (Counters attribute, help)
    "loads": ("loads", "requests that loaded KV from a kvgate tier"),
    "loaded_chunks": ("loaded_chunks", "KV chunks loaded from a kvgate tier"),
    "loaded_bytes": ("loaded_bytes", "bytes of KV chunks loaded (as stored)"),
    "load_errors": ("load_errors", "KV chunks that could not be loaded (missing, damaged, misshapen): recomputed"),
    "saved_chunks": ("saved_chunks", "KV chunks written to the tiers"),
    "dropped_saves": ("dropped_saves", "KV chunks not saved because the background writer was behind"),
    "load_seconds": ("load_s", "seconds spent loading KV chunks (on the forward path)"),
    "save_copy_seconds": ("save_copy_s", "seconds spent copying KV out for saving (on the forward path)"),
    "background_loads": ("background_loads", "requests whose KV loaded beside the engine's steps"),
    "background_load_seconds": ("background_load_s", "seconds of KV loads beside the engine's steps"),
    "staging_allocs": ("staging_allocs", "host staging buffers allocated (pinned on CUDA)"),
    "unstaged_copies": ("unstaged_copies", "chunk groups copied without a staging buffer (pool full)"),
    "decrypt_failures": (
        "decrypt_failures",
        "KV chunks whose seal did not authenticate (tampered, another key or salt): misses, dropped and recomputed",
    ),
    "gated_loads": ("gated_loads", "stored prefixes prefilled because loading was estimated slower"),
    "prefill_tokens": ("prefill_tokens", "tokens of the prefill-heavy steps the gate measured"),
    "prefill_seconds": ("prefill_s", "seconds of the prefill-heavy steps the gate measured"),
}
GAUGES = {  # stats key → help; the latest value wins
    **{
        f"gate_load_gbps_{tier}": f"the gate's estimate of KV load bandwidth from the {tier} tier, GB/s of stored bytes"
        for tier in ("memory", "disk", "remote")
    },
    "gate_prefill_tokens_per_s": "the gate's estimate of this engine's prefill rate, tokens/s",
}
PER_TIER = ("bytes", "chunks", "seconds")  # stats keys "tier_<what>:<tier>": loads by the slowest tier serving them


def deltas(now: Counters, last: dict[str, float]) -> dict[str, float]:
    """Increments since `last` (updated in place), keyed as FIELDS (pure but for `last`)."""
    values = {key: float(getattr(now, attr)) for key, (attr, _) in FIELDS.items()}
    for tier, sums in now.by_tier.items():
        values.update((f"tier_{what}:{tier}", float(v)) for what, v in zip(PER_TIER, sums))
    out = {}
    for key, value in values.items():
        out[key] = value - last.get(key, 0.0)
        last[key] = value
    return out


@dataclass
class KvgateStats(KVConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "KvgateStats":
        for k, v in other.data.items():
            self.data[k] = v if k in GAUGES else self.data.get(k, 0.0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: round(v, 4) for k, v in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvgatePromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {}
        for key, (_, help_text) in FIELDS.items():
            counter = self._counter_cls(name=f"vllm:kvgate_{key}", documentation=help_text, labelnames=labelnames)
            self._counters[key] = {idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()}
        self._gauges = {}
        for key, help_text in GAUGES.items():
            gauge = self._gauge_cls(
                name=f"vllm:kvgate_{key}",
                documentation=help_text,
                labelnames=labelnames,
                multiprocess_mode="mostrecent",
            )
            self._gauges[key] = {idx: gauge.labels(*values) for idx, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            gauge = self._gauges.get(key, {}).get(engine_idx)
            if gauge is not None:
                gauge.set(value)
                continue
            child = self._counters.get(key, {}).get(engine_idx)
            if child is not None and value > 0:
                child.inc(value)
