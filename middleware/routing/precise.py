"""Precise mode of one route: the engines' KV events in the prefix index, hashed as the engines cut.

Owns the replicas' event subscribers, the hashing set-up the engines dictate and the checks that
say when the router and an engine disagree:

- Block size: the route's `routing.prefix.block_size` if set, replaced by the engine's own (its
  `/metrics` says it, its first BlockStored too); a disagreement is logged, the engine wins.
- Tokenizer: `routing.prefix.tokenizer` if it names one; `auto` loads the tokenizer (and chat template)
  from the model dir the engine reports serving, when that dir exists on this machine.
- Until both are known the route routes by load alone (an empty match), never on a guess.
- Socket roles and replay come from the engine's own event config (kvgate.middleware.engines).
- Disagreement: a routed request's first block should show up in its replica's view once the
  engine has stored it. When the engine stored blocks meanwhile and none is the request's, the
  hashes differ (another tokenizer or chat template): counted per replica (`unmatched`) and
  logged. When the engine stored nothing for STALE_REQUESTS routed requests in a row, its events
  have stopped: its view is dropped (`stale_drops`) until events resume.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvgate.index.kv.kv_events import EventApplier, ZmqEventSubscriber
from kvgate.index.kv.prefix import EVENT_FED_CAPACITY, PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import ChatTokenizer, load_tokenizer, tokenizer_backend
from kvgate.middleware.config import PrefixConfig, ReplicaConfig
from kvgate.middleware.engines.base import EngineInfo
from kvgate.middleware.routing.tiers import TierMedia

log = logging.getLogger("kvgate.router")

CHECK_AFTER_S = 1.0  # a routed request is judged this long after it finished (events arrive meanwhile)
STALE_REQUESTS = 5  # routed requests in a row with no event at all: the replica's events stopped
WATCHED_MAX = 256  # finished requests awaiting their verdict (bounded)
WINDOW = 20  # verdicts looked at when deciding to warn


@dataclass
class Watch:
    """A routed request as precise mode judges it: what its replica's feed had applied when it
    was sent (`PreciseRouting.sent`), judged once it finished (`PreciseRouting.finished`)."""

    replica: str
    first: int  # the request's first block hash, in the router's space
    stored_before: int  # blocks the replica's feed had stored when the request was sent
    batches_before: int
    due: float = 0.0  # when it is judged: set as the request finishes


class PreciseRouting:
    def __init__(
        self,
        route: str,
        cfg: PrefixConfig,
        index: PrefixIndex,
        replicas: list[ReplicaConfig],
        on_hasher: Callable[[PromptHasher], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.route = route
        self.cfg = cfg
        self.index = index
        self._on_hasher = on_hasher
        self._clock = clock
        self._lock = threading.Lock()
        self.block_size: int | None = cfg.block_size
        self.tokenizer: ChatTokenizer | None = None
        self.tokenizer_error: str | None = None
        if cfg.tokenizer not in (None, "auto"):
            self.tokenizer = load_tokenizer(cfg.tokenizer)
        else:
            # picked here, on the constructing thread: picking imports transformers where it is
            # installed, and its lazy imports are not safe when two discovery threads reach them first
            tokenizer_backend()
        self.subscribers: dict[str, ZmqEventSubscriber] = {}
        self.tiers = TierMedia(index, cfg.capacity_blocks or EVENT_FED_CAPACITY)  # KV tiers the engines report
        self._configs: dict[str, ReplicaConfig] = {}
        self._watch: deque[Watch] = deque(maxlen=WATCHED_MAX)
        self._verdicts: deque[bool] = deque(maxlen=WINDOW)
        self.counts: dict[str, dict[str, int]] = {}
        self._silent: dict[str, int] = {}
        self._warned_at = -1e9
        self._in_use: tuple[ChatTokenizer | None, int | None] = (None, None)
        self._hash_warned = False
        self._loading = False  # a tokenizer is being loaded from an engine's model dir
        for r in replicas:
            self.subscribe(r)
        self._maybe_ready()

    # ------------------------------------------------------------------ subscribers
    def subscribe(self, replica: ReplicaConfig, info: EngineInfo | None = None) -> None:
        """(Re)start the replica's subscriber, binding or connecting as its engine publishes."""
        if not replica.events:
            return
        bind = info is not None and info.events_bind
        replay = info.replay if info is not None else None
        old = self.subscribers.get(replica.name)
        if old is not None and (old.endpoint, old.bind, old.replay) == (replica.events, bind, replay):
            return  # already listening as this engine publishes (e.g. the same engine, restarted)
        old = self.subscribers.pop(replica.name, None)
        if old is not None:
            old.stop()
        applier = EventApplier(
            self.index,
            replica.name,
            self.block_size,
            seed=self.cfg.seed,
            on_block_size=self._block_size_seen,
            tiers=self.tiers,
        )
        self._configs[replica.name] = replica
        self.counts.setdefault(replica.name, {"matched": 0, "unmatched": 0, "stale_drops": 0})
        self.subscribers[replica.name] = ZmqEventSubscriber(replica.events, applier, bind=bind, replay=replay).start()

    def unsubscribe(self, name: str) -> None:
        sub = self.subscribers.pop(name, None)
        if sub is not None:
            sub.stop()
        self._configs.pop(name, None)

    def close(self) -> None:
        for sub in self.subscribers.values():
            sub.stop()

    # ------------------------------------------------------------------ what the engines say
    def engine_found(self, name: str, info: EngineInfo) -> None:
        """A replica's engine described itself (in a worker thread: loading a tokenizer is slow)."""
        if info.kind != "vllm":
            if self.cfg.tokenizer == "auto" and self.tokenizer is None:
                self._tokenizer_error(
                    f"replica {name} is not a vLLM server, so it reports no model dir; set "
                    "routing.prefix.tokenizer to the replicas' tokenizer dir"
                )
            return
        cfg = self._configs.get(name)
        if cfg is not None and info.events_bind and (info.events_endpoint or "") != cfg.events:
            log.warning(
                "route %s: replica %s publishes its KV events to %s, not %s (replicas[].events); kvgate listens where the engine publishes",
                self.route,
                name,
                info.events_endpoint,
                cfg.events,
            )
            cfg = cfg.model_copy(update={"events": info.events_endpoint})
        if cfg is not None and (info.events_bind or info.replay):
            self.subscribe(cfg, info)
        if info.block_size is not None:
            self._block_size_seen(name, info.block_size)
        if self.tokenizer is None and self.cfg.tokenizer == "auto" and not self._loading:
            # loading takes seconds: on a thread of its own, so requests (routed by load until
            # then) never wait for it
            self._loading = True
            threading.Thread(
                target=self._load_tokenizer,
                args=(name, info.model_root),
                daemon=True,
                name=f"kvgate-tokenizer-{self.route}",
            ).start()
        self._maybe_ready()

    def _load_tokenizer(self, name: str, root: str | None) -> None:
        try:
            self._tokenizer_from(name, root)
        finally:
            self._loading = False
        self._maybe_ready()

    def _tokenizer_from(self, name: str, root: str | None) -> None:
        path = Path(root) if root else None
        if (
            path is None
            or not path.is_dir()
            or not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
        ):
            self._tokenizer_error(
                f"replica {name} serves {root!r}, which is not a model dir on this machine; "
                "set routing.prefix.tokenizer to a local copy of its tokenizer (a dir with "
                "tokenizer.json and the chat template)"
            )
            return
        try:
            self.tokenizer = load_tokenizer(str(path))
            self.tokenizer_error = None
            log.info(
                "route %s: precise routing tokenizes with %s (the model dir replica %s serves)", self.route, path, name
            )
        except Exception as exc:  # a broken dir: say it, keep routing by load
            self._tokenizer_error(f"the tokenizer in {path} (served by replica {name}) failed to load: {exc}")

    def _tokenizer_error(self, message: str) -> None:
        if self.tokenizer_error != message:
            log.error(
                "route %s: precise routing cannot match prefixes: %s; until then requests are routed by load alone",
                self.route,
                message,
            )
        self.tokenizer_error = message

    def _block_size_seen(self, name: str, size: int) -> None:
        with self._lock:
            if size == self.block_size:
                return
            if self.block_size is not None:
                log.warning(
                    "route %s: replica %s cuts KV blocks of %d tokens, routing.prefix.block_size says "
                    "%d; using the engine's %d (leave routing.prefix.block_size out in precise mode)",
                    self.route,
                    name,
                    size,
                    self.block_size,
                    size,
                )
            self.block_size = size
        for sub in self.subscribers.values():
            sub.applier.set_block_size(size)
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        with self._lock:
            setting = (self.tokenizer, self.block_size)
            if self.tokenizer is None or self.block_size is None or setting == self._in_use:
                return
            self._in_use = setting
        self._on_hasher(PromptHasher(self.tokenizer, self.block_size, seed=self.cfg.seed))

    def readiness(self) -> str | None:
        """None once prompts are hashed as the engines hash them (tokenizer and block size known),
        or once that cannot happen without the operator (`tokenizer_error`: routed by load, and
        said in the log); else what is still awaited."""
        if self.tokenizer_error is not None or self._in_use[0] is not None:
            return None
        if self._loading:
            return "loading the engines' tokenizer"
        return "waiting for an engine to describe itself (its tokenizer and block size)"

    # ------------------------------------------------------------------ disagreement
    def sent(self, replica: str, hashes: list[int]) -> Watch | None:
        """A request with these prompt hashes went to `replica`: what the replica's feed had
        applied by then, to judge the request by once it finished (None: nothing to judge)."""
        sub = self.subscribers.get(replica)
        if not hashes or sub is None:
            return None
        return Watch(replica, hashes[0], sub.applier.stored, sub.feed.batches)

    def finished(self, watch: Watch | None, ok: bool) -> None:
        """The request `sent` returned `watch` for ended (`ok`: it was answered): it is judged
        CHECK_AFTER_S from now, however long it ran (a long prefill stores its blocks late, and
        their events arrive after the answer). A failed request is not judged: it may have
        stored nothing. Then judge whatever is due."""
        if watch is not None and ok:
            watch.due = self._clock() + CHECK_AFTER_S
            with self._lock:
                self._watch.append(watch)  # in order of finishing, so in order of `due`
        self.check()

    def check(self) -> None:
        """Judge the finished requests whose time has come (cheap; called as requests finish)."""
        now = self._clock()
        due: list[Watch] = []
        with self._lock:
            while self._watch and self._watch[0].due <= now:
                due.append(self._watch.popleft())
        for w in due:
            self._judge(w)

    def _judge(self, w: Watch) -> None:
        sub = self.subscribers.get(w.replica)
        counts = self.counts.get(w.replica)
        if sub is None or counts is None:
            return
        if self.index.match([w.first]).get(w.replica, 0) > 0:
            counts["matched"] += 1
            self._silent[w.replica] = 0
            self._verdicts.append(True)
            return
        if sub.applier.stored > w.stored_before:
            counts["unmatched"] += 1
            self._silent[w.replica] = 0
            self._verdicts.append(False)
            self._warn_unmatched(w.replica)
            return
        if sub.feed.batches > w.batches_before:
            return  # events came (removals, re-stores): no verdict either way
        self._silent[w.replica] = self._silent.get(w.replica, 0) + 1
        if self._silent[w.replica] >= STALE_REQUESTS:
            self._silent[w.replica] = 0
            counts["stale_drops"] += 1
            log.warning(
                "route %s: replica %s sent no KV events for %d routed requests in a row; its view is "
                "dropped until its events resume (check the engine's --kv-events-config and replicas[].events)",
                self.route,
                w.replica,
                STALE_REQUESTS,
            )
            self.drop(w.replica)

    def drop(self, name: str) -> None:
        """Forget what replica `name` holds (its engine is gone, or its events stopped); the
        events that follow rebuild it."""
        sub = self.subscribers.get(name)
        if sub is not None:
            sub.applier.reset()

    def _warn_unmatched(self, replica: str) -> None:
        now = self._clock()
        if now - self._warned_at < 60:
            return
        self._warned_at = now
        bad = sum(1 for v in self._verdicts if not v)
        log.error(
            "route %s: replica %s stored KV blocks for a routed request, but none matches the hashes kvgate "
            "computed for it (%d of the last %d requests): the router's tokenizer or chat template differs "
            "from the engine's (routing.prefix.tokenizer: %s); prefix matches will be missed",
            self.route,
            replica,
            bad,
            len(self._verdicts),
            self.cfg.tokenizer,
        )

    def stats(self) -> dict[str, dict[str, object]]:
        """Per replica: verdict counts, replayed batches and the engine-hash check (`engine_hash`:
        sha256 = vLLM's default, differs = another seed or algorithm, unknown = not checked yet)."""
        out: dict[str, dict[str, object]] = {}
        for name, sub in self.subscribers.items():
            applied = sub.applier.stats()
            checked, differs = applied["engine_hash_checked"], applied["engine_hash_differs"]
            out[name] = {
                **self.counts.get(name, {}),
                "replayed_batches": sub.replayed,
                "engine_hash": "unknown" if not checked else "differs" if differs else "sha256",
            }
        kinds = {str(v["engine_hash"]) for v in out.values()} - {"unknown"}
        if len(kinds) > 1 and not self._hash_warned:
            self._hash_warned = True
            log.warning(
                "route %s: the replicas hash KV blocks differently (%s): one runs with PYTHONHASHSEED set "
                "or another --prefix-caching-hash-algo, so they cannot share KV by hash (routing is "
                "unaffected)",
                self.route,
                {k: v["engine_hash"] for k, v in out.items()},
            )
        return out
