"""Talk to a running kvgate proxy with the official OpenAI client.

Run: python examples/proxy_client.py [PROXY_URL]   (default http://127.0.0.1:8080/v1, `make demo`)
"""

from __future__ import annotations

import sys

import openai

client = openai.OpenAI(
    base_url=sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1", api_key="my-tenant-key"
)
for question in ["What is the capital of France?", "Tell me the capital city of France"]:
    raw = client.chat.completions.with_raw_response.create(
        model="demo-1", messages=[{"role": "user", "content": question}]
    )
    reply = raw.parse().choices[0].message.content
    print(f"{raw.headers['x-kvgate-cache']:8s} {raw.headers.get('x-kvgate-similarity', '')} | {question} -> {reply}")

stream = client.chat.completions.create(
    model="demo-1", messages=[{"role": "user", "content": "What is the capital of France?"}], stream=True
)
print("stream:", "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
