"""GET /ready: a load balancer's readiness probe. 503 with what each route waits for while precise
routing cannot yet hash prompts as the engines do (no engine described itself, the tokenizer still
loading); 200 once it can, or once it cannot without the operator (the error is logged and the
route routes by load). No key needed, like /health."""

from __future__ import annotations

from pathlib import Path

import httpx

from kvgate.index.kv.tokenizer import smollm2_tokenizer_dir
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import ReplicaConfig, parse_config
from kvgate.middleware.engines.base import EngineInfo
from kvgate.middleware.routing.router import Router
from kvgate.middleware.routing_config import PrefixConfig, RoutingConfig
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread, free_port
from tests.conftest import wait_until


def _precise_router() -> Router:
    replicas = [
        ReplicaConfig(name="r0", api_base="http://127.0.0.1:9/v1"),
        ReplicaConfig(name="r1", api_base="http://127.0.0.1:9/v1"),
    ]
    return Router(replicas, RoutingConfig(prefix=PrefixConfig(mode="precise")))


def test_a_precise_route_is_ready_once_an_engine_gave_tokenizer_and_block_size() -> None:
    router = _precise_router()
    try:
        assert "waiting for an engine" in (router.readiness() or "")
        router.precise.engine_found(
            "r0", EngineInfo(kind="vllm", block_size=16, model_root=str(smollm2_tokenizer_dir()))
        )
        # loading runs on a thread: not ready until the hasher is in use, then ready with r1 still silent
        assert wait_until(lambda: router.readiness() is None, 60.0)
        assert router.hasher is not None and router.hasher.block_size == 16
    finally:
        router.close()


def test_a_precise_route_that_cannot_get_a_tokenizer_is_ready_and_routes_by_load() -> None:
    router = _precise_router()
    try:
        router.precise.engine_found("r0", EngineInfo(kind="generic"))
        assert router.readiness() is None and router.precise.tokenizer_error is not None
        assert router.hasher is None
    finally:
        router.close()


def test_an_approximate_route_is_ready_at_once() -> None:
    replicas = [ReplicaConfig(name="r0", api_base="http://127.0.0.1:9/v1")]
    router = Router(
        replicas, RoutingConfig(prefix=PrefixConfig(mode="approximate", tokenizer="codepoints", block_size=16))
    )
    try:
        assert router.readiness() is None
    finally:
        router.close()


def test_ready_endpoint_says_what_a_route_waits_for_without_a_key(tmp_path: Path) -> None:
    dead = free_port()  # no engine answers there: the precise route never learns its tokenizer
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "cache"),
            "auth": {"keys": ["k"]},
            "routes": [
                {
                    "name": "vllm",
                    "model": "m*",
                    "backend": {"model": "openai/m", "api_key": "none"},
                    "semantic": {"enabled": False},
                    "replicas": [
                        {
                            "name": "r0",
                            "api_base": f"http://127.0.0.1:{dead}/v1",
                            "events": f"tcp://127.0.0.1:{free_port()}",
                        }
                    ],
                    "routing": {"prefix": {"mode": "precise"}},
                }
            ],
        }
    )
    pipeline = build_pipeline(config)
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        resp = httpx.get(f"{server.url}/ready", timeout=10)
        assert resp.status_code == 503
        body = resp.json()
        assert body["status"] == "starting" and "waiting for an engine" in body["waiting"]["vllm"]
        pipeline.routers["vllm"].precise.engine_found("r0", EngineInfo(kind="generic"))
        resp = httpx.get(f"{server.url}/ready", timeout=10)
        assert resp.status_code == 200 and resp.json() == {"status": "ready"}
    finally:
        server.stop()
        pipeline.close()
