"""Two kvgate proxies on one Redis (`make run-cluster`): an answer stored through the first is an
exact hit and a semantic hit on the second.

Run: python examples/cluster_demo.py [PROXY_A_URL PROXY_B_URL]   (default :8080 and :8081)
Exits 1 when the second proxy misses.
"""

from __future__ import annotations

import sys
import time

import httpx

a_url, b_url = sys.argv[1:3] if len(sys.argv) > 2 else ("http://127.0.0.1:8080", "http://127.0.0.1:8081")
headers = {"authorization": "Bearer my-tenant-key"}


def ask(url: str, question: str) -> str:
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        headers=headers,
        timeout=60,
        json={"model": "demo-1", "messages": [{"role": "user", "content": question}]},
    )
    resp.raise_for_status()
    tier = resp.headers["x-kvgate-cache"]
    print(f"{url}  {tier:8s} | {question} -> {resp.json()['choices'][0]['message']['content']}")
    return tier


ask(a_url, "What is the capital of France?")
exact = ask(b_url, "What is the capital of France?")
time.sleep(0.6)  # the second proxy reads the first one's additions from Redis every follow_interval_s
semantic = ask(b_url, "Tell me the capital city of France")
sys.exit(0 if (exact, semantic) == ("exact", "semantic") else 1)
