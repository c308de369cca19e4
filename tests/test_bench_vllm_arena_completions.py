"""`kvgate bench vllm --endpoint completions`'s pure parts: the conversations rendered as growing
text prompts, the completions stream read, the option. No vLLM server is started here."""

from __future__ import annotations

import argparse
import asyncio

from kvgate.tools.bench import vllm_arena_client
from kvgate.tools.bench.vllm_arena import add_arguments
from kvgate.tools.bench.vllm_arena_client import ENDPOINTS, Turn, converse, take_event
from kvgate.tools.bench.vllm_arena_workload import next_prompt


def test_next_prompt_extends_the_previous_prompt_and_answer():
    first = next_prompt("", "", "alpha beta")
    assert first == "User: alpha beta\nAssistant:"
    second = next_prompt(first, " an answer.", "gamma")
    assert second == "User: alpha beta\nAssistant: an answer.\nUser: gamma\nAssistant:"


def _fake_send(seen: list[Turn]):
    async def send(client, url, turn, model, max_tokens, timeout):  # noqa: ARG001 - send_turn's signature
        seen.append(turn)
        turn.answer = f" reply {turn.conversation}.{turn.turn}"
        turn.ttft = 0.01

    return send


def test_completions_turns_start_with_the_previous_prompt_and_answer(monkeypatch):
    seen: list[Turn] = []
    monkeypatch.setattr(vllm_arena_client, "send_turn", _fake_send(seen))
    texts = [["one two", "three", "four five"], ["six", "seven"]]
    sent = asyncio.run(
        converse("http://x/v1/completions", texts, model="m", max_tokens=4, concurrency=2, endpoint="completions")
    )
    assert sorted((t.conversation, t.turn) for t in sent) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    for c, conv in enumerate(texts):
        turns = sorted((t for t in sent if t.conversation == c), key=lambda t: t.turn)
        assert turns[0].prompt == f"User: {conv[0]}\nAssistant:"
        for prev, turn, text in zip(turns, turns[1:], conv[1:]):
            assert turn.prompt is not None and turn.messages == []
            assert turn.prompt.startswith(prev.prompt + prev.answer)  # the engine's cached prefix, verbatim
            assert turn.prompt == f"{prev.prompt}{prev.answer}\nUser: {text}\nAssistant:"


def test_chat_turns_unchanged(monkeypatch):
    seen: list[Turn] = []
    monkeypatch.setattr(vllm_arena_client, "send_turn", _fake_send(seen))
    sent = asyncio.run(converse("http://x/v1/chat/completions", [["a", "b"]], model="m", max_tokens=4, concurrency=2))
    assert [t.prompt for t in sent] == [None, None]
    assert sent[1].messages == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": " reply 0.0"},
        {"role": "user", "content": "b"},
    ]


def test_completion_stream_events_folded():
    turn = Turn(0, 0, [], "User: x\nAssistant:")
    take_event(turn, {"choices": [{"index": 0, "text": "", "finish_reason": None}]}, 1.0)
    assert turn.ttft is None  # an empty first chunk is not a token
    turn.sent = 0.5
    take_event(turn, {"choices": [{"index": 0, "text": " Hi", "finish_reason": None}]}, 1.0)
    take_event(turn, {"choices": [{"index": 0, "text": "!", "finish_reason": "length"}]}, 1.2)
    take_event(turn, {"choices": [], "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}}, 1.3)
    assert turn.ttft == 0.5 and turn.pieces == [" Hi", "!"] and turn.finish_reason == "length"
    assert (turn.prompt_tokens, turn.cached_tokens) == (9, 0)


def test_endpoint_option():
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--json", "x.json"]).endpoint == "chat"
    assert p.parse_args(["--json", "x.json", "--endpoint", "completions"]).endpoint == "completions"
    assert ENDPOINTS["completions"] == "/v1/completions"


def test_render_requests_counted_per_handler():
    from kvgate.tools.bench.vllm_arena_stats import render_requests

    page = (
        'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 8.0\n'
        'http_requests_total{handler="/v1/completions/render",method="POST",status="2xx"} 5.0\n'
        'http_requests_total{handler="/v1/chat/completions/render",method="POST",status="2xx"} 2.0\n'
    )
    assert render_requests([page, page]) == 14.0
    assert render_requests(["vllm:prompt_tokens_total 3.0\n"]) is None


def test_replay_sends_each_turn_where_the_replayed_run_placed_it(monkeypatch, tmp_path):
    """The ablation arm: no router; each turn to the engine kvgate precise chose for it, a turn it
    did not place to conversation % 2, counted."""
    from types import SimpleNamespace

    from kvgate.tools.bench.vllm_arena_bench import Bench
    from kvgate.tools.bench.vllm_arena_setup import placements

    urls: list[tuple[int, int, str]] = []

    async def send(client, url, turn, model, max_tokens, timeout):  # noqa: ARG001 - send_turn's signature
        urls.append((turn.conversation, turn.turn, url))
        turn.ttft, turn.answer = 0.01, "ok"

    monkeypatch.setattr(vllm_arena_client, "send_turn", send)
    records = [{"c": 0, "t": 0, "replica": "v1"}, {"c": 0, "t": 1, "replica": "v0"}, {"c": 1, "t": 0}]
    bench = Bench(argparse.Namespace(endpoint="chat"), tmp_path)
    bench.servers = [SimpleNamespace(port=1000), SimpleNamespace(port=1001)]
    warm, place, unplaced = bench.replay(placements(records))
    assert warm == "http://127.0.0.1:1000/v1/chat/completions"
    sent = asyncio.run(converse("unused", [["a", "b"], ["c"]], model="m", max_tokens=4, concurrency=2, place=place))
    where = {(c, t): u for c, t, u in urls}
    assert where[(0, 0)] == "http://127.0.0.1:1001/v1/chat/completions"
    assert where[(0, 1)] == "http://127.0.0.1:1000/v1/chat/completions"
    assert where[(1, 0)] == "http://127.0.0.1:1001/v1/chat/completions"  # not placed: conversation 1 % 2
    assert {(t.conversation, t.turn): t.replica for t in sent} == {(0, 0): "v1", (0, 1): "v0", (1, 0): "v1"}
    assert len(unplaced) == 1
