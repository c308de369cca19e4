"""A request's routing plan: its prompt's chained block hashes and the blocks each replica holds.

Work that grows with the prompt (rendering, tokenising, hashing, matching) can be done ahead, in a
worker thread, so the event loop only chooses: `prepare(messages)` before `plan` of the same
messages list (optional: without it `plan` computes the same hashes itself), and
`answer_hashes(plan, conversation)` for the router's `finished`, wherever the caller's record
step runs. With `pending` (PendingAnswers: this process routes alone) an answer is only noted
there, and hashed by the next turn's `prepare` or `plan` before its match (pending_answers.py).

With deferred records (approximate mode) or a deferred in-flight view (precise mode), `prepare`
hashes a prompt only up to a block no replica holds, and the recorder or the in-flight view
completes it off the request's path (kvgate.index.kv.prompt, inflight.py).

With deferred records, `prepare` waits up to SETTLE_WAIT_S for the records submitted before it
whose chains start as its prompt does (records.py), so a next turn normally finds its previous
answer's blocks, and a prompt nobody recorded a start of is not held up by the others; bounded,
because under overload an unbounded wait queues every request behind the recorder.

Invariant: a plan's match is the full one: hashing stops early only past a block no replica holds.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import Prompt, PromptHasher, PromptHashes, TextPrompt, message_runs, next_run
from kvgate.middleware.routing.base import RoutePlan
from kvgate.middleware.routing.inflight import InFlightPrefixes
from kvgate.middleware.routing.pending_answers import AnswerNote, PendingAnswers
from kvgate.middleware.routing.records import Records
from kvgate.middleware.routing.tiers import TierMedia

PREPARED_MAX = 1024  # prompts hashed ahead and not yet planned (a plan normally follows at once)
# a prompt's estimated token count past 1 / this of the engines' context is counted exactly
CONTEXT_ESTIMATE_SLACK = 2
SETTLE_WAIT_S = 0.005  # how long `prepare` waits for the records before it (see the module docstring)


class Planner:
    def __init__(
        self,
        hasher: PromptHasher | None,
        index: PrefixIndex,
        records: Records,
        block_size: int,
        records_answers: bool,
        pending: PendingAnswers | None = None,
    ) -> None:
        self.hasher = hasher  # None in precise mode until the engines said how to hash
        self.index = index
        self.records = records
        self._block_size = block_size  # until there is a hasher
        self.records_answers = records_answers
        self.pending = pending if records_answers else None  # answers noted, hashed by their next turn
        # prompt + answer recorded as the answer finishes (it touches the whole chain then)
        self.answers_at_finish = records_answers and self.pending is None
        self.tiers: TierMedia | None = None  # precise mode's KV tiers, once the router has a feed
        self.inflight: InFlightPrefixes | None = None  # precise mode: prefixes routed, not yet reported
        self._lock = threading.Lock()
        # prompts hashed ahead, waiting for `plan` of the same list object (held, so its id cannot
        # be reused meanwhile); bounded in case a plan never comes
        self._prepared: OrderedDict[int, tuple[Sequence[dict[str, Any]], PromptHashes, dict[str, int]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        """Prompts prepared and not yet planned."""
        with self._lock:
            return len(self._prepared)

    @property
    def _completes_later(self) -> bool:
        """Whether a partial prompt is completed off the request's path: by the recorder
        (approximate mode) or by the in-flight view's own thread (precise mode)."""
        return self.records.deferred or (self.inflight is not None and self.inflight.deferred)

    @property
    def block_size(self) -> int:
        return self.hasher.block_size if self.hasher is not None else self._block_size

    def prepare(self, messages: Prompt, salt: str | None = None, context: int | None = None) -> None:
        """Hash and match a prompt ahead of its `plan` (thread-safe; meant for a worker thread).

        With deferred records or in-flight view, hashing stops soon after a block no replica holds
        (a match cannot pass it); the rest is hashed off the request's path (module docstring).
        If a record lands meanwhile and some replica holds every block hashed so far, the rest is
        hashed here and matched again, so the match is always the full one. `context`: the
        engines' context length (precise mode), for its check before the prompt is sent
        (kvgate.middleware.forward.failover): a token count estimated (a long message matched on
        its lead) past 1 / CONTEXT_ESTIMATE_SLACK of it is counted exactly here; one estimated
        far lower and over all the same is refused by the engine itself."""
        hasher = self.hasher
        if hasher is None:
            return
        prompt = self._hash(hasher, messages, salt, self.index.held if self._completes_later else None)
        self.records.settle(SETTLE_WAIT_S, prompt.hashes)
        if self.inflight is not None:
            self.inflight.expire()
        matched = self.index.match(prompt.hashes)
        if prompt.partial and max(matched.values(), default=0) >= len(prompt.hashes):
            matched = self.index.match(prompt.complete().hashes)
        elif context is not None and prompt.untokenized and prompt.tokens * CONTEXT_ESTIMATE_SLACK > context:
            prompt.complete()  # the match stays what the lead gave: no replica holds past it
        with self._lock:
            self._prepared[id(messages)] = (messages, prompt, matched)
            while len(self._prepared) > PREPARED_MAX:
                self._prepared.popitem(last=False)

    def plan(self, messages: Prompt, session: str | None = None, salt: str | None = None) -> RoutePlan:
        if session is None and messages and not isinstance(messages, TextPrompt):
            first = messages[0].get("content")
            session = first if isinstance(first, str) else None
        hasher = self.hasher
        if hasher is None:  # precise mode before the engines said how to hash: route by load
            return RoutePlan([], 0, self.block_size, {}, session, salt=salt)
        with self._lock:
            held = self._prepared.pop(id(messages), None)
        if held is not None and held[0] is messages:
            prompt, matched = held[1], held[2]
        else:  # not prepared: computed here, on the caller's thread, without waiting
            prompt = self._hash(hasher, messages, salt)
            if self.inflight is not None:
                self.inflight.expire()
            matched = self.index.match(prompt.hashes)
        tier_blocks: dict[str, int] = {}
        if self.inflight is not None:
            matched = self.inflight.fold(matched)
        if self.tiers is not None:
            matched, tier_blocks = self.tiers.split(matched)
        return RoutePlan(
            prompt.hashes,
            prompt.tokens,
            hasher.block_size,
            matched,
            session,
            shared_prefix=self.index.shared_match(prompt.hashes, matched),
            prompt=prompt,
            salt=salt,
            tier_blocks=tier_blocks,
        )

    def answer_hashes(self, plan: RoutePlan, conversation: Prompt) -> list[int] | AnswerNote | None:
        """What `finished` records of `conversation` (the plan's messages + one answer): with
        pending answers, a note for its next turn to hash (a chat; pending_answers.py); else its
        hashes, resuming from the prompt's own chain states so only the answer is tokenised. None
        when this route does not record answers, or when the plan was hashed with another block
        size (the engines said theirs since: mirror.py) (thread-safe; the caller's record step
        may run on a worker thread)."""
        hasher = self.hasher
        if not (self.records_answers and conversation and hasher is not None):
            return None
        if plan.block_size != hasher.block_size:
            return None
        if self.pending is not None and not isinstance(conversation, TextPrompt):
            run = plan.prompt.run if plan.prompt is not None else None
            key = next_run(run, conversation[-1]) if run is not None else message_runs(conversation)[-1]
            return AnswerNote(key, len(conversation), plan.salt)
        return hasher.prompt(conversation, plan.prompt, salt=plan.salt).hashes

    def answered(self, replica: str, hashes: list[int] | AnswerNote) -> None:
        """`replica` gave the answer `answer_hashes` worked out: recorded now, or noted."""
        if isinstance(hashes, AnswerNote):
            if self.pending is not None:
                self.pending.note(replica, hashes)
        else:
            self.records.record(replica, hashes)

    def forget(self, replica: str) -> None:
        """The replica left the route: no noted answer is recorded on it later."""
        if self.pending is not None:
            self.pending.forget(replica)

    def _hash(
        self, hasher: PromptHasher, messages: Prompt, salt: str | None, until: Callable[[int], bool] | None = None
    ) -> PromptHashes:
        """The prompt's hashes, once the noted answers it continues are recorded on the replicas
        that gave them (pending_answers.py), so that its match sees them. A noted conversation's
        prompt usually left its chain states in the hasher's caches: mostly its answer is new work."""
        runs = None
        if self.pending is not None and not isinstance(messages, TextPrompt):
            runs = message_runs(messages)
            for replica, count in self.pending.take(salt, runs):
                self.records.record(replica, hasher.prompt(messages[:count], salt=salt, runs=runs[:count]))
        return hasher.prompt(messages, until=until, salt=salt, runs=runs)
