"""The parts of kvgate-in-front-of-vLLM that need no vLLM: config rules, salts, salted chains in
both hash paths, the engine-hash check, the vLLM adapter's parsing, replay after a gap, and the
precise-mode checks (unmatched, stale) driven by hand-made events."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
import zmq

from kvgate.index.kv.engine_hash import checkable_salt, vllm_first_block_hash
from kvgate.index.kv.kv_events import BlockStored, EventApplier, KVEventBatch, ZmqEventSubscriber, encode_batch
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, parse_config
from kvgate.middleware.engines.vllm import binds, cache_config, parse_version, version_error
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.routing.precise import PreciseRouting
from kvgate.middleware.routing.salt import Salter, load_secret
from tests.conftest import wait_until

BS = 4
MESSAGES = [{"role": "user", "content": "a prompt long enough for several blocks of four"}]


def route(**routing: object) -> dict[str, object]:
    return {
        "routes": [
            {
                "name": "r",
                "model": "m*",
                "routing": routing,
                "replicas": [{"name": "a", "api_base": "http://127.0.0.1:1/v1", "events": "tcp://127.0.0.1:1"}],
            }
        ]
    }


def test_precise_mode_refuses_the_text_tokenizer_naming_both_fields() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(route(prefix={"mode": "precise", "tokenizer": "text"}))
    assert "routing.prefix.mode: precise" in err.value.message
    assert "routing.prefix.tokenizer: text" in err.value.message
    cfg = PrefixConfig(mode="precise")
    assert cfg.tokenizer == "auto" and cfg.block_size is None  # both from the engine
    with pytest.raises(ValueError, match="auto needs routing.prefix.mode: precise"):
        PrefixConfig(tokenizer="auto")


def test_salts_are_per_tenant_secret_and_fold_in_the_clients(tmp_path: Path) -> None:
    secret = load_secret(tmp_path, None)
    assert load_secret(tmp_path, None) == secret  # kept: a restart keeps the engine's cache usable
    assert stat.S_IMODE((tmp_path / "salt.key").stat().st_mode) == 0o600
    salter = Salter(secret)
    a, b = salter.salt("tenant-a"), salter.salt("tenant-b")
    assert a != b and len(a) == 32 and "tenant-a" not in a
    assert Salter(b"another secret of 32 bytes......").salt("tenant-a") != a  # not guessable without it
    assert salter.salt("tenant-b", a) not in (a, b)  # a client naming A's salt gets neither A's nor its own
    assert salter.salt(None, "mine") == "mine" and salter.salt(None) is None  # scope shared: the client's own


def test_a_salted_prompt_and_the_engines_salted_event_hash_alike() -> None:
    hasher = PromptHasher(TextTokenizer(), BS, seed="kvgate")
    tokens = TextTokenizer().encode("".join(TextTokenizer().segments(MESSAGES)))
    salted, plain = hasher.prompt(MESSAGES, salt="s1").hashes, hasher.prompt(MESSAGES).hashes
    assert set(salted).isdisjoint(plain) and set(salted).isdisjoint(hasher.prompt(MESSAGES, salt="s2").hashes)
    index = PrefixIndex(None)
    index.add_replica("a")
    applier = EventApplier(index, "a", BS, seed="kvgate")
    n = len(tokens) // BS
    applier.apply(
        BlockStored(list(range(1, n + 1)), None, tokens[: n * BS], BS, extra_keys=[("s1",)] + [None] * (n - 1))
    )
    assert index.match(salted)["a"] == len(salted) and index.match(plain)["a"] == 0


def test_engine_hash_check_follows_vllms_sha256() -> None:
    assert vllm_first_block_hash(list(range(BS))) == vllm_first_block_hash(list(range(BS)))
    assert vllm_first_block_hash(list(range(BS)), "x") != vllm_first_block_hash(list(range(BS)))
    assert vllm_first_block_hash(list(range(BS)), seed="other") != vllm_first_block_hash(list(range(BS)))
    assert checkable_salt(None) == (True, None) and checkable_salt(("s",)) == (True, "s")
    assert checkable_salt(("lora", "s"))[0] is False
    index = PrefixIndex(None)
    index.add_replica("a")
    applier = EventApplier(index, "a", BS)
    tokens = list(range(BS))
    applier.apply(BlockStored([vllm_first_block_hash(tokens)], None, tokens, BS))
    applier.apply(BlockStored([12345], None, [9, 9, 9, 9], BS))
    assert applier.stats()["engine_hash_checked"] == 2 and applier.stats()["engine_hash_differs"] == 1


def test_vllm_adapter_reads_version_block_size_and_socket_roles() -> None:
    assert parse_version("0.32.0") == (0, 32, 0) and parse_version("0.32.1rc1+cpu") == (0, 32, 1)
    assert version_error("0.32.0") is None
    assert "0.31.2" in version_error("0.31.2") and ">= 0.32.0" in version_error("0.33.0")
    text = '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="128",kv_cache_size_tokens="46592",engine="0"} 1.0\n'
    assert cache_config(text)["block_size"] == "128" and cache_config("garbage{") == {}
    assert not binds("tcp://127.0.0.1:5557") and binds("tcp://*:5557") and binds("ipc:///tmp/x")


def test_a_gap_is_filled_from_the_replay_socket() -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    batches = [
        encode_batch(
            KVEventBatch(ts=0.0, events=[BlockStored([i + 1], i or None, list(range(i * BS, (i + 1) * BS)), BS)])
        )
        for i in range(4)
    ]

    def serve_replay() -> None:
        if router.poll(5000):
            client, _, start = router.recv_multipart()
            for seq in range(int.from_bytes(start, "big"), 3):
                router.send_multipart([client, b"", b"kv", seq.to_bytes(8, "big"), batches[seq]])
            router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    index = PrefixIndex(None)
    index.add_replica("a")
    sub = ZmqEventSubscriber(
        f"tcp://127.0.0.1:{pub_port}", EventApplier(index, "a", BS), replay=f"tcp://127.0.0.1:{replay_port}"
    ).start()
    server = threading.Thread(target=serve_replay, daemon=True)
    server.start()
    try:
        assert wait_until(
            lambda: (pub.send_multipart([b"kv", (0).to_bytes(8, "big"), batches[0]]), sub.feed.last_seq == 0)[1], 5
        )
        pub.send_multipart([b"kv", (3).to_bytes(8, "big"), batches[3]])  # 1 and 2 were lost
        assert wait_until(lambda: sub.feed.last_seq == 3, 5)
        stats = sub.feed.stats()
        assert sub.replayed == 2 and stats.gaps == 0 and stats.resyncs == 0 and stats.blocks_stored == 4
    finally:
        sub.stop()
        server.join(1)
        pub.close(0)
        router.close(0)
        ctx.term()


def test_precise_checks_count_unmatched_requests_and_drop_a_silent_replica() -> None:
    now = [0.0]
    index = PrefixIndex(None)
    index.add_replica("a")
    cfg = PrefixConfig(mode="precise", tokenizer="codepoints", block_size=BS)
    replica = ReplicaConfig(name="a", api_base="http://127.0.0.1:1/v1", events="tcp://127.0.0.1:1")
    hashers: list[PromptHasher] = []
    precise = PreciseRouting("r", cfg, index, [replica], hashers.append, clock=lambda: now[0])
    try:
        assert hashers and hashers[-1].block_size == BS
        applier = precise.subscribers["a"].applier
        ours = hashers[-1].prompt(MESSAGES).hashes
        long = precise.sent("a", ours)  # a long prefill: judged only once it finished
        for _ in range(6):  # others finish meanwhile, long after it was sent
            now[0] += 2
            precise.finished(precise.sent("a", []), True)
        assert precise.counts["a"] == {"matched": 0, "unmatched": 0, "stale_drops": 0}
        applier.apply(BlockStored([7], None, [1, 2, 3, 4], BS))  # other tokens than we hashed
        precise.finished(long, True)
        precise.check()
        assert precise.counts["a"]["unmatched"] == 0  # its events get CHECK_AFTER_S to arrive
        now[0] += 2
        precise.check()
        assert precise.counts["a"]["unmatched"] == 1
        precise.finished(precise.sent("a", ours), False)  # failed: it may have stored nothing
        now[0] += 2
        precise.check()
        assert precise.counts["a"] == {"matched": 0, "unmatched": 1, "stale_drops": 0}
        for _ in range(5):  # answered, and the engine says nothing at all: its events stopped
            precise.finished(precise.sent("a", ours), True)
            now[0] += 2
            precise.check()
        assert precise.counts["a"]["stale_drops"] == 1 and index.blocks("a") == 0
    finally:
        precise.close()


def test_the_launcher_asks_for_float32_only_on_an_x86_cpu_without_native_bfloat16(tmp_path: Path) -> None:
    from kvgate.engines.vllm.host_dtype import dtype_for, host_dtype
    from kvgate.engines.vllm.launch import VllmServer

    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nmodel name\t: AMD EPYC\n"
    amx = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
    assert dtype_for(avx2) == "float32"
    assert dtype_for(amx) == "auto" and dtype_for(amx.replace(" avx512_bf16", "")) == "auto"
    assert dtype_for("processor\t: 0\nFeatures\t: fp asimd bf16\n") == "auto"  # not x86: the engine's choice
    assert dtype_for("") == "auto" and host_dtype(tmp_path / "absent") == "auto"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(avx2)
    assert host_dtype(cpuinfo) == "float32"
    server = VllmServer(model="m", dtype="bfloat16")
    assert server.argv()[server.argv().index("--dtype") + 1] == "bfloat16"
    chosen = VllmServer(model="m").argv()
    assert ("--dtype" in chosen) == (host_dtype() != "auto")


def test_a_server_that_never_answers_says_what_its_port_answered(tmp_path: Path) -> None:
    """The readiness wait of a launched vLLM server names what its port answered last and the
    log's last line, so a start-up that logged success but never listed its models (another
    process on the port) is told apart from a slow one."""
    import http.server

    from kvgate.engines.vllm.launch import VllmServer

    class NotVllm(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), NotVllm)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    log = tmp_path / "vllm.log"
    log.write_text("INFO loading\nINFO:     Application startup complete.\n\n")
    try:
        server = VllmServer("model", port=other.server_address[1], log_path=log)
        assert server.probe() == "HTTPError: HTTP Error 404: Not Found"
        with pytest.raises(RuntimeError) as late:
            server.wait_ready(timeout=1.0)
    finally:
        other.shutdown()
        other.server_close()
    message = str(late.value)
    assert "HTTP Error 404" in message and "Application startup complete." in message, message
    assert "Connection refused" in (server.probe() or "")  # nothing listens there any more
