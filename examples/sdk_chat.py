"""kvgate's SDK: the same kwargs as litellm.completion, with an exact + semantic cache in front.

Run: python examples/sdk_chat.py [API_BASE]   (default http://127.0.0.1:9001/v1, `kvgate demo-backend`)
"""

from __future__ import annotations

import sys
import tempfile

from kvgate import Gateway, cache_info

api_base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9001/v1"
config = {
    "cache_dir": tempfile.mkdtemp(prefix="kvgate-example-"),
    "routes": [
        {
            "name": "chat",
            "model": "demo-*",
            "backend": {"model": "openai/served-name", "api_base": api_base, "api_key": "sk-x"},
            "semantic": {"threshold": 0.9},
        }
    ],
}

with Gateway(config, tenant="example-user") as gateway:
    for question in [
        "What is the capital of France?",
        "What is the capital of France?",
        "Tell me the capital city of France",
    ]:
        response = gateway.completion(model="demo-1", messages=[{"role": "user", "content": question}])
        info = cache_info(response)
        similarity = f" similarity={info.similarity:.3f}" if info.similarity is not None else ""
        print(f"{info.cache:8s}{similarity} | {question} -> {response.choices[0].message.content}")

    stream = gateway.completion(
        model="demo-1", messages=[{"role": "user", "content": "What is the capital of France?"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    print(f"stream {stream.kvgate.cache}: {text}")
