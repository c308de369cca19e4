"""The demo backend's spaced streams (`kvgate demo-backend --chunk-gap-ms`): the same answer, each
content chunk after the first sent that much later, and the option checked where it is given."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from kvgate.engines.demo import create_fake_app
from kvgate.middleware.cli import build_parser

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "one two three four [[fixed]]"}]}


def _stream(gap_s: float) -> tuple[list[str], float]:
    """(the content deltas of one streamed answer, seconds the exchange took)."""
    with TestClient(create_fake_app(chunk_gap_s=gap_s)) as client:
        started = time.perf_counter()
        text = client.post("/v1/chat/completions", json=BODY).text
        took = time.perf_counter() - started
    events = [json.loads(line[5:]) for line in text.split("\n\n") if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    return [d for d in deltas if d], took


def test_chunk_gap_spaces_the_same_answer():
    plain, _ = _stream(0.0)
    spaced, took = _stream(0.02)
    assert spaced == plain and "".join(plain) == "Answer: one two three four [[fixed]]"
    # a lower bound only: each chunk after the first waited at least the gap
    assert took >= 0.02 * (len(plain) - 1)


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_chunk_gap_refused_unless_a_whole_non_negative_number(value, capsys):
    with pytest.raises(SystemExit):
        build_parser(["demo-backend", "--chunk-gap-ms", value]).parse_args(["demo-backend", "--chunk-gap-ms", value])
    assert "--chunk-gap-ms" in capsys.readouterr().err


def test_chunk_gap_defaults_to_back_to_back():
    args = build_parser(["demo-backend"]).parse_args(["demo-backend"])
    assert args.chunk_gap_ms == 0
