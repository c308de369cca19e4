"""Precise mode's events thread per block: EventApplier.apply of BlockStored events (a 27k-token
prompt at 16-token blocks, as one event of 1,689 blocks, then its removal), against the index's
own share (PrefixIndex.stored / removed), on an index of one replica at EVENT_FED_CAPACITY."""
import random, time
from kvgate.index.kv.prefix import PrefixIndex, EVENT_FED_CAPACITY
from kvgate.index.kv.kv_events.applier import EventApplier
from kvgate.index.kv.kv_events.codec import BlockStored, BlockRemoved
BS = 16
for run in range(2):
    idx = PrefixIndex(EVENT_FED_CAPACITY, touch_on_match=True); idx.add_replica("a")
    ap = EventApplier(idx, "a", BS)
    rng = random.Random(run)
    evs = []
    for c in range(60):
        toks = [rng.randrange(50000) for _ in range(1689 * BS)]
        hashes = [rng.getrandbits(63) for _ in range(1689)]
        evs.append((BlockStored(hashes, None, toks, BS), BlockRemoved(hashes)))
    for st, _ in evs[:20]: ap.apply(st)
    ts = tr = 0.0
    for st, rm in evs[20:]:
        t0 = time.perf_counter(); ap.apply(st); t1 = time.perf_counter(); ap.apply(rm); t2 = time.perf_counter()
        ts += t1 - t0; tr += t2 - t1
    n = 40 * 1689
    print(f"stored {ts/n*1e9:.0f} ns per block (incl. our hashes of its tokens), removed {tr/n*1e9:.0f} ns per block", flush=True)
