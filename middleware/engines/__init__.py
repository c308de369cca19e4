"""Engine adapters: what differs between the engines behind a route, found out by asking them.

Owns: `EngineInfo` (what a replica's engine told us: kind, version, block size, served model dir,
how its KV events are published) and one adapter per engine kind (`vllm.py`, `generic.py`),
chosen by `discover.py`. The router reads EngineInfo; nothing else branches on the engine kind.
May import: index/ and kvgate.middleware.config; never the pipeline, the proxy or a face.
"""
