"""Backends kvgate ships: the reference CPU replica (`engines.replica`, SmolLM2 + KV chunk store),
the simulated replica for routing benchmarks (`engines.sim`) and the deterministic demo backend
(`engines.demo`).

An engine shares with the router only what both must agree on — block hashing, prompt rendering
and tokenising, the KV chunk store and the KV-event codec, all in `index` — and the OpenAI wire
helpers in `engines.api`. It never imports `middleware`, so a replica process loads neither
LiteLLM nor FAISS nor the ONNX embedder (import-linter contracts in pyproject.toml).
"""
from __future__ import annotations

import os

# an engine loads only packaged weights: never reach for a hub at run time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
