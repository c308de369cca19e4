"""A throwaway `redis-server` on 127.0.0.1 for tests, benchmarks and `make run-cluster`.

The server binary is Debian's `redis-server` (installed by `make install`); it runs with no
persistence, in a temp dir, on a free port, and is killed on `stop()`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def redis_server_bin() -> str | None:
    """The `redis-server` executable on PATH, or None."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server child process. `url` is `redis://127.0.0.1:PORT/0` once started.

    `maxmemory` and `policy` set Redis's own eviction (what the docs recommend for the response
    cache: `allkeys-lru`); `password` sets `requirepass`.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        maxmemory: str | None = None,
        policy: str = "allkeys-lru",
        password: str | None = None,
    ) -> None:
        binary = redis_server_bin()
        if binary is None:
            raise RuntimeError("redis-server is not installed (make install installs Debian's redis-server)")
        self.port = port or _free_port()
        self.password = password
        self._dir = Path(tempfile.mkdtemp(prefix="kvgate-redis-"))
        argv = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._dir),
            "--logfile",
            str(self._dir / "redis.log"),
        ]
        if maxmemory:
            argv += ["--maxmemory", maxmemory, "--maxmemory-policy", policy]
        if password:
            argv += ["--requirepass", password]
        self._argv = argv
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self._dir / "redis.log"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        self.proc = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                if reply.startswith((b"+PONG", b"-NOAUTH")):
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout:.0f}s")

    def stop(self) -> None:
        """Kill the server (SIGKILL: a crash, as a fault test wants it) and remove its dir."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def restart(self) -> "RedisServer":
        """Kill and start again on the same port: an outage that loses everything (no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._dir.mkdir(parents=True, exist_ok=True)
        return self.start()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
