"""Backends kvgate ships: the reference CPU replica (`kvgate.engines.replica`, SmolLM2 + KV chunk store),
the simulated replica for routing benchmarks (`kvgate.engines.sim`) and the deterministic demo backend
(`kvgate.engines.demo`).

An engine shares with the router only what both must agree on — block hashing, prompt rendering
and tokenising, the KV chunk store and the KV-event codec, all in `index` — and the OpenAI wire
helpers in `kvgate.engines.api`. It never imports `middleware`, so a replica process loads neither
LiteLLM nor FAISS nor the ONNX embedder (import-linter contracts in pyproject.toml).

Importing an engine sets no environment variable: an engine loads only local or packaged weights
by passing `local_files_only=True` to Hugging Face loaders, and the process-wide defaults
(offline hub, no tokenizer thread pool) are the entry point's (`kvgate`, or an engine's own
`python -m` block).
"""

from __future__ import annotations
