"""The LiteLLM Router plugin: a real litellm.Router over two local servers."""

from __future__ import annotations

import asyncio

import litellm
import pytest

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.config import PrefixConfig, RoutingConfig
from kvgate.middleware.sdk.litellm_plugin import PrefixRoutingPlugin
from kvgate.tools.bench.procs import ServerThread


@pytest.fixture
def two_servers():
    servers = [ServerThread(create_fake_app(Calls())).start() for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


def model_list(servers) -> list[dict]:
    return [
        {
            "model_name": "smol",
            "model_info": {"id": f"replica-{i}"},
            "litellm_params": {"model": "openai/smol", "api_base": f"{s.url}/v1", "api_key": "none"},
        }
        for i, s in enumerate(servers)
    ]


@pytest.fixture
def routed(two_servers):
    """(a litellm.Router over the two servers, the plugin it calls), the plugin installed for the test."""
    plugin = PrefixRoutingPlugin(RoutingConfig(policy="cache_aware", prefix=PrefixConfig(tokenizer="smollm2")))
    saved = litellm.callbacks
    litellm.callbacks = [plugin]
    yield litellm.Router(model_list=model_list(two_servers)), plugin
    litellm.callbacks = saved


async def test_router_sticks_conversations_to_their_prefix(routed):
    router, plugin = routed

    async def conversation(topic: str) -> list[str]:
        messages = [{"role": "user", "content": f"Tell me about {topic}. " * 40 + " [[sleep=0.2]]"}]
        served = []
        for turn in range(3):
            resp = await router.acompletion(model="smol", messages=messages)
            served.append(resp._hidden_params["model_id"])
            messages += [
                {"role": "assistant", "content": resp.choices[0].message.content},
                {"role": "user", "content": f"More please, {turn}. [[sleep=0.2]]"},
            ]
        return served

    results = await asyncio.gather(*(conversation(t) for t in ["volcanoes", "glaciers", "deserts", "rainforests"]))
    stats = next(iter(plugin._routers.values())).stats
    for _ in range(100):  # LiteLLM runs success loggers as background tasks
        if all(v["in_flight"] == 0 for v in stats().values()):
            break
        await asyncio.sleep(0.02)
    assert plugin.decisions == 12
    for served in results:
        assert len(set(served)) == 1, results
    assert {s[0] for s in results} == {"replica-0", "replica-1"}
    assert all(v["in_flight"] == 0 and v["blocks"] > 0 for v in stats().values())


async def test_router_routes_text_completions_by_their_prompt(routed):
    """litellm.Router.atext_completion: LiteLLM hands the plugin the prompt as one user message
    (nothing tells it apart from a chat request), so the plugin hashes that; a prompt that extends
    an earlier one still shares its leading blocks and goes where that one went."""
    router, plugin = routed

    async def conversation(topic: str) -> list[str]:
        prompt, served = f"Notes on {topic}. " * 40, []
        for turn in range(3):
            resp = await router.atext_completion(model="smol", prompt=prompt)
            served.append(resp._hidden_params["model_id"])
            prompt += resp.choices[0].text + f" More, {turn}."
            await asyncio.sleep(0.05)
        return served

    results = await asyncio.gather(*(conversation(t) for t in ["volcanoes", "glaciers", "deserts", "rainforests"]))
    assert plugin.decisions == 12
    for served in results:
        assert len(set(served)) == 1, results
    assert {s[0] for s in results} == {"replica-0", "replica-1"}
