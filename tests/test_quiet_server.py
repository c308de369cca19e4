"""`kvgate serve`'s uvicorn server (middleware/server/quiet_server.py): it serves as uvicorn's,
sends the Date header, and stops on `stop()` and on SIGTERM although its loop naps a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from email.utils import parsedate_to_datetime

import httpx
import uvicorn

from kvgate.middleware.server.quiet_server import QuietServer
from kvgate.tools.bench.procs import free_port
from tests.conftest import ROOT


async def hello(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def _wait_up(port: int) -> httpx.Response:
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError("server did not start")


def test_serves_with_a_date_header_and_stops_when_asked():
    port = free_port()
    server = QuietServer(uvicorn.Config(hello, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    reply = _wait_up(port)
    assert reply.text == "hello"
    sent = parsedate_to_datetime(reply.headers["date"]).timestamp()
    assert abs(sent - time.time()) < 5  # today's date, refreshed by the tick
    time.sleep(2.2)  # two ticks later the header has moved on
    later = parsedate_to_datetime(httpx.get(f"http://127.0.0.1:{port}/").headers["date"]).timestamp()
    assert later > sent
    server.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_sigterm_shuts_it_down_gracefully():
    port = free_port()
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_quiet_server import hello
        from kvgate.middleware.server.quiet_server import serve
        sys.exit(serve(hello, host="127.0.0.1", port={port}, log_level="info"))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT.parent)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _wait_up(port).text == "hello"
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down, as `uvicorn.run` does
        assert proc.wait(timeout=20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Application shutdown complete" in (proc.stdout.read() if proc.stdout else "")


def test_a_port_in_use_is_a_startup_failure(tmp_path):
    port = free_port()
    blocker = QuietServer(uvicorn.Config(hello, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=blocker.run, daemon=True)
    thread.start()
    try:
        _wait_up(port)
        script = (
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.test_quiet_server import hello; "
            f"from kvgate.middleware.server.quiet_server import serve; "
            f"sys.exit(serve(hello, host='127.0.0.1', port={port}, log_level='critical'))"
        )
        run = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT.parent)},
            capture_output=True,
            timeout=60,
        )
        assert run.returncode == 3  # as uvicorn.run exits when the server never started
    finally:
        blocker.stop()
        thread.join(10)
