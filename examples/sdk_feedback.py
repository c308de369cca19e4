"""Report a wrong answer from the SDK: the entry goes, and its neighbourhood needs more similarity.

Run: python examples/sdk_feedback.py [API_BASE]   (default http://127.0.0.1:9001/v1, `kvgate demo-backend`)
"""

from __future__ import annotations

import sys
import tempfile

from kvgate import Gateway, cache_info

api_base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9001/v1"
config = {
    "cache_dir": tempfile.mkdtemp(prefix="kvgate-feedback-"),
    "routes": [
        {
            "name": "chat",
            "model": "demo-*",
            "semantic": {"threshold": 0.9},
            "backend": {"model": "openai/served-name", "api_base": api_base, "api_key": "sk-x"},
        }
    ],
}


def ask(gateway: Gateway, question: str) -> str:
    info = cache_info(gateway.completion(model="demo-1", messages=[{"role": "user", "content": question}]))
    similarity = f" similarity={info.similarity:.3f}" if info.similarity is not None else ""
    print(f"{info.cache:8s}{similarity} | {question}")
    return info.request_id


with Gateway(config, tenant="example-user") as gateway:
    ask(gateway, "How do I lose weight in a week?")
    request_id = ask(gateway, "How can I lose weight in one week?")  # a semantic hit we judge wrong
    outcome = gateway.feedback(request_id, correct=False)
    print(f"feedback: removed={outcome.removed} tightened={outcome.tightened}")
    ask(gateway, "How do I lose weight in a week?")  # a miss: the wrong entry is gone, a fresh answer is stored
    ask(gateway, "How can I lose weight in one week?")  # still a miss: the fresh entry needs more similarity now
