"""The processes of `kvgate bench replica-faults`: N `kvgate sim-replica` that all answer with one
text, and one `kvgate serve` whose only route spreads misses over them; a replica can be SIGKILLed
and restarted on its port, or left unstarted (`absent`: nothing listens on its port)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv

SIM_NAME = "sim"  # one answer text for every replica


@dataclass
class Cluster:
    """N sim replicas and one proxy as child processes; stop() ends them all."""

    work: Path
    replicas: int = 4
    overhead_ms: dict[int, float] = field(default_factory=dict)
    timeout_s: float = 5.0
    policy: str = "cache_aware"
    decode_tps: float = 60.0
    absent: frozenset[int] = frozenset()  # replicas in the config never started
    procs: dict[str, Proc] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    proxy_port: int = 0

    def start(self) -> "Cluster":
        self.ports = [free_port() for _ in range(self.replicas)]
        for i in range(self.replicas):
            if i not in self.absent:
                self.start_replica(i)
        self.proxy_port = free_port()
        config = {
            "cache_dir": str(self.work / "cache"),
            "routes": [
                {
                    "name": "sim",
                    "model": "sim*",
                    "backend": {"model": "openai/sim", "api_key": "none", "timeout": self.timeout_s},
                    "semantic": {"enabled": False},
                    "replicas": [
                        {"name": f"r{i}", "api_base": f"http://127.0.0.1:{p}/v1"} for i, p in enumerate(self.ports)
                    ],
                    "routing": {
                        "policy": self.policy,
                        "prefix": {"tokenizer": "text"},
                        "max_attempts": 3,
                        "down_for_s": 2.0,
                        "probe_interval_s": 0.5,
                    },
                }
            ],
        }
        cfg = self.work / "proxy.yaml"
        cfg.write_text(yaml.safe_dump(config))
        proxy = Proc("proxy", kvgate_argv("serve", "--config", str(cfg), "--port", str(self.proxy_port)), self.work)
        self.procs["proxy"] = proxy
        proxy.wait_http(f"{self.url}/health", timeout=120)
        for i in range(self.replicas):
            if i not in self.absent:
                self.wait_replica(i)
        return self

    @property
    def proxy_pgid(self) -> int:
        return self.procs["proxy"].proc.pid  # a session of its own: its pid is its group's id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def start_replica(self, i: int) -> None:
        argv = kvgate_argv(
            "sim-replica",
            "--port",
            str(self.ports[i]),
            "--name",
            SIM_NAME,
            "--capacity-tokens",
            "2000000",
            "--prefill-tps",
            "2000000",
            "--decode-tps",
            str(self.decode_tps),
            "--overhead-ms",
            str(self.overhead_ms.get(i, 2.0)),
        )
        self.procs[f"r{i}"] = Proc(f"r{i}", argv, self.work)

    def wait_replica(self, i: int) -> None:
        self.procs[f"r{i}"].wait_http(f"http://127.0.0.1:{self.ports[i]}/v1/models", timeout=120)

    def kill(self, i: int) -> None:
        proc = self.procs[f"r{i}"]
        os.killpg(proc.proc.pid, signal.SIGKILL)
        proc.proc.wait()
        proc.stop()  # closes its log

    def restart(self, i: int) -> None:
        self.start_replica(i)
        self.wait_replica(i)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()
