"""A miss that a replica answers, as `Forwarder.forward` hands it to the pipeline.

`reply` is what the caller gets: LiteLLM's response, the replica's JSON body, or a stream (LiteLLM's
chunks, the replica's SSE bytes). Once the reply is complete (a stream: read to its end, `ok`),
`text` and `payload()` are the answer the pipeline records, and `hashes` what its record step
worked out for the router (prompt + answer, `Forwarder.hash_answer`). Each transport fills in its
own subclass (relay.py: `Relayed`; litellm_call.py: `Call`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvgate.middleware.forward.failover import Attempts
from kvgate.middleware.request import RequestView
from kvgate.middleware.routing.pending_answers import AnswerNote


@dataclass(eq=False)
class Forwarded:
    view: RequestView
    attempts: Attempts  # ticket (follows the replica now answering), plan and replicas tried
    reply: Any = None
    ok: bool = False  # the answer is complete (a stream reached its end)
    # prompt + answer's routing record (its hashes, or a note for its next turn), once the record step made it
    hashes: list[int] | AnswerNote | None = None
    # perf_counter when the request went to the answering replica and when its first bytes were
    # read (a stream: its first event); 0.0 where the transport does not stamp them
    sent_at: float = 0.0
    first_at: float = 0.0
    raw: ClassVar[bool] = False  # `reply` is the replica's own bytes (a stream then ends with [DONE])

    @property
    def text(self) -> str | None:
        """Choice 0's text (None when it has none: tool calls and the like)."""
        raise NotImplementedError

    def payload(self) -> dict[str, Any] | None:
        """The full answer as a dict, for the cache (None when it cannot be rebuilt); built on
        demand, so only a request that stores pays for it."""
        raise NotImplementedError

    @property
    def usage(self) -> Any:
        """The replica's own usage counts, when the transport reads them."""
        return None

    @property
    def ended(self) -> bool:
        """The replica has sent its stream's last event: what the stream last gave is its tail.
        False where the transport cannot tell."""
        return False
