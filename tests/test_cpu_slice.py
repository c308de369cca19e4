"""A short CPU slice for the proxy's threads (middleware/server/cpu_slice.py): set, read back,
inherited by later threads and across an exec, applied by `kvgate serve` from
`server.cpu_slice_us`, and given to every router alike by the benches' launcher."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.server.cpu_slice import cpu_slice_us, set_cpu_slice
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.sliced import refused


def _in_thread(fn: Any) -> Any:
    """fn() on a thread of its own (a slice set there stays there), its result or its exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:  # handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _supported() -> bool:
    return _in_thread(lambda: set_cpu_slice(500)) is None


def test_a_slice_is_set_read_back_and_inherited_by_later_threads() -> None:
    def sliced() -> tuple[str | None, int | None, int | None, int | None]:
        before = cpu_slice_us()
        reason = set_cpu_slice(250)
        return reason, before, cpu_slice_us(), _in_thread(cpu_slice_us)

    mine = cpu_slice_us()
    reason, before, after, child = _in_thread(sliced)
    assert before == mine and mine != 250  # a new thread has the kernel's default, as this one
    if reason is None:
        assert after == 250 and child == 250
    else:  # a kernel without custom slices says so and changes nothing
        assert "slice" in reason and after == before
    assert cpu_slice_us() == mine  # the test's own thread was not touched
    for bad in (99, 100_001):
        with pytest.raises(ValueError, match="100-100000"):
            set_cpu_slice(bad)


def test_the_config_field_is_bounded_and_named() -> None:
    route = {"name": "r", "model": "m*", "backend": {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1"}}
    assert parse_config({"routes": [route]}).server.cpu_slice_us is None
    assert parse_config({"routes": [route], "server": {"cpu_slice_us": 300}}).server.cpu_slice_us == 300
    with pytest.raises(ConfigError, match="cpu_slice_us"):
        parse_config({"routes": [route], "server": {"cpu_slice_us": 20}})


def test_serve_gives_every_thread_the_configured_slice(tmp_path: Path) -> None:
    port = free_port()
    config = {
        "cache_dir": str(tmp_path / "cache"),
        "server": {"port": port, "cpu_slice_us": 300},
        "routes": [
            {
                "name": "r",
                "model": "m*",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/x", "api_key": "none", "api_base": f"http://127.0.0.1:{free_port()}/v1"},
            }
        ],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proxy = Proc("proxy", kvgate_argv("serve", "--config", str(tmp_path / "config.yaml")), tmp_path)
    try:
        proxy.wait_http(f"http://127.0.0.1:{port}/health")
        tids = [int(t) for t in os.listdir(f"/proc/{proxy.proc.pid}/task")]
        slices = {cpu_slice_us(t) for t in tids}
        if _supported():
            assert len(tids) > 1 and slices == {300}
        else:
            assert 300 not in slices and "server.cpu_slice_us: 300 µs not applied" in proxy.tail(50)
    finally:
        proxy.stop()


def test_the_benches_launcher_runs_a_command_with_the_slice_or_refuses() -> None:
    probe = "from kvgate.middleware.server.cpu_slice import cpu_slice_us; print(cpu_slice_us())"
    done = subprocess.run(
        [sys.executable, "-m", "kvgate.tools.bench.sliced", "400", "--", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
    )
    if _supported():
        assert done.returncode == 0 and done.stdout.strip() == "400" and refused(400) is None
    else:
        assert done.returncode == 2 and "slice" in done.stderr and refused(400)
    assert "100-100000" in (refused(50) or "")
