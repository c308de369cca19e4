"""`kvgate bench vllm-kv`'s own arithmetic: output agreement, logprob differences, a disk tier read
back, ExampleConnector's stored bytes (the vLLM phases themselves run in the bench, not here)."""

from __future__ import annotations

import json
import struct

import torch

from kvgate.index.kv.chunks import ChunkStore, DiskTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from kvgate.tools.bench.vllm_kv import compare
from kvgate.tools.bench.vllm_kv_client import Reply, first_message, max_logprob_diff, next_turn
from kvgate.tools.bench.vllm_kv_phase import PhaseResult
from kvgate.tools.bench.vllm_kv_read import example_bytes_per_token, read_back


def reply(text: str, top: dict[str, float] | None = None) -> Reply:
    return Reply(0.1, text, 100, 0, 4, 0.2, top or {})


def test_agreement_and_logprob_differences() -> None:
    cold = PhaseResult("cold", next_turn=[reply("a", {"x": -0.1, "y": -2.0}), reply("b", {"x": -1.0})])
    other = PhaseResult("k", next_turn=[reply("a", {"x": -0.3, "z": -5.0}), reply("c", {"q": -1.0})])
    out = compare(other, cold)
    assert out["identical"] == [True, False] and out["identical_fraction"] == 0.5
    assert abs(out["max_logprob_diff"] - 0.2) < 1e-9  # only tokens in both lists count
    assert max_logprob_diff({"a": -1.0}, {"b": -1.0}) is None


def test_prompts_are_long_distinct_and_extend_as_a_chat() -> None:
    a, b = first_message(0, 1800), first_message(1, 1800)
    assert a != b and len(a.split()) > 1000
    turn = next_turn(a, "ok", 0)
    assert turn[0]["content"] == a and turn[1] == {"role": "assistant", "content": "ok"} and len(turn) == 3


def test_read_back_counts_stored_bytes_and_tokens(tmp_path) -> None:
    store = ChunkStore([DiskTier(tmp_path / "kv", 1 << 30)], "ns", LayerCodec("int8"))
    rows = [torch.randn(1, 3, 128, 128, dtype=torch.bfloat16) for _ in range(4)]
    store.put_many([1, 2, 3], [rows, rows, rows])
    store.close()
    got = read_back(tmp_path / "kv")
    assert got["chunks"] == 3 and got["tokens"] == 3 * 128
    assert 0.5 < got["bytes_per_token"] / (4 * 3 * 128 * 2) < 0.56  # int8 with its scales, per token
    assert got["read_gbps"] > 0 and got["raw_read_bytes"] >= got["stored_bytes"]


def test_example_connector_bytes_from_its_files(tmp_path) -> None:
    for folder, tokens in (("p1", 256), ("p2", 128)):
        d = tmp_path / folder
        d.mkdir()
        header = json.dumps({"kv_cache": {"dtype": "BF16", "shape": [tokens, 3, 128], "data_offsets": [0, 0]}}).encode()
        for layer in range(2):
            (d / f"l{layer}.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * tokens * 768)
    per_token = example_bytes_per_token(tmp_path)
    assert per_token is not None and 2 * 768 < per_token < 2 * 768 + 5
    assert example_bytes_per_token(tmp_path / "missing") is None


def test_p99_is_nearest_rank() -> None:
    from kvgate.tools.bench.vllm_kv_itl import p99

    assert p99([]) is None and p99([0.5]) == 0.5
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([float(i) for i in range(1, 201)]) == 198.0
