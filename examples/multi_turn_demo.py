"""A multi-turn conversation through the kvgate proxy: watch TTFT drop as the history is reused.

Start `make run` (proxy + two reference replicas), then:
    python examples/multi_turn_demo.py [PROXY_URL] [--turns N]
Each turn streams; TTFT is the time to the first content chunk. `cached` is how many prompt
tokens the replica loaded from its KV chunk store instead of recomputing them.
"""

from __future__ import annotations

import argparse
import time

import openai

STORY = (
    "The lighthouse keeper of Saint Brigid's Point kept a journal of every ship that passed, "
    "every storm that broke against the rocks and every letter that reached the island. "
) * 12
QUESTIONS = [
    "Who keeps the journal?",
    "What does the journal record?",
    "Where is the lighthouse?",
    "Summarise the story in one sentence.",
    "What could happen next?",
    "Give the story a title.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.url, api_key="demo-user")
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": STORY + QUESTIONS[0]}]
    print(f"{'turn':>4} {'ttft':>8} {'cached':>7} {'prompt':>7}  answer")
    for turn in range(args.turns):
        started = time.perf_counter()
        ttft, parts, usage = None, [], None
        stream = client.chat.completions.create(
            model=args.model,
            messages=messages,
            stream=True,
            max_tokens=args.max_tokens,
            temperature=0,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - started
                parts.append(chunk.choices[0].delta.content)
        answer = "".join(parts).strip()
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        cached = getattr(details, "cached_tokens", None) if details else None
        prompt = usage.prompt_tokens if usage else None
        print(
            f"{turn + 1:>4} {ttft or 0:7.2f}s {cached if cached is not None else '-':>7} {prompt or '-':>7}  {answer[:70]}"
        )
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": QUESTIONS[(turn + 1) % len(QUESTIONS)]},
        ]


if __name__ == "__main__":
    main()
