"""What the microbenchmarks here share: a pipeline on an exact-only route (its replica never
called), the bench's 400-word system prompt, an answer like the demo backend's, and request views."""

import secrets
import tempfile
from pathlib import Path

from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config

SYSTEM = " ".join(secrets.token_hex(3) for _ in range(400))
ANSWER = {"id": "x", "object": "chat.completion", "created": 1, "model": "smollm2",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * 60}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 600, "completion_tokens": 60, "total_tokens": 660}}


def pipeline():
    """A fresh pipeline on a new cache dir, and its route."""
    config = parse_config({"cache_dir": str(Path(tempfile.mkdtemp())), "routes": [{
        "name": "r", "model": "smol*", "backend": {"model": "openai/smollm2", "api_key": "none"},
        "semantic": {"enabled": False}, "replicas": [{"name": "r0", "api_base": "http://127.0.0.1:9/v1"}],
        "routing": {"prefix": {"tokenizer": "text"}}}]})
    return build_pipeline(config), config.routes[0]


def body(question: str) -> dict:
    return {"model": "smollm2", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}


def views(cache, route, n: int, prefix: str = "q"):
    return [cache.view(route, body(f"{prefix} {secrets.token_hex(8)}")) for _ in range(n)]
