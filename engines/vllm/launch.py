"""Start a real vLLM OpenAI server (the CPU build in its own virtual environment) on loopback.

One place knows the flags kvgate needs from vLLM, so tests, benchmarks, `make run-vllm` and the
docs agree: prefix caching on, KV events published over ZMQ (plus the replay socket that lets a
subscriber catch up after a gap), `cached_tokens` in every response's usage. The engine binds
127.0.0.1 only (HTTP and events). vLLM lives in `.venv-vllm` (`make install`), apart from kvgate's
own environment, because its pins (transformers, openai, ...) differ from ours.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.engines.vllm.host_dtype import host_dtype
from kvgate.index.storage.env import model_cache_dir

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON_ENV = "KVGATE_VLLM_PYTHON"  # which python runs vLLM (default: .venv-vllm/bin/python)


def vllm_python() -> Path:
    """The interpreter of vLLM's environment."""
    return Path(os.environ.get(VLLM_PYTHON_ENV) or ROOT / ".venv-vllm" / "bin" / "python")


def vllm_available() -> bool:
    return vllm_python().exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONNECTOR_MODULE = "kvgate.engines.vllm.kv_connector.connector"


def connector_config(extra: dict[str, object]) -> dict[str, object]:
    """vLLM's `--kv-transfer-config` for kvgate's KV connector with `extra` as its
    kv_connector_extra_config (engines/vllm/kv_connector/settings.py). A chunk that cannot be loaded
    is recomputed ("recompute"), never an error for the request."""
    return {
        "kv_connector": "KvgateConnector",
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def tier_settings(
    disk: str | None = None,
    remote: str | None = None,
    *,
    codec: str = "int8",
    memory_mb: int = 256,
    disk_mb: int = 4096,
    encryption_key_env: str | None = None,
) -> dict[str, object]:
    """The connector's settings for a shared disk directory and/or a Redis URL; with
    `encryption_key_env` (the NAME of the engine's variable holding the master key) their chunks
    are encrypted (docs/encryption.md)."""
    tiers: dict[str, object] = {"memory": {"capacity_mb": memory_mb}} if memory_mb else {}
    if disk:
        tiers["disk"] = {"path": str(disk), "capacity_mb": disk_mb}
    if remote:
        tiers["remote"] = {"url": remote}
    settings: dict[str, object] = {"tiers": tiers, "codec": codec}
    if encryption_key_env:
        settings["encryption_key_env"] = encryption_key_env
    return settings


def events_config(
    port: int, replay_port: int | None = None, host: str = "127.0.0.1", endpoint: str | None = None
) -> dict[str, object]:
    """vLLM's `--kv-events-config`: ZMQ PUB on `port` (or on `endpoint`, e.g. an ipc:// path vLLM
    binds), optionally the replay ROUTER on `replay_port`."""
    cfg: dict[str, object] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint or f"tcp://{host}:{port}",
        "topic": "kv",
    }
    if replay_port is not None:
        cfg["replay_endpoint"] = f"tcp://{host}:{replay_port}"
    return cfg


@dataclass
class VllmServer:
    """One `vllm.entrypoints.openai.api_server` child process.

    `core`: the CPU core its OpenMP threads are bound to (two servers on two cores: 0 and 1).
    `kv_cache_gib`: VLLM_CPU_KVCACHE_SPACE, the KV cache it allocates.
    `extra_args`: more vLLM flags (e.g. `--kv-transfer-config ...`).
    `extra_env`: more environment variables for it (e.g. VLLM_SERVER_DEV_MODE=1, which serves
    `POST /reset_prefix_cache`); named so because `env()` is the method that builds the whole environment.
    `kv_connector`: kvgate's KV connector settings (`tier_settings(...)`), or None for none.
    `dtype`: vLLM's `--dtype`; None: this host's (kvgate.engines.vllm.host_dtype: float32 where
    the CPU has no native bfloat16, else the engine's own choice).
    `events_endpoint`: where the events go instead of the loopback port: vLLM connects to a
    concrete tcp address (one subscriber binds it) but binds an `ipc://PATH`, which any number of
    proxies can then connect to (several proxies in precise mode on one engine).
    """

    model: str
    served_name: str = "smollm2"
    port: int = 0
    events_port: int = 0
    replay_port: int | None = 0
    core: int | None = None
    kv_cache_gib: int = 1  # whole GiB: vLLM reads the variable as an int
    max_model_len: int = 8192
    enforce_eager: bool = True
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    kv_connector: dict[str, object] | None = None
    events_endpoint: str | None = None
    dtype: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.events_port = self.events_port or free_port()
        if self.replay_port == 0:
            self.replay_port = free_port()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def events(self) -> str:
        return self.events_endpoint or f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay(self) -> str | None:
        return None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"

    def argv(self) -> list[str]:
        args = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--max-model-len",
            str(self.max_model_len),
            "--disable-uvicorn-access-log",
            "--kv-events-config",
            json.dumps(events_config(self.events_port, self.replay_port, endpoint=self.events_endpoint)),
        ]
        if self.enforce_eager:
            args.append("--enforce-eager")
        dtype = self.dtype or host_dtype()
        if dtype != "auto":
            args += ["--dtype", dtype]
        if self.kv_connector is not None:
            args += ["--kv-transfer-config", json.dumps(connector_config(self.kv_connector))]
        return args + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_LEVEL": env_level(),
        }
        if self.core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.core)
        env.pop("PYTHONHASHSEED", None)  # the engine's default: sha256 from its fixed seed
        env.update(self.extra_env)
        return env

    def start(self) -> "VllmServer":
        if not vllm_available():
            raise RuntimeError(f"vLLM's environment is missing ({vllm_python()}); run `make install`")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        # its own process group, so stop() ends the engine core process it forks too
        self.proc = subprocess.Popen(
            self.argv(), env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def probe(self) -> str | None:
        """None when the server lists its models, else what the look at `/v1/models` got."""
        try:
            with urllib.request.urlopen(f"{self.api_base}/models", timeout=2) as r:
                return None if r.status == 200 else f"HTTP {r.status}"
        except OSError as exc:  # refused, reset, timed out, or an HTTP error status
            return f"{type(exc).__name__}: {exc}"

    def wait_ready(self, timeout: float = 240.0) -> "VllmServer":
        deadline = time.monotonic() + timeout
        seen = "no look yet"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM on port {self.port} exited with {self.proc.returncode}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            answer = self.probe()
            if answer is None:
                return self
            seen = answer
            time.sleep(0.5)
        # what the last look got, and the log's last line: a server that logged its start-up yet
        # never answered here (another process on its port) reads differently from a slow one
        raise RuntimeError(
            f"vLLM on port {self.port} not ready within {timeout:.0f}s (the last look at /v1/models: {seen}"
            + (f"; its log ends: {_last_line(self.log_path)!r}, see {self.log_path})" if self.log_path else ")")
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (SIGKILL: a crash, as a fault test wants it)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def __enter__(self) -> "VllmServer":
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _last_line(path: Path) -> str:
    """The last non-empty line of a log ('' when there is none or it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def env_level() -> str:
    return os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")


def start_pair(
    model: str,
    *,
    served_name: str = "smollm2",
    ports: tuple[int, int] = (0, 0),
    events_ports: tuple[int, int] = (0, 0),
    log_dir: Path | None = None,
    timeout: float = 240.0,
    **options: object,
) -> list[VllmServer]:
    """Two servers, one per core, started together (start-up overlaps) and waited for. Ports left
    at 0 are picked free just before the start, so another process can take one first: a pair
    whose engine then failed on "Address already in use" is started again on fresh ports (twice
    at most)."""
    auto = all(p == 0 for p in (*ports, *events_ports))
    for attempt in range(3):
        servers, seen = [], []
        for i in range(2):
            log = None if log_dir is None else Path(log_dir) / f"vllm-{i}.log"
            seen.append(log.stat().st_size if log is not None and log.exists() else 0)  # the logs are appended to
            servers.append(
                VllmServer(
                    model,
                    served_name,
                    ports[i],
                    events_ports[i],
                    core=i % max(1, os.cpu_count() or 1),
                    log_path=log,
                    **options,
                ).start()
            )  # type: ignore[arg-type]
        try:
            for s in servers:
                s.wait_ready(timeout)
            return servers
        except Exception:
            for s in servers:
                s.stop()
            if not (auto and attempt < 2 and any(lost_a_port(s.log_path, n) for s, n in zip(servers, seen))):
                raise
    raise AssertionError("unreachable")


def lost_a_port(log_path: Path | None, since: int = 0) -> bool:
    """Whether this engine's log, from byte `since` on, says a port it was given was taken before
    it bound it."""
    if log_path is None or not Path(log_path).exists():
        return False
    with open(log_path, "rb") as f:
        f.seek(since)
        return b"Address already in use" in f.read()


def main(argv: list[str] | None = None) -> int:
    """`python -m kvgate.engines.vllm.launch --port P --events-port E [--core C] [--model DIR]`: one server
    in the foreground (what `make run-vllm` runs twice)."""
    import argparse

    parser = argparse.ArgumentParser(prog="kvgate.engines.vllm.launch", description=main.__doc__)
    parser.add_argument("--model", default=None, help="model dir (default: the SmolLM2 dir `kvgate prepare` wrote)")
    parser.add_argument("--served-model-name", default="smollm2")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events-port", type=int, required=True)
    parser.add_argument("--replay-port", type=int, default=None)
    parser.add_argument("--core", type=int, default=None)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument(
        "--kv-tier-dir",
        default=None,
        help="load kvgate's KV connector with this disk tier (servers naming one directory share it)",
    )
    parser.add_argument(
        "--kv-tier-redis",
        default=None,
        metavar="redis://HOST:PORT/DB",
        help="with the connector: a Redis tier as well (shared by every engine naming it)",
    )
    parser.add_argument(
        "--kv-codec",
        default="int8",
        choices=["raw", "int8", "int4"],
        help="how the connector stores KV chunks (default int8)",
    )
    parser.add_argument(
        "--kv-encryption-key-env",
        default=None,
        metavar="VARIABLE",
        help="with the connector: encrypt its chunks under the master key this environment variable holds (docs/encryption.md)",
    )
    args, extra = parser.parse_known_args(argv)
    model = args.model or str(default_model_dir())
    tiers = None
    if args.kv_tier_dir or args.kv_tier_redis:
        tiers = tier_settings(
            args.kv_tier_dir, args.kv_tier_redis, codec=args.kv_codec, encryption_key_env=args.kv_encryption_key_env
        )
    server = VllmServer(
        model,
        args.served_model_name,
        args.port,
        args.events_port,
        args.replay_port,
        core=args.core,
        kv_cache_gib=args.kv_cache_gib,
        extra_args=extra,
        kv_connector=tiers,
    )
    print("kvgate: starting vLLM:", " ".join(server.argv()), flush=True)
    os.execve(str(vllm_python()), server.argv(), server.env())


def default_model_dir() -> Path:
    """The SmolLM2-135M-Instruct dir `kvgate prepare` converted from the packaged GGUF (the
    replica's smollm2_model_dir, not imported: that module loads torch)."""
    return model_cache_dir() / "smollm2-135m"


if __name__ == "__main__":
    sys.exit(main())
