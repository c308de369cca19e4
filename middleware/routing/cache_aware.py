"""cache_aware: minimise the request's expected time to first token, trading cache hits against
queueing, with a bound on how much queueing a prefix match may buy.

Per candidate replica r, in prefill tokens (the router knows no prefill rate, so tokens are its
unit of time), with P = prompt_tokens, e(r) = tokens r's engine holds, l(r) = tokens beyond those
it can load from a KV tier it reads (tiers.py), λ = what a loaded token costs in prefill tokens
(measured: load_cost.py), h(r) = e(r) + l(r) the tokens r need not recompute, M = max over
candidates of h:

    queue(r) = queued(r) + decode_weight · in_flight(r)            work ahead of us on r
    own(r)   = (P − h(r)) + λ · l(r)                                 our own prefill and loads
    ttft(r)  = queue(r) + own(r)
    cost(r)  = ttft(r) + (miss_weight − 1) · (M − h(r)) · M / P      ... plus the duplicate we make
             + stall_weight · in_flight(r) · own(r)                  ... plus the decodes we stall

With a tier every replica reads, l(r) makes a conversation's history cheap on any replica, so the
duplicate charge fades and load decides: blocks in the engine, then blocks a tier can supply,
then recompute, each at its measured cost (before λ is measured it is 1: a load is timed as a
prefill, though it is not a duplicate). Without tiers (l = 0) this is the rule below, with
m = e as the match.

- queued(r): uncached prompt tokens of requests already sent to r that have not produced their
  first token (the Router's `pending_prefill_tokens`; `kvgate bench routing` samples it against
  what the replicas report). decode_weight · in_flight(r): running decodes slow a batched engine
  a little (default 8 prefill tokens per running request).
- The stall charge: an engine computes a prompt in the same steps as the decodes it is running
  (chunked prefill), so each of them waits about as long as that prompt takes: own(r) prefill
  tokens times the requests in flight there (in_flight counts the router's own requests, queued
  ones too). stall_weight 1 counts that wait in full, 0 (the default) leaves it out and the rule
  minimises this request's own wait alone. It weighs most on a conversation's start (no replica
  holds its prompt, so own(r) is the whole prompt everywhere): the start then goes where fewer
  decodes would wait for it, and a later turn's small own prefill at home keeps it there.
- The duplicate charge: sending the request to r re-prefills the M − m(r) prompt tokens another
  replica already holds, a second copy that takes cache space a later request would have used.
  It is weighted by M / P, the share of the prompt that prefix is: a short prefix many prompts
  share (a system prompt) ends up cached everywhere anyway and costs little to copy, while a
  prefix that is most of the prompt (this conversation so far) is the session's own, and copying
  it wastes cache and the hits of its next turns. miss_weight 1 is purely greedy for this request.

The rule (`choose`): best = min ttft(r), the fastest this request could start anywhere;
mean_queue = the mean of queue(r) over the candidates. Admissible are the replicas with

    ttft(r) <= best + max(queue_slack · mean_queue, prompt_slack · P)        (`wait_bound`)

and among them the lowest cost wins (ties: fewer in flight, then round robin).

Invariant: the chosen replica's ttft estimate exceeds the fastest candidate's by at most
max(queue_slack · mean_queue, prompt_slack · P) (queue_slack → session_slack for a conversation's
own history, below): a prefix match buys at most that much queueing
(default 2.5 × the average queue, or half the request's own prefill), however large the
duplicate charge. The charge decides the common case — a replica holding a long prefix keeps
its sessions until its queue runs away from the others' — and the bound stops the runaway: a hot
prefix (a document many sessions share) spreads to a second replica instead of queueing every
session behind one. An infinite slack (either) gives the unbounded rule.

Which matches the bound applies to (`session_slack`): the bound exists for a prefix many
conversations share, where spreading it to a second replica relieves every later conversation.
A conversation's own history is different: moving it re-prefills all of it for one request's
sake and relieves nobody after it. So when the longest match ends at a block that no other
request has continued differently (`RoutePlan.shared_prefix` false: PrefixIndex.forked), the
bound uses session_slack as its queue slack instead; .inf (the default) leaves such a match
unbounded, and the cost (ttft estimate + duplicate charge) alone decides.

Where a conversation starts (`new_sessions`): a request that matches nothing, or only a prefix
other conversations share (`shared_prefix`: a system prompt, a document), starts a conversation
as far as routing can tell, and where it lands its next turns follow. `load` (the default)
treats it as any request: the lowest cost now. `resident` chooses, among the admissible
replicas, the one whose engine holds the fewest tokens (`resident_tokens`: its blocks in the
index plus what is queued to go in), then the lowest cost: the conversations, and with them the
prefill their later turns bring, spread over the replicas as they arrive rather than by a queue
that is gone a second later. A match that is one conversation's own history is never moved by
it; the wait bound still caps the queueing it may buy (with two replicas and equal own prefill
that bound admits both: 2.5 × the mean queue is at least the larger queue).

Defaults (miss_weight 64, queue_slack 2.5, prompt_slack 0.5, session_slack ∞) were chosen on
tuning slices only (requests 0–800 of the arena's traces, `kvgate bench routing-model` and
`kvgate bench routing --tune-slice`), never on reported ones, so the reported figures are not
fitted to the requests they are measured on.
"""

from __future__ import annotations

import math
from typing import Sequence

from kvgate.middleware.routing.base import ReplicaState, Rotation, RoutePlan
from kvgate.middleware.routing_config import CacheAwareConfig

# = CacheAwareConfig's defaults (middleware/routing_config.py), for the pure functions below
DEFAULT_DECODE_WEIGHT = 8.0
DEFAULT_MISS_WEIGHT = 64.0
DEFAULT_QUEUE_SLACK = 2.5
DEFAULT_PROMPT_SLACK = 0.5
DEFAULT_STALL_WEIGHT = 0.0


def queue_ahead(replica: ReplicaState, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> float:
    """Work ahead of a new request on `replica`, in prefill tokens (pure)."""
    return replica.pending_prefill_tokens + decode_weight * replica.in_flight


def own_prefill(prompt_tokens: int, matched: int, loaded: int, load_cost: float) -> float:
    """own(r), in prefill tokens (pure): the request's prefill of what neither the engine holds
    (`matched`) nor a tier supplies (`loaded`), and the loads at `load_cost` prefill tokens each."""
    return max(0, prompt_tokens - matched - loaded) + load_cost * loaded


def ttft_of(queue: float, prompt_tokens: int, matched: int, loaded: int, load_cost: float) -> float:
    """ttft(r) from its parts, in prefill tokens (pure): the work queued ahead plus `own_prefill`."""
    return queue + own_prefill(prompt_tokens, matched, loaded, load_cost)


def ttft_estimate(replica: ReplicaState, plan: RoutePlan, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> float:
    """This request's time to first token on `replica`, in prefill tokens: queued work, running
    decodes, its own prefill of what neither its engine holds nor a tier it reads can supply,
    and the loads at plan.load_cost prefill tokens each (pure)."""
    matched, loaded = plan.matched_tokens(replica.name), plan.loadable_tokens(replica.name)
    return ttft_of(queue_ahead(replica, decode_weight), plan.prompt_tokens, matched, loaded, plan.load_cost)


def duplicate_charge(matched: float, best_match: float, prompt_tokens: int) -> float:
    """Prompt tokens held elsewhere that this choice would copy, weighted by the share of the
    prompt they are: (best_match − matched) · best_match / prompt_tokens (pure; 0 for an empty
    prompt or when this replica holds the longest match)."""
    if prompt_tokens <= 0 or matched >= best_match:
        return 0.0
    return (best_match - matched) * best_match / prompt_tokens


def expected_cost(
    replica: ReplicaState,
    plan: RoutePlan,
    decode_weight: float = DEFAULT_DECODE_WEIGHT,
    miss_weight: float = DEFAULT_MISS_WEIGHT,
    best_match: int | None = None,
    stall_weight: float = DEFAULT_STALL_WEIGHT,
) -> float:
    """ttft estimate + (miss_weight − 1) · duplicate charge + stall_weight · stall charge (pure).
    best_match: the longest match among the candidates (default: among every replica in the plan)."""
    if best_match is None:
        best_match = max((plan.held_tokens(name) for name in {*plan.matched_blocks, *plan.tier_blocks}), default=0)
    matched, loaded = plan.matched_tokens(replica.name), plan.loadable_tokens(replica.name)
    own = own_prefill(plan.prompt_tokens, matched, loaded, plan.load_cost)
    return cost_of(
        queue_ahead(replica, decode_weight) + own,
        matched + loaded,
        best_match,
        plan.prompt_tokens,
        miss_weight,
        stall_weight * stall_charge(replica.in_flight, own),
    )


def stall_charge(in_flight: int, own_prefill: float) -> float:
    """Prefill tokens the requests in flight on a replica wait while this request's own prefill
    is computed beside them: in_flight · own_prefill (pure; never negative)."""
    return max(0, in_flight) * max(0.0, own_prefill)


def cost_of(
    ttft: float, held: float, best_match: float, prompt_tokens: int, miss_weight: float, stall: float = 0.0
) -> float:
    """cost(r) from ttft(r), the tokens r holds and the weighted stall charge:
    ttft + (miss_weight − 1) · duplicate charge + stall (pure)."""
    return ttft + (miss_weight - 1) * duplicate_charge(held, best_match, prompt_tokens) + stall


def wait_bound(
    best: float,
    mean_queue: float,
    prompt_tokens: int,
    queue_slack: float = DEFAULT_QUEUE_SLACK,
    prompt_slack: float = DEFAULT_PROMPT_SLACK,
) -> float:
    """The largest ttft estimate an admissible replica may have (pure; either slack infinite: no
    bound at all, even against an empty queue or prompt)."""
    if math.isinf(queue_slack) or math.isinf(prompt_slack):
        return math.inf
    return best + max(queue_slack * mean_queue, prompt_slack * prompt_tokens)


def admissible(
    candidates: Sequence[ReplicaState],
    plan: RoutePlan,
    decode_weight: float = DEFAULT_DECODE_WEIGHT,
    queue_slack: float = DEFAULT_QUEUE_SLACK,
    prompt_slack: float = DEFAULT_PROMPT_SLACK,
) -> list[ReplicaState]:
    """The candidates whose ttft estimate is within `wait_bound` of the fastest, in their order
    (pure). Never empty for a non-empty input: the fastest always qualifies."""
    if not candidates:
        return []
    ttft = [ttft_estimate(r, plan, decode_weight) for r in candidates]
    mean_queue = sum(queue_ahead(r, decode_weight) for r in candidates) / len(candidates)
    bound = wait_bound(min(ttft), mean_queue, plan.prompt_tokens, queue_slack, prompt_slack)
    return [r for r, t in zip(candidates, ttft) if t <= bound]


class CacheAware:
    name = "cache_aware"

    def __init__(self, settings: CacheAwareConfig | None = None, **knobs: float) -> None:
        """`settings`: routing.policy of the route; else built from `knobs` (decode_weight=...),
        validated as the config is (pydantic.ValidationError, a ValueError, naming the knob)."""
        self.settings = settings if settings is not None else CacheAwareConfig(**knobs)
        self.decode_weight = self.settings.decode_weight
        self.miss_weight = self.settings.miss_weight
        self.queue_slack = self.settings.queue_slack
        self.prompt_slack = self.settings.prompt_slack
        self.session_slack = self.settings.session_slack
        self.stall_weight = self.settings.stall_weight
        # the Router fills in ReplicaState.resident_tokens before each decision only when this is set
        self.reads_resident = self.settings.new_sessions == "resident"
        self._ties = Rotation()

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        """The rule above, each candidate's figures worked out once: the same choice as
        `admissible` then the least `expected_cost` (tests/test_routing_policies.py holds it to
        that composition)."""
        rotated = self._ties.rotated(candidates)
        prompt_tokens = plan.prompt_tokens
        held, ttft, queues, stalls = [], [], [], []
        for r in rotated:
            matched, loaded = plan.matched_tokens(r.name), plan.loadable_tokens(r.name)
            queue = queue_ahead(r, self.decode_weight)
            own = own_prefill(prompt_tokens, matched, loaded, plan.load_cost)
            held.append(matched + loaded)
            queues.append(queue)
            ttft.append(queue + own)
            stalls.append(self.stall_weight * stall_charge(r.in_flight, own))
        best_match = max(held)
        starts = plan.shared_prefix or best_match == 0  # a conversation's start, not its own history
        slack = self.queue_slack if starts else self.session_slack
        bound = wait_bound(min(ttft), sum(queues) / len(rotated), prompt_tokens, slack, self.prompt_slack)
        resident = self.reads_resident and starts
        best: tuple[float, ...] | None = None
        chosen = rotated[0]
        for r, h, t, stall in zip(rotated, held, ttft, stalls):
            if t > bound:  # not admissible
                continue
            cost = cost_of(t, h, best_match, prompt_tokens, self.miss_weight, stall)
            key = (r.resident_tokens, cost, r.in_flight) if resident else (cost, r.in_flight)
            if best is None or key < best:  # the first of equals, as min() keeps it
                best, chosen = key, r
        return chosen
