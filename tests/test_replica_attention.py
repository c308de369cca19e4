"""The replica's grouped-query attention (kvgate.engines.replica.attention) and its in-place growing KV
cache (kvgate.engines.replica.kv_cache) compute what transformers' own "sdpa" attention and DynamicCache
compute, on the real SmolLM2-135M, over the shapes a replica uses: a cold prefill in slices, a
follow-up's few tokens over a loaded prefix, then decoding."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvgate.engines.replica.attention import NAME
from kvgate.engines.replica.kv_cache import GrowingLayer, growing_cache
from kvgate.engines.replica.model import load_model

SLICES = [(0, 256), (256, 600), (600, 622), (622, 623), (623, 624)]


@pytest.fixture(scope="module")
def model() -> Any:
    return load_model("smollm2")[0]


def _run(model: Any, ids: torch.Tensor, cache: Any) -> list[torch.Tensor]:
    with torch.no_grad():
        return [
            model(input_ids=ids[:, a:b], past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            for a, b in SLICES
        ]


def test_the_replica_model_uses_grouped_query_attention_and_matches_transformers_sdpa(model: Any) -> None:
    assert model.config._attn_implementation == NAME
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA is what is being tested
    ids = torch.randint(100, 40000, (1, SLICES[-1][1]), generator=torch.Generator().manual_seed(0))
    ours = _run(model, ids, DynamicCache(config=model.config))
    model.set_attn_implementation("sdpa")
    try:
        theirs = _run(model, ids, DynamicCache(config=model.config))
    finally:
        model.set_attn_implementation(NAME)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert int(a.argmax()) == int(b.argmax())


def test_a_growing_cache_holds_and_computes_what_a_dynamic_cache_does(model: Any) -> None:
    ids = torch.randint(100, 40000, (1, SLICES[-1][1]), generator=torch.Generator().manual_seed(1))
    stock = DynamicCache(config=model.config)
    grown = growing_cache(model.config, reserve=8)  # less room than the run needs: it must grow
    assert all(isinstance(layer, GrowingLayer) for layer in grown.layers)
    assert [torch.equal(a, b) for a, b in zip(_run(model, ids, stock), _run(model, ids, grown))] == [True] * len(SLICES)
    for s, g in zip(stock.layers, grown.layers):
        assert torch.equal(s.keys, g.keys) and torch.equal(s.values, g.values)
    assert grown.get_seq_length() == SLICES[-1][1]


def test_a_filled_cache_continues_like_one_that_computed_its_prefix(model: Any) -> None:
    ids = torch.randint(100, 40000, (1, 700), generator=torch.Generator().manual_seed(2))
    cold = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :600], past_key_values=cold, use_cache=True)
        want = model(input_ids=ids[:, 600:640], past_key_values=cold, use_cache=True, logits_to_keep=1).logits
    # the loaded prefix in two parts (as chunks, then a tail), views into a bigger tensor as tails are
    parts = [
        [(layer.keys[:, :, :512], layer.values[:, :, :512]) for layer in cold.layers],
        [(layer.keys[:, :, 512:600], layer.values[:, :, 512:600]) for layer in cold.layers],
    ]
    warm = growing_cache(model.config, reserve=40, parts=parts)
    assert warm.get_seq_length() == 600
    with torch.no_grad():
        got = model(input_ids=ids[:, 600:640], past_key_values=warm, use_cache=True, logits_to_keep=1).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(warm.layers[0].keys[:, :, :600], cold.layers[0].keys[:, :, :600])


def test_a_cropped_layer_is_rehomed_not_written_through_a_stale_buffer() -> None:
    layer = GrowingLayer(reserve=4)
    k = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(1, 2, 6, 3)
    layer.update(k[:, :, :4], k[:, :, :4] + 1)
    layer.crop(-2)  # keep 2
    assert layer.get_seq_length() == 2
    keys, values = layer.update(k[:, :, 4:6], k[:, :, 4:6] + 1)
    assert torch.equal(keys, torch.cat([k[:, :, :2], k[:, :, 4:6]], dim=2))
    assert torch.equal(values, keys + 1)
    layer.keys = k[:, :, :3].clone()  # replaced from outside: the next update must start from it
    layer.values = layer.keys + 1
    keys, _ = layer.update(k[:, :, 5:6], k[:, :, 5:6] + 1)
    assert torch.equal(keys, torch.cat([k[:, :, :3], k[:, :, 5:6]], dim=2))


def test_growing_cache_keeps_other_layer_kinds_to_transformers() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=100,
    )
    assert all(isinstance(layer, GrowingLayer) for layer in growing_cache(config, 4).layers)
    config.sliding_window, config.layer_types = 8, ["sliding_attention", "full_attention"]
    kinds = [type(layer) for layer in growing_cache(config, 4).layers]
    assert GrowingLayer not in kinds and DynamicLayer in kinds
