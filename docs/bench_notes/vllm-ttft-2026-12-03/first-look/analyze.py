"""Per request hop times from a loopback pcap: client->router POST, router->vLLM POST, vLLM's first
"content" event back to the router, the router's to the client."""
import re, struct, sys, statistics
from collections import defaultdict

def packets(path):
    f = open(path, "rb"); gh = f.read(24)
    magic = struct.unpack("<I", gh[:4])[0]; ns = magic == 0xa1b23c4d
    while True:
        h = f.read(16)
        if len(h) < 16: return
        s, frac, incl, _ = struct.unpack("<IIII", h)
        data = f.read(incl)
        ts = s + frac / (1e9 if ns else 1e6)
        ip = data[14:]
        if ip[9] != 6: continue
        ihl = (ip[0] & 15) * 4; tot = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:tot]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8]); off = (tcp[12] >> 4) * 4
        payload = tcp[off:]
        if payload:
            yield ts, sport, dport, seq, payload

streams = defaultdict(list)  # (sport, dport) -> [(ts, seq, payload)]
for ts, sp, dp, seq, pl in packets(sys.argv[1]):
    streams[(sp, dp)].append((ts, seq, pl))

def assemble(pkts):
    """[(ts, offset, bytes)] in seq order, duplicates dropped; returns (data, [(ts, start, end)])."""
    pkts = sorted(pkts, key=lambda p: p[0]); base = pkts[0][1]; seen = set(); out = []; data = bytearray(); marks = []
    for ts, seq, pl in pkts:
        off = (seq - base) % (1 << 32)
        if off in seen: continue
        seen.add(off)
        out.append((off, ts, pl))
    out.sort()
    for off, ts, pl in out:
        if off != len(data):
            if off < len(data): pl = pl[len(data) - off:]
            else: data.extend(b"\0" * (off - len(data)))
        marks.append((ts, len(data), len(data) + len(pl))); data.extend(pl)
    return bytes(data), marks

def ts_at(marks, pos):
    for ts, a, b in marks:
        if a <= pos < b: return ts
    return None

FP = re.compile(rb'"content":\s*"([^"]{12,200})"')
reqs = []  # dict per request
for (sp, dp), pkts in streams.items():
    data, marks = assemble(pkts)
    back = streams.get((dp, sp))
    rdata, rmarks = assemble(back) if back else (b"", [])
    pos = 0
    rpos = 0
    while True:
        i = data.find(b"POST /v1/chat/completions", pos)
        if i < 0: break
        he = data.find(b"\r\n\r\n", i)
        if he < 0: break
        m = re.search(rb"(?i)content-length:\s*(\d+)", data[i:he]); n = int(m.group(1)) if m else 0
        body = data[he + 4: he + 4 + n]
        t_first, t_last = ts_at(marks, i), ts_at(marks, he + 3 + n)
        try:
            import json as _j
            msgs = _j.loads(body)["messages"]; fp = (len(msgs), str(msgs[-1].get("content"))[:400], str(msgs[0].get("content"))[:400])
        except Exception:
            fp = None
        # response: find first '"content"' after the response head
        j = rdata.find(b"HTTP/1.1", rpos)
        k = rdata.find(b'"content"', j) if j >= 0 else -1
        t_head = ts_at(rmarks, j) if j >= 0 else None
        t_content = ts_at(rmarks, k) if k >= 0 else None
        nxt = rdata.find(b"HTTP/1.1", j + 1) if j >= 0 else -1
        rpos = nxt if nxt >= 0 else len(rdata)
        reqs.append(dict(sport=sp, dport=dp, t0=t_first, t1=t_last, fp=fp, head=t_head, content=t_content, n=n, first_on_conn=(pos == 0), nmsg=(fp[0] if fp else 0)))
        pos = he + 4 + n

byport = defaultdict(list)
for r in reqs: byport[r["dport"]].append(r)
ports = sorted(byport, key=lambda p: -len(byport[p]))
print("ports by POSTs:", [(p, len(byport[p]), round(min(r["t0"] for r in byport[p]) - reqs[0]["t0"], 1)) for p in ports])
vllm = set(ports[:2])
up = [r for r in reqs if r["dport"] in vllm]
upfp = defaultdict(list)
for r in up: upfp[r["fp"]].append(r)
for p in sorted(set(ports) - vllm, key=lambda p: min(r["t0"] for r in byport[p])):
    rows = []
    for r in byport[p]:
        cands = [u for u in upfp.get(r["fp"], []) if u["t0"] >= r["t0"] - 0.001]
        if not cands or r["content"] is None: continue
        u = min(cands, key=lambda u: u["t0"])
        if u["content"] is None: continue
        rows.append(dict(new=u['first_on_conn'], nmsg=r['nmsg'], n=r['n'], pre=u["t0"] - r["t1"], send=u["t1"] - u["t0"], vllm=u["content"] - u["t1"],
                         post=r["content"] - u["content"], total=r["content"] - r["t0"], recv=r["t1"] - r["t0"]))
    if not rows: continue
    def s(k): v = sorted(x[k] * 1e3 for x in rows); return f"{k} mean {statistics.mean(v):7.2f} p50 {v[len(v)//2]:7.2f} p90 {v[int(len(v)*.9)]:7.2f} max {v[-1]:7.2f}"
    print(f"router port {p}: {len(rows)} matched of {len(byport[p])}")
    for k in ("recv", "pre", "send", "vllm", "post", "total"): print("   ", s(k))

    for label, f in (("new conn", lambda x: x["new"]), ("reused", lambda x: not x["new"]), ("first turn", lambda x: x["nmsg"] <= 2), ("later", lambda x: x["nmsg"] > 2)):
        sub = [x["pre"] * 1e3 for x in rows if f(x)]
        if sub: print(f"      pre {label}: n={len(sub)} mean {statistics.mean(sub):.2f} p50 {sorted(sub)[len(sub)//2]:.2f}")
    import math
    big = sorted(rows, key=lambda x: -x["pre"])[:5]
    print("      top pre:", [(round(x["pre"]*1e3,1), x["new"], x["nmsg"], x["n"]) for x in big])
