"""The targets of `kvgate bench throughput`, started and made ready: the configs of `kvgate serve`
and LiteLLM's proxy, the command line of each target (sglang-router's too), and the wait until a
target answers a chat request. The model name and LiteLLM's master key live here because the
configs and the load client both use them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv, sglang_router_bin

MODEL = "bench-1"
MASTER_KEY = "sk-kvgate-bench-0123456789abcdef0123456789abcdef"  # LiteLLM's proxy refuses to start without one
WORKERS = {"kvgate_relay_w2": 2}  # kvgate targets served by `kvgate serve --workers N`


def kvgate_config(work: Path, backend: str, forward: str, tokenizer: str, name: str) -> Path:
    """`forward` relay | litellm: the backend as the route's one replica, routed; backend: as
    the route's one `backend` (no replicas, no routing), relayed; router: relayed and routed with
    no response cache (`exact: false`, semantic off), the job sglang-router does."""
    route: dict[str, Any] = {
        "name": "bench",
        "model": "bench-*",
        "scope": "shared",
        "backend": {"model": "openai/fake", "api_key": "none", "timeout": 60},
        "semantic": {"enabled": False},
    }
    if forward == "router":
        route["exact"], forward = False, "relay"
    if forward == "backend":
        route["backend"]["api_base"] = f"{backend}/v1"
    else:
        route["replicas"] = [{"name": "r0", "api_base": f"{backend}/v1"}]
        route["routing"] = {"policy": "cache_aware", "prefix": {"tokenizer": tokenizer}, "forward": forward}
    config = {"cache_dir": str(work / f"cache-{name}"), "routes": [route]}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def litellm_config(work: Path, backend: str) -> Path:
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": "openai/fake", "api_base": f"{backend}/v1", "api_key": "none"},
            }
        ],
        "litellm_settings": {"cache": True, "cache_params": {"type": "local"}},
        "general_settings": {"master_key": MASTER_KEY},
    }
    path = work / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    # like `kvgate serve` by default: no access log line per request
    (work / "litellm-log.json").write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "loggers": {"uvicorn.access": {"level": "WARNING"}, "uvicorn.error": {"level": "WARNING"}},
            }
        )
    )
    return path


def litellm_bin() -> str | None:
    candidate = Path(sys.executable).with_name("litellm")
    return str(candidate) if candidate.exists() else None


def start(target: str, work: Path, backend: str, args: argparse.Namespace) -> tuple[Proc | None, str] | str:
    """(process, base url) of a target, or why it cannot run here."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if target == "direct":
        return None, backend
    if target.startswith("kvgate"):
        forward = target.split("_")[1]
        config = kvgate_config(work, backend, forward, args.tokenizer, target)
        workers = ["--workers", str(WORKERS[target])] if target in WORKERS else []
        return Proc(
            target,
            kvgate_argv("serve", "--config", str(config), "--port", str(port), "--log-level", "warning", *workers),
            work,
        ), url
    if target == "litellm_proxy":
        binary = litellm_bin()
        if binary is None:
            return "litellm's proxy is not installed (make install: litellm[proxy] in the dev extras)"
        config = litellm_config(work, backend)
        return Proc(
            target,
            [
                binary,
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--keepalive_timeout",
                "75",
                "--log_config",
                str(work / "litellm-log.json"),
            ],
            work,
            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
        ), url
    binary = sglang_router_bin()
    if binary is None:
        return "sglang-router is not installed"
    return Proc(
        target,
        [
            binary,
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            backend,
            "--policy",
            "cache_aware",
            "--log-level",
            "warn",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
        ],
        work,
    ), url


def wait_ready(proc: Proc | None, url: str, timeout: float = 180.0) -> None:
    """Until a chat request goes through (routers register their workers after they listen)."""
    deadline = time.time() + timeout
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ready?"}]}
    while time.time() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.proc.returncode}:\n{proc.tail()}")
        try:
            if (
                httpx.post(
                    f"{url}/v1/chat/completions",
                    json=body,
                    timeout=5,
                    headers={"authorization": f"Bearer {MASTER_KEY}"},
                ).status_code
                == 200
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{proc.name if proc else url} not ready within {timeout:.0f}s")
