"""Config validation messages and the `kvgate` command line, as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest

from kvgate.middleware.config import load_config, parse_config
from kvgate.middleware.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
KVGATE = [sys.executable, "-m", "kvgate.middleware.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_example_config_is_valid():
    config = load_config(ROOT / "examples" / "proxy_config.yaml")
    assert config.match("demo-7").name == "chat" and config.match("gpt-4") is None
    assert config.routes[0].semantic.threshold == 0.9 and config.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"routes": []}, "routes"),
        ({}, "routes"),
        ({"routes": [{"name": "a", "model": "x", "semantic": {"threshold": 1.5}}]}, "routes.0.semantic.threshold"),
        ({"routes": [{"name": "a", "model": "x", "semantic": {"scope": "global"}}]}, "routes.0.scope"),
        ({"routes": [{"name": "a", "model": "x", "backend": {"api_bsae": "http://x"}}]}, "routes.0.backend.api_bsae"),
        ({"routes": [{"name": "a", "model": "x"}, {"name": "a", "model": "y"}]}, "routes"),
        ({"routes": [{"name": "a", "model": "x"}], "server": {"port": 70000}}, "server.port"),
        ({"routes": [{"name": "a", "model": "x", "scope": "global"}]}, "routes.0.scope"),
        ({"routes": [{"name": "a", "model": "x", "ttl": 60, "semantic": {"ttl": 30}}]}, "routes.0"),
        ({"routes": [{"name": "a", "model": "x"}], "stats": {"scrape_replicas": "sometimes"}}, "stats.scrape_replicas"),
    ],
)
def test_bad_config_names_the_field(data, field):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert f"{field}:" in err.value.message


@pytest.mark.parametrize("given, mode", [(None, "watched"), (True, "always"), (False, "never"), ("always", "always")])
def test_replicas_are_read_while_watched_by_default_and_the_old_flag_still_reads(given, mode):
    stats = {} if given is None else {"scrape_replicas": given}
    assert parse_config({"routes": [{"name": "a", "model": "x"}], "stats": stats}).stats.scrape_replicas == mode


@pytest.mark.parametrize(
    "route, scope, ttl, old",
    [
        ({}, "tenant", 86400, []),
        ({"scope": "shared", "ttl": 60}, "shared", 60, []),
        ({"ttl": None}, "tenant", None, []),  # forever
        (
            {"semantic": {"scope": "shared", "ttl": None}},
            "shared",
            None,
            ["scope", "ttl"],
        ),  # the older spelling still works
        ({"scope": "shared", "semantic": {"scope": "shared"}}, "shared", 86400, ["scope"]),
    ],
)
def test_scope_and_ttl_live_on_the_route(route, scope, ttl, old):
    """Both tiers read one scope and ttl; `semantic.scope`/`semantic.ttl`, their old spellings, are
    moved onto the route at load, each with a deprecation naming both fields."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = parse_config({"routes": [{"name": "a", "model": "x", **route}]}).routes[0]
    assert (r.scope, r.ttl) == (scope, ttl)
    assert not hasattr(r.semantic, "scope") and not hasattr(r.semantic, "ttl")  # one spelling to read
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert said == [
        f"semantic.{name} is deprecated: write the route's {name} (it governs the exact tier too)" for name in old
    ]


def test_cli_bad_config_exits_with_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes:\n  - name: chat\n    model: 'demo-*'\n    semantic: {threshold: high}\n")
    run = subprocess.run(
        [*KVGATE, "serve", "--config", str(bad)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 2
    assert "routes.0.semantic.threshold" in run.stderr and "Traceback" not in run.stderr
    missing = subprocess.run(
        [*KVGATE, "check-config", "--config", str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 2 and "cannot read config" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("routes: [\n")
    run = subprocess.run(
        [*KVGATE, "check-config", "--config", str(broken)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and "not valid YAML" in run.stderr


def test_cli_serve_and_examples_end_to_end(tmp_path, backend):
    """`kvgate serve` as a process, driven by the two example scripts."""
    port = free_port()
    config = tmp_path / "kvgate.yaml"
    text = (ROOT / "examples" / "proxy_config.yaml").read_text()
    config.write_text(
        text.replace("http://127.0.0.1:9001/v1", backend.api_base).replace("./.kvgate", str(tmp_path / "cache"))
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*KVGATE, "serve", "--config", str(config), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("proxy did not start")
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "proxy_client.py"), f"http://127.0.0.1:{port}/v1"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].startswith("miss") and lines[1].startswith("semantic")
        assert lines[2] == "stream: " + lines[0].split("-> ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "serving 1 route(s)" in proc.stdout.read()


def test_sdk_example(backend):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sdk_chat.py"), backend.api_base],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    tiers = [line.split()[0] for line in out.stdout.splitlines()]
    assert tiers[:3] == ["miss", "exact", "semantic"]
    assert out.stdout.splitlines()[3].startswith("stream exact: Answer")


def test_cli_bench_dir_is_made_or_refused_in_one_line(tmp_path, capsys):
    from kvgate.middleware.cli import main

    nested = tmp_path / "a" / "b"
    # made before the bench runs; this one then stops at its own argument check
    assert main(["bench", "vllm", "--json", str(tmp_path / "r.json"), "--arms", "nope", "--dir", str(nested)]) == 2
    assert nested.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["bench", "vllm", "--json", str(tmp_path / "r.json"), "--dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"--dir {blocker / 'sub'}" in err and "Traceback" not in err
