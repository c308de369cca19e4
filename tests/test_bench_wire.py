"""`kvgate bench vllm --wire`: a loopback capture split into each routed request's hops
(tools/bench/wire_hops.py), on pcap files built here packet by packet, and on a real tcpdump
capture of a relay where this machine allows one."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from kvgate.tools.bench import wire_capture
from kvgate.tools.bench.wire_capture import Capture
from kvgate.tools.bench.wire_hops import fingerprint, hops, pooled, summary

CLIENT, ROUTER, UP, ENGINE = 50000, 8000, 50001, 9000


def frame(src: int, dst: int, seq: int, payload: bytes) -> bytes:
    """An Ethernet frame carrying one IPv4 TCP segment between loopback ports."""
    tcp = struct.pack(">HHIIBBHHH", src, dst, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, b"\x7f\0\0\1", b"\x7f\0\0\1")
    return b"\0" * 12 + b"\x08\x00" + ip + tcp


class Pcap:
    """A classic pcap file (microsecond stamps), each side's sequence numbers kept."""

    def __init__(self) -> None:
        self.out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)]
        self.seq: dict[tuple[int, int], int] = {}

    def send(self, at: float, src: int, dst: int, payload: bytes, again: bool = False) -> None:
        seq = self.seq.setdefault((src, dst), 1000)
        if again:  # a retransmission of the last segment
            seq -= len(payload)
        else:
            self.seq[(src, dst)] = seq + len(payload)
        data = frame(src, dst, seq, payload)
        sec = int(at)
        self.out.append(struct.pack("<IIII", sec, round((at - sec) * 1e6), len(data), len(data)) + data)

    def bytes(self) -> bytes:
        return b"".join(self.out)


def post(body: bytes) -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FIRST = b'3f\r\ndata: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n\r\n'
MESSAGES = [{"role": "user", "content": "hello there"}]


def turn(p: Pcap, at: float, messages: list[dict[str, str]], engine_s: float = 0.196) -> None:
    """One request through the router: in at `at` (its body in two segments), 3 ms before the
    router's request, `engine_s` to the engine's first content, 3 ms to the router's."""
    body = json.dumps({"model": "m", "stream": True, "messages": messages}).encode()
    request = post(body)
    p.send(at, CLIENT, ROUTER, request[:40])
    p.send(at + 0.001, CLIENT, ROUTER, request[40:])
    # the router writes the same request its own way: no spaces, keys in another order
    upstream = post(json.dumps({"messages": messages, "stream": True, "model": "m"}, separators=(",", ":")).encode())
    p.send(at + 0.004, UP, ENGINE, upstream)
    p.send(at + 0.010, ENGINE, UP, HEAD)
    p.send(at + 0.004 + engine_s, ENGINE, UP, FIRST)
    p.send(at + 0.007 + engine_s, ROUTER, CLIENT, HEAD + FIRST)


def test_a_routed_request_splits_into_its_hops() -> None:
    p = Pcap()
    turn(p, 100.0, MESSAGES)
    [row] = hops(p.bytes(), ROUTER, [ENGINE])
    assert row["pre_ms"] == pytest.approx(3.0, abs=0.01)
    assert row["engine_ms"] == pytest.approx(196.0, abs=0.01)
    assert row["post_ms"] == pytest.approx(3.0, abs=0.01)
    assert row["turn_messages"] == 1


def test_requests_on_kept_alive_connections_pair_in_order_and_retransmissions_count_once() -> None:
    p = Pcap()
    turn(p, 100.0, MESSAGES, engine_s=0.100)
    p.send(100.107, ROUTER, CLIENT, FIRST, again=True)  # the first content again, later: ignored
    later = [*MESSAGES, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and now?"}]
    turn(p, 101.0, later, engine_s=0.050)
    rows = hops(p.bytes(), ROUTER, [ENGINE])
    assert [r["turn_messages"] for r in rows] == [1, 3]
    assert [r["engine_ms"] for r in rows] == pytest.approx([100.0, 50.0], abs=0.01)
    assert all(r["pre_ms"] == pytest.approx(3.0, abs=0.01) for r in rows)


def test_a_request_the_router_never_sent_on_is_left_out() -> None:
    p = Pcap()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "cached"}]}).encode()
    p.send(100.0, CLIENT, ROUTER, post(body))
    p.send(100.002, ROUTER, CLIENT, HEAD + FIRST)  # answered by the router itself
    turn(p, 101.0, MESSAGES)
    assert [r["turn_messages"] for r in hops(p.bytes(), ROUTER, [ENGINE])] == [1]


def test_a_malformed_request_head_is_skipped_not_fatal() -> None:
    p = Pcap()
    p.send(99.0, CLIENT, ROUTER, b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: many\r\n\r\n{}")
    p.send(99.002, ROUTER, CLIENT, HEAD + FIRST)
    turn(p, 100.0, MESSAGES)
    assert [r["turn_messages"] for r in hops(p.bytes(), ROUTER, [ENGINE])] == [1]


def test_fingerprints_ignore_spacing_and_key_order_and_refuse_other_bodies() -> None:
    a = json.dumps({"model": "m", "messages": MESSAGES}).encode()
    b = json.dumps({"messages": MESSAGES, "model": "m"}, separators=(",", ":")).encode()
    assert fingerprint(a) == fingerprint(b) is not None
    assert fingerprint(json.dumps({"prompt": "x"}).encode()) == ("completions", '"x"')
    assert fingerprint(b"not json") is None and fingerprint(b"[1]") is None
    assert fingerprint(json.dumps({"messages": [*MESSAGES, {"role": "user", "content": "y"}]}).encode()) != fingerprint(
        a
    )


def test_not_a_pcap_file_is_refused() -> None:
    with pytest.raises(ValueError, match="pcap"):
        hops(b"\0" * 64, ROUTER, [ENGINE])


def test_summary_and_pooled_weigh_each_run_by_its_requests() -> None:
    rows = [{"pre_ms": 1.0, "post_ms": 2.0}, {"pre_ms": 3.0, "post_ms": 4.0}, {"pre_ms": 8.0, "post_ms": 0.0}]
    s = summary(rows)
    assert s == {
        "wire_requests": 3,
        "wire_pre_mean_ms": 4.0,
        "wire_pre_p50_ms": 3.0,
        "wire_post_mean_ms": 2.0,
        "wire_post_p50_ms": 2.0,
    }
    assert summary([]) == {}
    other = {"wire_requests": 1, "wire_pre_mean_ms": 8.0, "wire_post_mean_ms": 6.0}
    assert pooled([s, other, {}]) == {"wire_requests": 4, "wire_pre_mean_ms": 5.0, "wire_post_mean_ms": 3.0}
    assert pooled([{}]) == {}


def test_without_tcpdump_the_capture_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_capture.shutil, "which", lambda name: None)
    assert "tcpdump is not installed" in (wire_capture.unavailable() or "")


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    return s


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(v for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")) if k.lower() == b"content-length")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return body


@pytest.mark.skipif(wire_capture.unavailable() is not None, reason=str(wire_capture.unavailable()))
def test_a_real_capture_of_a_relay_shows_its_hops(tmp_path: Path) -> None:
    """tcpdump on loopback around one request relayed by a socket relay that waits 20 ms before
    it forwards: the capture shows that wait before the engine, the engine's own 50 ms after."""
    engine, router = _listener(), _listener()
    engine_port, router_port = engine.getsockname()[1], router.getsockname()[1]

    def serve_engine() -> None:
        conn, _ = engine.accept()
        with conn:
            _read_request(conn)
            conn.sendall(HEAD)
            time.sleep(0.05)
            conn.sendall(FIRST + b"0\r\n\r\n")

    def serve_router() -> None:
        conn, _ = router.accept()
        with conn:
            body = _read_request(conn)
            time.sleep(0.02)
            with socket.create_connection(("127.0.0.1", engine_port)) as up:
                up.sendall(post(json.dumps(json.loads(body), separators=(",", ":")).encode()))
                answer = b""
                while not answer.endswith(b"0\r\n\r\n"):
                    answer += up.recv(65536)
            conn.sendall(answer)

    capture = Capture(tmp_path / "relay.pcap", [router_port, engine_port])
    capture.start()
    threads = [threading.Thread(target=serve_engine), threading.Thread(target=serve_router)]
    try:
        for t in threads:
            t.start()
        with socket.create_connection(("127.0.0.1", router_port)) as client:
            client.sendall(post(json.dumps({"model": "m", "messages": MESSAGES}).encode()))
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                got += client.recv(65536)
        for t in threads:
            t.join(timeout=10)
        time.sleep(0.2)  # the last packets reach the capture
    finally:
        packets = capture.stop()
        engine.close()
        router.close()
    [row] = hops(packets, router_port, [engine_port])
    assert row["pre_ms"] >= 19.0
    assert row["engine_ms"] >= 49.0
    assert row["post_ms"] >= 0.0


def test_the_bench_asks_for_a_capture_only_with_wire_and_a_router(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from kvgate.tools.bench import vllm_arena
    from kvgate.tools.bench.vllm_arena import add_arguments, validate
    from kvgate.tools.bench.vllm_arena_bench import Bench

    p = argparse.ArgumentParser()
    add_arguments(p)
    monkeypatch.setattr(vllm_arena, "wire_unavailable", lambda: "no tcpdump here")
    assert validate(p.parse_args(["--json", "x", "--wire"])) == ["--wire: no tcpdump here"]
    assert validate(p.parse_args(["--json", "x"])) == []

    class Server:
        def __init__(self, port: int) -> None:
            self.port = port

    bench = Bench(p.parse_args(["--json", "x", "--wire"]), tmp_path)
    bench.servers = [Server(9001), Server(9002)]
    capture = bench.capture("kvgate_precise", "http://127.0.0.1:8123/v1/chat/completions")
    assert capture is not None and capture.ports == [8123, 9001, 9002] and capture.path.parent == tmp_path
    assert bench.capture("replay_precise", "http://127.0.0.1:9001/v1/chat/completions") is None
    assert Bench(p.parse_args(["--json", "x"]), tmp_path).capture("sglang", "http://127.0.0.1:8123/v1") is None
