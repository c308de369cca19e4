"""A loopback packet capture around one bench run (tcpdump), for wire_hops to split into hops.

`kvgate bench vllm --wire` runs one per routed run, filtered to the router's and the engines' TCP
ports. tcpdump needs the capture privilege (root, or CAP_NET_RAW on its binary); without it, or
without tcpdump (Debian's `tcpdump`, installed by `make install`), `unavailable()` says why and the
bench runs without the wire figures. The capture costs a little CPU of its own per packet, in every
arm alike.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable

START_S = 10.0  # how long tcpdump may take to say it is listening


def unavailable() -> str | None:
    """Why a capture cannot run here, or None."""
    if shutil.which("tcpdump") is None:
        return "tcpdump is not installed (Debian: apt-get install tcpdump; make install does)"
    if os.geteuid() != 0:
        return "capturing loopback packets needs root (or CAP_NET_RAW on tcpdump)"
    return None


class Capture:
    """tcpdump on `lo` for TCP to or from `ports`, into `path`, from `start()` to `stop()`."""

    def __init__(self, path: Path, ports: Iterable[int]) -> None:
        self.path = path
        self.ports = sorted(set(ports))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        expr = "tcp and (" + " or ".join(f"port {p}" for p in self.ports) + ")"
        # --immediate-mode and -U: each packet read and written as it comes (else the last ring block is
        # lost when tcpdump stops); -s 0: whole bodies (the fingerprints read them)
        argv = [
            "tcpdump",
            "-i",
            "lo",
            "-n",
            "-U",
            "--immediate-mode",
            "-s",
            "0",
            "-B",
            "16384",
            "-w",
            str(self.path),
            expr,
        ]
        err = self.path.with_suffix(".log")
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(err, "wb"))
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"tcpdump exited with {self._proc.returncode}: {err.read_text(errors='replace')}")
            if b"listening on" in err.read_bytes():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tcpdump did not start listening within {START_S:.0f}s")

    def stop(self) -> bytes:
        """Ends the capture; the packets it wrote (b"" when it never started)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return b""
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # tcpdump flushes and closes its file on SIGINT
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return self.path.read_bytes() if self.path.exists() else b""
