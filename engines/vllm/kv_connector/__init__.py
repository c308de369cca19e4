"""kvgate as vLLM's KV tier: a KV connector (vLLM's `KVConnectorBase_V1`) over kvgate's chunk store.

Runs inside the vLLM engine process, installed into vLLM's own environment without the proxy
stack: it imports only `kvgate.index.kv.chunks` (tiers, codecs), `torch` and `vllm`. vLLM loads it with

    --kv-transfer-config '{"kv_connector": "KvgateConnector",
                           "kv_connector_module_path": "kvgate.engines.vllm.kv_connector.connector",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {...settings.py...}}'

Modules: settings.py (the extra-config fields, validated, and the tiers they build), plan.py (pure
scheduler arithmetic: what to load, what to save), request_book.py (the scheduler's record of its
requests: plans, loads and saves per step), namespace.py (what makes KV reusable, and the
supported vLLM versions), worker.py (the background saver), specs.py (what the scheduler tells
the worker), paged.py (vLLM's KV layouts; block gather and scatter), staging.py (reusable pinned
buffers), loader.py (batched, layer-wise loads), background.py (loads beside the engine's steps),
gate.py (load or recompute, from measured costs), step_clock.py (the measured prefill rate),
events.py (per-tier BlockStored/BlockRemoved for the router), messages.py (what the scheduler's
and the workers' instances hand each other each step), metrics.py (its counters in vLLM's stats),
connector.py (the class vLLM loads). Only connector.py, messages.py and metrics.py import vllm at
module level; the rest is tested without it.
"""
