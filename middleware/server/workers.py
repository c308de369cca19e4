"""`kvgate serve --workers N`: N proxy processes on one port, sharing the routing state.

Each worker is a full proxy process (its own event loop, pipeline and routers) spawned from
here. The port: one listening socket per worker, all bound with SO_REUSEPORT, made here before
any worker starts (so a port in use fails at once, here) and handed to the worker; the kernel
spreads new connections over the sockets by a hash of the connection, so no worker accepts for
the others and no accept lock is needed. What the workers share is set up here too
(`WorkersLayout`: the load table and the ipc endpoints, see middleware/routing/state_workers.py;
the replica lists the admin API changes at run time, middleware/routing/fleet_workers.py); the
response cache is shared as for any processes on one host: one cache_dir on disk.

A worker that dies is started again (its row of the load table zeroed first: its requests died
with it). SIGTERM / SIGINT stop every worker and remove the shared files.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import threading
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from kvgate.middleware.config import Config
from kvgate.middleware.routing.state_workers import WorkerHub, WorkersLayout

log = logging.getLogger("kvgate.workers")

RESTART_PAUSE_S = 1.0  # between a worker's death and its restart (a worker failing at start-up loops slowly)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port) that other sockets may share (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def layout_for(config: Config, workers: int) -> WorkersLayout:
    return WorkersLayout.create([(r.name, [x.name for x in r.replicas]) for r in config.routes], workers)


def run_worker(
    config_path: Path, worker: int, layout: WorkersLayout, sock: socket.socket, uvicorn_options: dict[str, Any]
) -> None:
    """One worker process: a proxy on the shared socket, its routers on the shared state."""
    from kvgate.middleware.config import load_config
    from kvgate.middleware.litellm_env import litellm
    from kvgate.middleware.server.proxy import create_app
    from kvgate.middleware.server.quiet_server import QuietServer, server_config

    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s %(name)s [worker {worker}]: %(message)s")
    litellm.disable_streaming_logging = True  # see middleware/cli.py's _serve
    config = load_config(config_path)
    hub = WorkerHub(layout, worker)
    try:
        app = create_app(config, routing_state=hub.state, worker=worker, server_process=True, workers_hub=hub)
        server = QuietServer(server_config(app, **uvicorn_options))
        server.run(sockets=[sock])
    finally:
        hub.close()


class Supervisor:
    """Starts the workers, restarts one that dies, stops them all on SIGTERM / SIGINT."""

    def __init__(
        self, config_path: Path, config: Config, host: str, port: int, workers: int, uvicorn_options: dict[str, Any]
    ) -> None:
        if workers < 1:
            raise ValueError("--workers must be at least 1")
        self.config_path, self.host, self.port = config_path, host, port
        self.uvicorn_options = uvicorn_options
        self.layout = layout_for(config, workers)
        # fork: the workers start from this process's imports (the proxy stack, LiteLLM), done
        # once here. This process starts no thread before it forks (no pipeline, no hub of its own).
        import kvgate.middleware.server.proxy  # noqa: F401
        from kvgate.middleware.litellm_env import litellm  # noqa: F401

        self._ctx = multiprocessing.get_context("fork")
        self._procs: list[BaseProcess | None] = [None] * workers
        self._stop = threading.Event()

    def _start(self, worker: int) -> None:
        sock = listen(self.host, self.port)
        proc = self._ctx.Process(
            target=run_worker,
            name=f"kvgate-worker-{worker}",
            args=(self.config_path, worker, self.layout, sock, self.uvicorn_options),
        )
        proc.start()
        sock.close()  # the worker holds its own copy
        self._procs[worker] = proc

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        print(
            f"kvgate: {len(self._procs)} workers on port {self.port}, routing state shared in {self.layout.directory}",
            flush=True,
        )
        try:
            for worker in range(len(self._procs)):
                self._start(worker)
            while not self._stop.wait(0.5):
                for worker, proc in enumerate(self._procs):
                    if proc is not None and not proc.is_alive() and not self._stop.is_set():
                        log.warning("worker %d exited with %s; starting it again", worker, proc.exitcode)
                        self._zero_row(worker)
                        self._stop.wait(RESTART_PAUSE_S)
                        if not self._stop.is_set():
                            self._start(worker)
        finally:
            self._shutdown()
        return 0

    def _zero_row(self, worker: int) -> None:
        table = self.layout.load_table()
        if table is not None:
            table[worker] = 0

    def _shutdown(self) -> None:
        live = [p for p in self._procs if p is not None]
        for proc in live:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn finishes what it serves, then exits
        for proc in live:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self.layout.remove()
