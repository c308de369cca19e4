"""The engines behind `kvgate bench governance`'s erase and invalidate parts.

- `VllmEngines`: two real vLLM servers (the CPU build, SmolLM2, one core each), each with kvgate's
  KV connector over one shared disk tier and one shared Redis tier, both encrypted under the
  master key the bench made (`encryption_key_env`). Their KV events go to an ipc:// socket that
  vLLM binds, so both of the bench's proxies can follow them in precise mode. "Another revision"
  is the same weights served from another directory (a directory of links to the model's files):
  vLLM reports that path as the model's `root`, which is what kvgate tags answers with, and the
  connector's key namespace names the directory, so the new engine loads none of the old KV.
- `FakeEngines`: two small vLLM-shaped servers in this process, for a quick run without vLLM
  (tests): `/version`, `/v1/models` with a `root`, and a deterministic answer that repeats the
  question. Each keeps a prefix cache of its own keyed by the request's `cache_salt` and first
  message, so `usage.prompt_tokens_details.cached_tokens` tells a reused prefix from a new one as
  vLLM's does. They have no KV tiers: the figures that need one are reported as null.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request

KV_PREFIX = "kvgate-kv"  # the connector's Redis key prefix, apart from the response store's
KV_DISK_MB = 2048  # the disk tier's budget: a reader opening it must pass the same (diskcache keeps the last)
LOADED = (
    "vllm:kvgate_loaded_chunks_total",
    "vllm:kvgate_loads_total",
    "vllm:kvgate_load_errors_total",
    "vllm:kvgate_decrypt_failures_total",
)


def revision_dir(model: Path, work: Path, label: str) -> Path:
    """A directory named after `label` whose files link to `model`'s: the same weights under
    another path, i.e. another `root` in vLLM's /v1/models."""
    target = work / "models" / f"{model.name}-{label}"
    target.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        link = target / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
    return target


class VllmEngines:
    kind = "vllm"

    def __init__(
        self,
        work: Path,
        redis_url: str,
        master_env: str,
        master_hex: str,
        progress: Callable[[str], None],
        kv_cache_gib: int = 1,
    ) -> None:
        from kvgate.engines.vllm.launch import VllmServer, default_model_dir, tier_settings, vllm_available, vllm_python

        if not vllm_available():
            raise RuntimeError(f"vLLM's environment is missing ({vllm_python()}): run `make install`")
        self.model = default_model_dir()
        if not (self.model / "config.json").exists():
            raise RuntimeError(f"no SmolLM2 model dir at {self.model}: run `kvgate prepare`")
        self.kv_disk = work / "kv-disk"
        self.kv_redis = redis_url
        settings = tier_settings(
            str(self.kv_disk), redis_url, memory_mb=64, disk_mb=KV_DISK_MB, encryption_key_env=master_env
        )
        settings["tiers"]["remote"]["key_prefix"] = KV_PREFIX  # type: ignore[index]
        # unix socket paths are short (about 100 bytes): their own directory under /tmp
        self._ipc = Path(tempfile.mkdtemp(prefix="kvg-ev-"))
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cores = max(1, os.cpu_count() or 1)
        self.servers = [
            VllmServer(
                str(self.model),
                core=i % cores,
                kv_cache_gib=kv_cache_gib,
                log_path=logs / f"vllm-{i}.log",
                kv_connector=settings,
                extra_env={master_env: master_hex},
                events_endpoint=f"ipc://{self._ipc}/e{i}",
            )
            for i in range(2)
        ]
        self.work = work
        progress("governance: starting two vLLM servers (KV connector: disk + Redis tiers, encrypted)")
        t0 = time.perf_counter()
        try:
            for s in self.servers:
                s.start()
            for s in self.servers:
                s.wait_ready(300)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0

    @property
    def api_bases(self) -> list[str]:
        return [s.api_base for s in self.servers]

    @property
    def events(self) -> list[str | None]:
        return [s.events for s in self.servers]

    def roots(self) -> list[str]:
        return [s.model for s in self.servers]

    def counters(self) -> dict[str, float] | None:
        """The connector's load counters, summed over both engines (vLLM's /metrics)."""
        from kvgate.tools.bench.vllm_kv_phase import connector_counters

        total = {name: 0.0 for name in LOADED}
        for base in self.api_bases:
            for name, value in connector_counters(base).items():
                if name in total:
                    total[name] += value
        return total

    def restart(self, i: int, label: str) -> float:
        """Engine `i` stopped and started again from another directory; seconds until it serves."""
        server = self.servers[i]
        server.stop()
        server.model = str(revision_dir(self.model, self.work, label))
        t0 = time.perf_counter()
        server.start().wait_ready(300)
        return time.perf_counter() - t0

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        shutil.rmtree(self._ipc, ignore_errors=True)


def fake_vllm_app(state: "FakeEngine") -> Any:
    """A vLLM-shaped OpenAI server: non-streamed chat only (what the bench sends)."""
    app = FastAPI()

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": "0.32.0"}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "smollm2", "object": "model", "root": state.root}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        messages = body.get("messages") or [{}]
        first = str(messages[0].get("content", ""))
        question = str(messages[-1].get("content", ""))
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        key = (body.get("cache_salt"), first)
        cached = len(first.split()) if key in state.seen else 0
        state.seen.add(key)
        answer = f"Answer: {question}"
        return {
            "id": f"chatcmpl-{len(state.seen)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "smollm2"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(answer.split()),
                "total_tokens": prompt_tokens + len(answer.split()),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    return app


class FakeEngine:
    def __init__(self, root: str) -> None:
        from kvgate.tools.bench.procs import free_port

        self.root = root
        self.seen: set[tuple[Any, str]] = set()
        self.port = free_port()
        self.server: Any = None
        self.start()

    def start(self) -> None:
        from kvgate.tools.bench.procs import ServerThread

        self.server = ServerThread(fake_vllm_app(self), port=self.port).start()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class FakeEngines:
    kind = "fake"
    kv_disk: Path | None = None
    kv_redis: str | None = None
    start_s = 0.0

    def __init__(self, root: str = "/models/smollm2-135m") -> None:
        self.base_root = root
        self.servers = [FakeEngine(root) for _ in range(2)]

    @property
    def api_bases(self) -> list[str]:
        return [s.api_base for s in self.servers]

    @property
    def events(self) -> list[str | None]:
        return [None for _ in self.servers]

    def roots(self) -> list[str]:
        return [s.root for s in self.servers]

    def counters(self) -> dict[str, float] | None:
        return None

    def restart(self, i: int, label: str) -> float:
        """Stopped, its prefix cache lost, and started on the same port under another root."""
        engine = self.servers[i]
        engine.stop()
        engine.root, engine.seen = f"{self.base_root}-{label}", set()
        t0 = time.perf_counter()
        engine.start()
        return time.perf_counter() - t0

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
