"""The proxy's CPU per request without the HTTP server: the app `kvgate serve` builds, called
through ASGI in this process, in front of `kvgate demo-backend` (a child process), with the
throughput bench's all-miss requests (a long system prompt out of 8, a fresh question, half of
them streamed). What it counts is this process's CPU over the timed requests: the pipeline, the
router, the relay's client, and the few microseconds the in-process caller adds; uvicorn's own
reading and writing, and the kernel's socket work on the client side, are left out, so the figure
moves with kvgate's own code and less with the machine. For comparing two trees of the code on
one machine, alternately (each run in a process of its own; start it from a directory outside
both trees, since `python -m` puts the working directory ahead of PYTHONPATH):

    for i in 1 2 3 4; do for t in OLD NEW; do
      PYTHONPATH=$t python -m kvgate.tools.bench.pipeline_cpu --json $t-$i.json; done; done

`--target`: router (the route's response cache off: routing alone), relay (the exact tier on,
every request a miss) or backend (the demo backend as the route's one backend: no routing).
`--profile PATH` writes a cProfile of the timed requests (which roughly doubles their CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import tempfile
import time
from pathlib import Path
from typing import Any

from kvgate.middleware.config import load_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.stats import write_json
from kvgate.tools.bench.throughput import Workload
from kvgate.tools.bench.throughput_servers import kvgate_config, wait_ready

CHAT = "/v1/chat/completions"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", choices=("router", "relay", "backend"), default="router")
    p.add_argument("--requests", type=int, default=3000, help="timed requests")
    p.add_argument("--warmup", type=int, default=200, help="requests before timing (connections, caches)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--system-words", type=int, default=400)
    p.add_argument("--question-words", type=int, default=16)
    p.add_argument("--stream-share", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=Path, default=None, help="write a cProfile of the timed requests here")
    p.add_argument("--json", type=Path, default=None)


class Caller:
    """One ASGI app called as a server would call it: a request's body at once, then a
    disconnect once the response is complete. Counts each response's status and sends."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bad = 0
        self.sends: collections.Counter[int] = collections.Counter()

    async def __call__(self, body: bytes) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": CHAT,
            "raw_path": CHAT.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
            "state": {},
        }
        given, done = [False], asyncio.Event()
        status, sends = [0], [0]

        async def receive() -> dict[str, Any]:
            if not given[0]:
                given[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            sends[0] += 1

        await self.app(scope, receive, send)
        done.set()
        self.bad += status[0] != 200
        self.sends[sends[0]] += 1


async def _lifespan(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    """Start the app as a server would (its lifespan), so the pipeline is built and running."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def send(message: dict[str, Any]) -> None:
        if not started.done() and message["type"].startswith("lifespan.startup"):
            started.set_result(message["type"] + " " + str(message.get("message", "")))

    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send))
    outcome = await started
    if not outcome.startswith("lifespan.startup.complete"):
        raise RuntimeError(f"the app did not start: {outcome}")
    return task, inbox


async def _drive(args: argparse.Namespace, app: Any) -> dict[str, Any]:
    task, inbox = await _lifespan(app)
    work = Workload("cpu", args, args.seed + 1)
    caller = Caller(app.lean)

    async def send(n: int) -> None:
        bodies = iter([work.body(work.new()) for _ in range(n)])

        async def worker() -> None:
            for body in bodies:
                await caller(body)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))

    await send(args.warmup)
    caller.bad, caller.sends = 0, collections.Counter()
    profile = cProfile.Profile() if args.profile else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    await send(args.requests)
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await inbox.put({"type": "lifespan.shutdown"})
    await task
    return {
        "requests": args.requests,
        "errors": caller.bad,
        "cpu_ms_per_request": round(cpu / args.requests * 1e3, 4),
        "rps": round(args.requests / wall, 1),
        "sends_per_response": dict(sorted(caller.sends.items())),
        "profiled": args.profile is not None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kvgate-pipeline-cpu-"))
    port = free_port()
    backend = Proc("backend", kvgate_argv("demo-backend", "--port", str(port)), work)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(backend, url)
        config = load_config(kvgate_config(work, url, args.target, "text", args.target))
        app = create_app(config)
        try:
            import uvloop  # the loop `kvgate serve` runs on

            runner: Any = uvloop.run
        except ImportError:
            runner = asyncio.run
        row = runner(_drive(args, app))
    finally:
        backend.stop()
    return {"bench": "pipeline_cpu", "target": args.target, "concurrency": args.concurrency, **row}


def main(args: argparse.Namespace) -> int:
    result = run(args)
    print(
        f"{result['target']}: {result['requests']} requests, {result['errors']} errors, "
        f"{result['cpu_ms_per_request']:.3f} ms CPU per request, {result['rps']:.0f} req/s"
        + (" (profiled)" if result["profiled"] else "")
    )
    if args.json is not None:
        write_json(args.json, result)
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
