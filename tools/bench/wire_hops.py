"""Where a routed request's time goes on the wire: a loopback capture (pcap, as tcpdump writes it)
of a client talking to a router and the router talking to engines, split into each request's hops.

For every request the client POSTs to the router, the router's own POST of the same request to an
engine is found (same messages, or the same completions prompt, whatever JSON spacing each side
writes), and three stretches are read off the packets' timestamps:

- `pre_ms`: the request's last byte reaching the router → the router's first byte to the engine
  (parsing, routing, hashing, connecting: what the router does before the engine can start);
- `engine_ms`: the router's last byte to the engine → the engine's first content event back;
- `post_ms`: the engine's first content event reaching the router → the router's first content
  event to the client (the first token's relay).

Stretches outside both (the client's own wake-up, the engine's queue as the engine reports it) are
not here; the bench's other fields have them.

Pure functions on bytes: nothing here captures (wire_capture.py does). Invariants: a request is
reported only when both of its POSTs and both first content events were captured; each side's
bytes are reassembled in sequence order, duplicates (retransmissions) dropped; HTTP/1.1 responses
on a kept-alive connection are paired with its requests in order.
"""

from __future__ import annotations

import json
import statistics
import struct
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

PCAP_US, PCAP_NS = 0xA1B2C3D4, 0xA1B23C4D  # the file's magic: microsecond or nanosecond stamps
ETHERNET = 14  # tcpdump -i lo writes Ethernet frames (link type 1)
POST = b"POST /v1/"
CONTENT_KEYS = {"chat": b'"content"', "completions": b'"text"'}  # what the bench client's TTFT waits for


@dataclass(frozen=True)
class Segment:
    at: float  # capture timestamp, seconds
    src: int  # TCP source port (every address is loopback)
    dst: int
    seq: int
    payload: bytes


def segments(pcap: bytes) -> Iterator[Segment]:
    """The TCP segments with a payload in a classic pcap file of Ethernet frames (IPv4)."""
    if len(pcap) < 24:
        return
    magic = struct.unpack_from("<I", pcap)[0]
    if magic not in (PCAP_US, PCAP_NS):
        raise ValueError("not a little-endian pcap file (tcpdump -w writes one)")
    scale = 1e-9 if magic == PCAP_NS else 1e-6
    pos = 24
    while pos + 16 <= len(pcap):
        sec, frac, incl, _ = struct.unpack_from("<IIII", pcap, pos)
        frame = pcap[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        ip = frame[ETHERNET:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:  # IPv4 carrying TCP only
            continue
        ihl, total = (ip[0] & 15) * 4, struct.unpack_from(">H", ip, 2)[0]
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        src, dst, seq = struct.unpack_from(">HHI", tcp)
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            yield Segment(sec + frac * scale, src, dst, seq, bytes(payload))


class Stream:
    """One direction of one connection, reassembled: its bytes and when each byte arrived."""

    def __init__(self, parts: Iterable[Segment]) -> None:
        ordered = sorted(parts, key=lambda s: s.at)
        base = ordered[0].seq if ordered else 0
        pieces: dict[int, Segment] = {}
        for s in ordered:
            pieces.setdefault((s.seq - base) % (1 << 32), s)  # a retransmission keeps the first copy
        data, marks = bytearray(), []
        for offset in sorted(pieces):
            s = pieces[offset]
            payload = s.payload[max(0, len(data) - offset) :] if offset < len(data) else s.payload
            if offset > len(data):  # a segment the capture missed: keep offsets right
                data.extend(b"\0" * (offset - len(data)))
            if payload:
                marks.append((len(data), len(data) + len(payload), s.at))
                data.extend(payload)
        self.data, self._marks = bytes(data), marks

    def at(self, index: int) -> float | None:
        """When the byte at `index` was captured."""
        for start, end, at in self._marks:
            if start <= index < end:
                return at
        return None


@dataclass
class Exchange:
    """One POST on a connection and what came back first."""

    src: int
    dst: int
    fingerprint: Any
    first_byte: float
    last_byte: float
    content: float | None  # the first content event of its response


def fingerprint(body: bytes) -> Any:
    """What identifies a request whatever JSON spacing or key order a router writes it in: the
    chat's message count and its first and last messages, or the completions prompt; None for a
    body that is not such JSON."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    messages = doc.get("messages")
    if isinstance(messages, list) and messages:
        return (
            "chat",
            len(messages),
            json.dumps(messages[0], sort_keys=True),
            json.dumps(messages[-1], sort_keys=True),
        )
    prompt = doc.get("prompt")
    return ("completions", json.dumps(prompt)) if prompt is not None else None


def exchanges(requests: Stream, responses: Stream | None, src: int, dst: int, key: bytes) -> list[Exchange]:
    """The POSTs sent on one connection, each with the time of its response's first content event."""
    out, pos, rpos = [], 0, 0
    data = requests.data
    while (start := data.find(POST, pos)) >= 0:
        head_end = data.find(b"\r\n\r\n", start)
        if head_end < 0:
            break
        length = 0
        for line in data[start:head_end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value.strip())
        end = head_end + 4 + length
        first, last = requests.at(start), requests.at(end - 1)
        content = None
        if responses is not None and (status := responses.data.find(b"HTTP/1.1 ", rpos)) >= 0:
            found = responses.data.find(key, status)
            if found >= 0:
                content, rpos = responses.at(found), found
            else:
                rpos = len(responses.data)
        if first is not None and last is not None:
            out.append(Exchange(src, dst, fingerprint(data[head_end + 4 : end]), first, last, content))
        pos = end
    return out


def hops(pcap: bytes, router_port: int, engine_ports: Iterable[int], endpoint: str = "chat") -> list[dict[str, Any]]:
    """Each request the capture shows in full through the router on `router_port`: its hops in
    milliseconds (`pre_ms`, `engine_ms`, `post_ms`) and `turn_messages` (the chat's message count)."""
    key, engines = CONTENT_KEYS[endpoint], set(engine_ports)
    by_direction: dict[tuple[int, int], list[Segment]] = defaultdict(list)
    for s in segments(pcap):
        by_direction[(s.src, s.dst)].append(s)
    streams = {d: Stream(parts) for d, parts in by_direction.items()}
    inbound, upstream = [], defaultdict(list)
    for (src, dst), stream in streams.items():
        if dst != router_port and dst not in engines:
            continue
        for x in exchanges(stream, streams.get((dst, src)), src, dst, key):
            if dst == router_port:
                inbound.append(x)
            elif x.fingerprint is not None:
                upstream[x.fingerprint].append(x)
    rows = []
    for x in sorted(inbound, key=lambda x: x.first_byte):
        sent = [u for u in upstream.get(x.fingerprint, ()) if u.first_byte >= x.first_byte]
        if x.fingerprint is None or not sent or x.content is None:
            continue
        u = min(sent, key=lambda u: u.first_byte)
        upstream[x.fingerprint].remove(u)  # a retried or repeated request pairs with the next one
        if u.content is None:
            continue
        rows.append(
            {
                "pre_ms": round((u.first_byte - x.last_byte) * 1e3, 3),
                "engine_ms": round((u.content - u.last_byte) * 1e3, 3),
                "post_ms": round((x.content - u.content) * 1e3, 3),
                "turn_messages": x.fingerprint[1] if x.fingerprint[0] == "chat" else None,
            }
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means and medians of the hops a run's requests took (ms); empty without rows."""
    if not rows:
        return {}
    out: dict[str, Any] = {"wire_requests": len(rows)}
    for hop in ("pre_ms", "post_ms"):
        values = [r[hop] for r in rows]
        out[f"wire_{hop.removesuffix('_ms')}_mean_ms"] = round(statistics.fmean(values), 3)
        out[f"wire_{hop.removesuffix('_ms')}_p50_ms"] = round(statistics.median(values), 3)
    return out


def pooled(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """An arm's hop means over its runs, weighted by the requests each run matched (ms); empty when
    no run was captured."""
    total, sums = 0, {"pre": 0.0, "post": 0.0}
    for run in runs:
        n = run.get("wire_requests") or 0
        if n:
            total += n
            for hop in sums:
                sums[hop] += run[f"wire_{hop}_mean_ms"] * n
    if not total:
        return {}
    return {"wire_requests": total, **{f"wire_{hop}_mean_ms": round(sums[hop] / total, 3) for hop in sums}}
