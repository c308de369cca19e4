"""CPU per event of the bare minimum: kvgate's pooled client reading 4 concurrent SSE streams
from fake16 engines (tokens GAP ms apart), doing nothing with the bytes."""
import asyncio, sys, time, json
import uvloop
from kvgate.middleware.forward.http1 import Pool
from kvgate.tools.bench.procs import Proc, free_port
from pathlib import Path
import tempfile
gap = float(sys.argv[1])
work = Path(tempfile.mkdtemp())
port = free_port()
b = Proc("b", [sys.executable, str(Path(__file__).parent / "fake16.py"), str(port), str(gap / 1000)], work)
b.wait_http(f"http://127.0.0.1:{port}/health")
body = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 16}).encode()
async def main():
    pool = Pool(3.0)
    n = [0, 0]
    async def one():
        r = await pool.post(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"content-type": "application/json"}, 30)
        async for c in r.chunks():
            n[1] += c.count(b"\n\n")
        n[0] += 1
    async def worker():
        for _ in range(40):
            await one()
    await asyncio.gather(*(worker() for _ in range(4)))  # warm
    n[:] = [0, 0]
    c = time.process_time(); w = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(4)))
    c = time.process_time() - c
    print(f"gap {gap} ms: {n[0]} streams, {n[1]} events, {c / n[0] * 1e3:.3f} ms CPU per stream, {c / n[1] * 1e6:.1f} us per event, wall {time.perf_counter() - w:.1f}s")
    await pool.aclose()
uvloop.run(main())
b.stop()
