"""The bench of `kvgate bench vllm` (tools/bench/vllm_arena.py) and `kvgate bench vllm-client`: two
real vLLM servers, one router at a time in front of them, and one measured run of an arm on cold
engine caches, with vLLM's counters, CPU and the oracle's cached tokens of what it sent.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import httpx
import yaml

from kvgate.engines.vllm.launch import VllmServer, default_model_dir, start_pair, tier_settings
from kvgate.middleware.progress import Progress, say
from kvgate.tools.bench.arena_routers import anchor_launch
from kvgate.tools.bench.procs import Proc, free_port
from kvgate.tools.bench.vllm_arena_client import ENDPOINTS, Turn, converse, inter_token_gaps
from kvgate.tools.bench.vllm_arena_cpu import CpuWindow, cpu_fields, idle_cpu_ms_per_s, replica_summary, request_records
from kvgate.tools.bench.vllm_arena_setup import (
    ANCHOR_OF,
    MODEL,
    REPLAY_ARM,
    kvgate_config,
    other_vllm_servers,
    serve_argv,
    signals_deferred,
    wait_workers,
    warm_up,
)
from kvgate.tools.bench.vllm_arena_stats import (
    Computed,
    computed_per_server,
    counters,
    engine_latency,
    loop_lag,
    metric_labels,
    metric_sum,
    oracle_cached,
    render_requests,
    run_summary,
)
from kvgate.tools.bench.wire_capture import Capture
from kvgate.tools.bench.wire_hops import hops as wire_hops
from kvgate.tools.bench.wire_hops import summary as wire_summary


class Bench:
    """The two vLLM servers, and one router at a time in front of them."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.model_dir = str(default_model_dir())
        self.servers: list[VllmServer] = []
        self.count = 0
        self.log = say("vllm-arena")

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{s.port}" for s in self.servers]

    def start(self) -> None:
        t0 = time.perf_counter()
        self.log(f"starting two vLLM servers ({self.model_dir}, logs in {self.work})")
        for attempt in range(1, 4):
            try:  # a port picked free can be taken before vLLM binds it (its own ZMQ sockets, other processes)
                with signals_deferred(self.log):
                    tier = tier_settings(self.work / "kv-tier") if self.args.kv_connector else None
                    self.servers = start_pair(
                        self.model_dir,
                        served_name=MODEL,
                        log_dir=self.work,
                        kv_cache_gib=self.args.kv_cache_gib,
                        kv_connector=tier,
                        extra_env={"VLLM_SERVER_DEV_MODE": "1"},
                    )
                break
            except RuntimeError as exc:
                if attempt == 3:
                    raise
                self.log(f"vLLM start failed ({exc}); trying again on other ports")
        self.log(f"vLLM up on ports {[s.port for s in self.servers]} in {time.perf_counter() - t0:.0f}s")

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def pages(self) -> list[str]:
        return [httpx.get(f"{b}/metrics", timeout=30).text for b in self.bases]

    def reset(self, timeout: float = 60.0) -> None:
        """Empty both prefix caches, and the connector's tier (vLLM refuses while blocks are held: retried)."""
        query = "?reset_external=true" if self.args.kv_connector else ""
        for b in self.bases:
            deadline = time.monotonic() + timeout
            while not httpx.post(f"{b}/reset_prefix_cache{query}", timeout=30).json().get("success"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{b}: /reset_prefix_cache kept failing for {timeout:.0f}s")
                time.sleep(0.5)

    def engine_info(self) -> dict[str, Any]:
        info = metric_labels(self.pages()[0], "vllm:cache_config_info")
        version = httpx.get(f"{self.bases[0]}/version", timeout=10).json().get("version")
        return {
            "kv_cache_tokens": int(info["kv_cache_size_tokens"]) if "kv_cache_size_tokens" in info else None,
            "block_size": int(info.get("block_size", 0)) or None,
            "vllm_version": version,
        }

    def niced(self, argv: list[str]) -> list[str]:
        """A router's command at --router-nice and --router-slice-us (nice and the slice's launcher
        exec it: the pid, and its CPU, are the router's)."""
        nice, slice_us = getattr(self.args, "router_nice", 0), getattr(self.args, "router_slice_us", 0)
        if slice_us:
            argv = [sys.executable, "-m", "kvgate.tools.bench.sliced", str(slice_us), "--", *argv]
        return ["nice", "-n", str(nice), *argv] if nice else argv

    def router(self, arm: str, params: dict[str, Any]) -> tuple[Proc, str, str]:
        """Start `arm`'s router: (process, the URL of --endpoint's path on it, label)."""
        self.count += 1
        port, name = free_port(), f"{arm}-{self.count}"
        if arm in ANCHOR_OF:
            launch = anchor_launch(ANCHOR_OF[arm], port, self.bases, params, None)
            assert launch is not None and launch.argv is not None  # preflight checked the binary
            proc, label = Proc(name, self.niced(launch.argv), self.work), launch.label
        else:
            cfg = self.work / f"{name}.yaml"
            cfg.write_text(
                yaml.safe_dump(kvgate_config(arm, self.servers, self.work / f"cache-{name}", self.model_dir))
            )
            proc = Proc(
                name, self.niced(serve_argv(arm, cfg, port)), self.work, env={"TOKENIZERS_PARALLELISM": "false"}
            )
            label = f"kvgate {arm.removeprefix('kvgate_')}"
        try:
            proc.wait_http(f"http://127.0.0.1:{port}/health", timeout=180)
            if arm in ANCHOR_OF:  # they register workers in the background (sglang: seconds): wait for both
                wait_workers(f"http://127.0.0.1:{port}/readiness", len(self.servers))
            else:  # precise mode loads the engines' tokenizer after they describe themselves: until /ready
                proc.wait_http(f"http://127.0.0.1:{port}/ready", timeout=180)
        except BaseException:  # Ctrl-C included: the router runs in its own session
            proc.stop()
            raise
        return proc, f"http://127.0.0.1:{port}{ENDPOINTS[self.args.endpoint]}", label

    def replay(
        self, placed: dict[tuple[int, int], str]
    ) -> tuple[str, Callable[[Turn], tuple[str, str]], list[tuple[int, int]]]:
        """The replay arm's targets: (warm-up URL, where each turn goes, [turns not placed]); a turn
        the replayed run did not place (it failed there) goes to engine conversation % 2."""
        path = ENDPOINTS[self.args.endpoint]
        names = [f"v{i}" for i in range(len(self.servers))]  # kvgate_config's replica names
        unplaced: list[tuple[int, int]] = []

        def place(turn: Turn) -> tuple[str, str]:
            name = placed.get((turn.conversation, turn.turn))
            if name not in names:
                unplaced.append((turn.conversation, turn.turn))
                name = names[turn.conversation % len(names)]
            return name, self.bases[names.index(name)] + path

        return self.bases[0] + path, place, unplaced

    def capture(self, arm: str, url: str) -> Capture | None:
        """With --wire, a capture of a routed run's router and engine ports (the replay arm has no router)."""
        if not getattr(self.args, "wire", False) or arm == REPLAY_ARM:
            return None
        return Capture(self.work / f"wire-{arm}-{self.count}.pcap", [_port(url), *(s.port for s in self.servers)])

    def run(
        self,
        arm: str,
        params: dict[str, Any],
        texts: list[list[str]],
        tag: str,
        block_size: int,
        placed: dict[tuple[int, int], str] | None = None,
    ) -> dict[str, Any]:
        """One run of `arm` on the conversations `texts`, cold engine caches; the run's summary.
        The replay arm starts no router: `placed` says where each turn goes."""
        place, unplaced = None, []
        if arm == REPLAY_ARM:
            url, place, unplaced = self.replay(placed or {})
            proc, label = None, "no router: kvgate precise's placements replayed"
        else:
            proc, url, label = self.router(arm, params)
        kvgate_arm = arm != REPLAY_ARM and arm not in ANCHOR_OF
        capture = self.capture(arm, url)
        try:
            asyncio.run(warm_up(url, endpoint=self.args.endpoint))
            self.reset()
            others = other_vllm_servers([s.proc.pid for s in self.servers if s.proc is not None])
            if others:
                self.log(f"warning: {others} other vLLM server(s) running: this run's timings share the cores")
            before_pages = self.pages()
            own = url.removesuffix(ENDPOINTS[self.args.endpoint]) + "/metrics" if kvgate_arm else None
            own_before = httpx.get(own, timeout=30).text if own else ""
            total = sum(len(t) for t in texts)
            router_pids = [proc.proc.pid] if proc is not None else []
            idle = idle_cpu_ms_per_s(router_pids, self.args.idle_s)
            cpu = CpuWindow({"router": router_pids, "engines": [s.proc.pid for s in self.servers if s.proc]})
            if capture is not None:
                capture.start()
            t0 = time.perf_counter()
            cpu.start()
            with Progress(total, f"{arm} {tag}", unit="requests") as bar:
                turns = asyncio.run(
                    converse(
                        url,
                        texts,
                        model=MODEL,
                        max_tokens=self.args.max_tokens,
                        concurrency=self.args.concurrency,
                        on_turn=lambda _: bar.update(),
                        endpoint=self.args.endpoint,
                        place=place,
                    )
                )
            spent = cpu.stop()
            wall = time.perf_counter() - t0
            packets = capture.stop() if capture is not None else b""
            time.sleep(1.0)  # the engines' last stats reach /metrics
            after_pages = self.pages()
            lag = loop_lag(own_before, httpx.get(own, timeout=30).text) if own else None
        finally:
            if capture is not None:
                capture.stop()
            if proc is not None:
                proc.stop()
        summary_wire: dict[str, Any] = {}
        if capture is not None:
            if packets:
                summary_wire = wire_summary(
                    wire_hops(packets, _port(url), [s.port for s in self.servers], self.args.endpoint)
                )
            capture.path.unlink(missing_ok=True)
        per_server = [
            int(metric_sum(a, "vllm:request_success_total") - metric_sum(b, "vllm:request_success_total"))
            for a, b in zip(after_pages, before_pages)
        ]
        ok = [t for t in turns if t.error is None]
        rendered = render_requests(after_pages)
        before_rendered = render_requests(before_pages)
        oracle = self.oracle(ok, block_size)
        summary = run_summary(
            [t.ttft for t in ok if t.ttft is not None],
            [t.error for t in turns if t.error],
            len(turns),
            counters(before_pages),
            counters(after_pages),
            not_sent=total - len(turns),
            wall_s=round(wall, 2),
            requests_per_server=per_server,
            computed_tokens_per_server=computed_per_server(before_pages, after_pages),
            other_vllm_servers=others,
            render_requests=None if rendered is None else int(rendered - (before_rendered or 0)),
            usage_prompt_tokens=sum(t.prompt_tokens or 0 for t in ok),
            usage_cached_tokens=sum(t.cached_tokens or 0 for t in ok),
            total_mean_s=round(statistics.fmean(t.done - t.sent for t in ok), 4) if ok else None,
            inter_token_mean_s=round(statistics.fmean(gaps), 5) if (gaps := inter_token_gaps(ok)) else None,
            **engine_latency(before_pages, after_pages),
            **oracle,
            **cpu_fields(spent, len(turns), wall, idle, cpu.waited, cpu.main_waited),
            request_records=(records := request_records(turns)),
            per_replica=replica_summary(records),
        )
        summary.update(router=label, params=params, **summary_wire)
        if lag is not None:
            summary["router_loop_lag"] = lag
        if arm == REPLAY_ARM:
            summary["unplaced_turns"] = len(unplaced)
        return summary

    def oracle(self, turns: Sequence[Turn], block_size: int) -> dict[str, Any]:
        """The oracle on what this run sent: token ids from vLLM's own /tokenize (its chat template for
        chat turns; a completions prompt as /v1/completions tokenizes it)."""
        base = self.bases[0]
        with httpx.Client(timeout=60) as client:

            def tokens(body: dict[str, Any]) -> list[int]:
                return client.post(f"{base}/tokenize", json={"model": MODEL, **body}).json()["tokens"]

            reqs, mismatched = [], 0
            for t in turns:
                prompt = tokens(
                    {"messages": t.messages, "add_generation_prompt": True}
                    if t.prompt is None
                    else {"prompt": t.prompt}
                )
                out = tokens({"prompt": t.answer, "add_special_tokens": False}) if t.answer else []
                # the last generated token's KV is never computed: an answer cut at max_tokens loses its
                # last token, one that stopped at EOS loses the EOS (not in the answer's text)
                reqs.append(Computed(t.sent, t.done, prompt, out[:-1] if t.finish_reason == "length" else out))
                mismatched += t.prompt_tokens is not None and t.prompt_tokens != len(prompt)
        hits = oracle_cached(reqs, block_size)
        prompt_total = sum(len(r.prompt) for r in reqs)
        return {
            "oracle_cached_tokens": sum(hits),
            "oracle_prompt_tokens": prompt_total,
            "prompt_tokens_max": max((len(r.prompt) for r in reqs), default=0),
            "oracle_cached_fraction": sum(hits) / prompt_total if prompt_total else None,
            "oracle_prompt_mismatches": mismatched,
        }


def _port(url: str) -> int:
    """The TCP port of an http://127.0.0.1:PORT/... URL."""
    return urlsplit(url).port or 80
