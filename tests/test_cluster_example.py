"""examples/cluster_demo.py against real processes: two `kvgate serve` on examples/cluster_config.yaml
(pointed at a throwaway Redis and the test's fake backend), as `make run-cluster` starts them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.redis_proc import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_demo_hits_on_the_second_proxy(backend, redis_server: RedisServer, tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "examples" / "cluster_config.yaml").read_text())
    config["store"]["url"] = redis_server.url
    config["routes"][0]["backend"]["api_base"] = backend.api_base
    config["cache_dir"] = str(tmp_path / "cache")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"PYTHONPATH": str(ROOT)}
    ports = [free_port(), free_port()]
    procs = [
        Proc(f"proxy-{p}", kvgate_argv("serve", "--config", str(path), "--port", str(p)), tmp_path, env) for p in ports
    ]
    try:
        for proc, port in zip(procs, ports):
            proc.wait_http(f"http://127.0.0.1:{port}/health", timeout=120)
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "cluster_demo.py"), *[f"http://127.0.0.1:{p}" for p in ports]],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        tiers = [line.split()[1] for line in out.stdout.splitlines()]
        assert tiers == ["miss", "exact", "semantic"]
    finally:
        for proc in procs:
            proc.stop()


def test_unreachable_redis_stops_serve_with_one_line(tmp_path: Path, capsys) -> None:
    from kvgate.middleware.cli import main

    config = yaml.safe_load((ROOT / "examples" / "cluster_config.yaml").read_text())
    config["store"]["url"] = f"redis://127.0.0.1:{free_port()}/0"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["serve", "--config", str(path)]) == 2  # before any server starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvgate: store.url: Redis at redis://127.0.0.1:")
