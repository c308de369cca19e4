"""Report a wrong answer to a running kvgate proxy: POST /v1/cache/feedback with the response's request id.

Run: python examples/proxy_feedback.py [PROXY_URL]   (default http://127.0.0.1:8080, `make demo`)
"""

from __future__ import annotations

import sys

import httpx

proxy = httpx.Client(
    base_url=sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080",
    headers={"authorization": "Bearer my-tenant-key"},
    timeout=60,
)


def ask(question: str) -> httpx.Response:
    resp = proxy.post(
        "/v1/chat/completions", json={"model": "demo-1", "messages": [{"role": "user", "content": question}]}
    )
    print(f"{resp.headers['x-kvgate-cache']:8s} {resp.headers.get('x-kvgate-similarity', '')} | {question}")
    return resp


ask("How do I lose weight in a week?")
hit = ask("How can I lose weight in one week?")
verdict = proxy.post("/v1/cache/feedback", json={"request_id": hit.headers["x-kvgate-request-id"], "correct": False})
print("feedback:", verdict.json())
ask("How can I lose weight in one week?")  # a miss now
