"""Round trip of asyncio.to_thread on an otherwise idle uvloop, one call every 25 ms (as at 40 req/s)."""
import asyncio, time, statistics, uvloop, threading, queue
def f(): return 1
async def main():
    loop = asyncio.get_running_loop()
    xs = []
    for i in range(400):
        await asyncio.sleep(0.025)
        t = time.perf_counter(); await asyncio.to_thread(f); xs.append((time.perf_counter() - t) * 1e6)
    xs.sort(); print(f"to_thread: p50 {xs[len(xs)//2]:.0f} us p90 {xs[int(.9*len(xs))]:.0f} p99 {xs[int(.99*len(xs))]:.0f}")
    xs = []
    for i in range(400):
        await asyncio.sleep(0.0005)
        t = time.perf_counter(); await asyncio.to_thread(f); xs.append((time.perf_counter() - t) * 1e6)
    xs.sort(); print(f"to_thread busy (0.5 ms apart): p50 {xs[len(xs)//2]:.0f} us p90 {xs[int(.9*len(xs))]:.0f}")
uvloop.run(main())
