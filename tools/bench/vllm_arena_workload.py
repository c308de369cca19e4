"""The workload of `kvgate bench vllm` (tools/bench/vllm_arena.py): chat conversations shaped from
a Mooncake-format trace, scaled to fit SmolLM2's context.

Grouping (`group_conversations`, pure). The trace's requests are taken in time order. A request
whose hash_ids start with every *full-block* id of an earlier request that is the latest turn of
its conversation, and whose input is longer, is that conversation's next turn (the longest such
match wins). Full blocks, not all ids: a turn's last id covers a partial block (input_length is
rarely a multiple of 512), and the next turn completes that block with new text, so the id
changes; requiring every id would leave no conversation of 4 turns in Mooncake's conversation
trace (8 of 2 turns). A tail must hold at least MIN_SHARED_BLOCKS full blocks (1,024 trace tokens),
so that the block every request shares (id 0, a common system prompt) does not chain unrelated
requests.

Scaling (`scaling`). Each trace block id becomes `block_tokens` (B, default 64) real tokens of
deterministic text: B words drawn, seeded by the id, from WORDS, each of which is one SmolLM2 token
with its leading space, so a block is B tokens and equal ids are equal token runs. Turn k's user
text is the blocks of its ids beyond turn k-1's full blocks (turn 1: all its ids), so the prompt
of turn k (chat template + every earlier user text + the answers the engine returned + the new
text) grows by the trace's own increments, ×B/512. Conversations whose last sent turn would
exceed `max_prompt_tokens` (an estimate: blocks × B + answers + template) are skipped.

Completions (`--endpoint completions`). The same turns as one growing plain-text prompt, no chat
template (`next_prompt`): "User: <text>\nAssistant:", then turn k-1's prompt + the answer the
engine returned + "\nUser: <text>\nAssistant:". The estimate above stays the chat one (an upper
bound here), so both endpoints pick the same conversations.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from kvgate.tools.bench.trace import TraceRequest, load_trace

TRACE_BLOCK_TOKENS = 512  # Mooncake: one hash id per 512 prompt tokens
MIN_SHARED_BLOCKS = 2
TEMPLATE_TOKENS = 40  # SmolLM2's chat template with its default system prompt (~31), + slack
PER_MESSAGE_TOKENS = 5  # <|im_start|>role\n ... <|im_end|>\n
# one token each in SmolLM2's tokenizer with a leading space (checked in tests/test_bench_vllm_arena.py)
WORDS = tuple(
    """time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue side kind
head house service friend father power hour game line end member law car city community name president team
minute idea kid body information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education river garden window summer
winter market table paper music light color field train bridge street island forest mountain letter picture
voice road plan answer ship horse bird stone glass wood fire cloud rain snow wind sea lake farm village kitchen
doctor lawyer engine bottle chair piano planet animal apple orange bread cheese coffee tea sugar salt milk egg
fish meat rice corn""".split()
)


@dataclass(frozen=True)
class Conversation:
    """Turns of one trace conversation: `requests` (indexes into the time-sorted trace), each
    turn's hash_ids and its new ids (what that turn's user message is made of)."""

    requests: tuple[int, ...]
    hash_ids: tuple[tuple[int, ...], ...]
    new_ids: tuple[tuple[int, ...], ...]

    @property
    def turns(self) -> int:
        return len(self.requests)

    def cut(self, turns: int) -> "Conversation":
        return Conversation(self.requests[:turns], self.hash_ids[:turns], self.new_ids[:turns])


def full_ids(req: TraceRequest, block_tokens: int = TRACE_BLOCK_TOKENS) -> tuple[int, ...]:
    """The ids of the request's full blocks (all but a partial last one)."""
    return req.hash_ids[: min(len(req.hash_ids), req.input_length // block_tokens)]


def group_conversations(
    trace: Sequence[TraceRequest], block_tokens: int = TRACE_BLOCK_TOKENS, min_shared: int = MIN_SHARED_BLOCKS
) -> list[Conversation]:
    """The trace's conversations, in the order of their first turn (see the module docstring)."""
    order = sorted(range(len(trace)), key=lambda i: trace[i].timestamp_ms)
    tails: dict[tuple[int, ...], int] = {}  # full ids of a conversation's latest turn -> conversation
    convs: list[list[int]] = []
    keys: list[tuple[int, ...]] = []
    for i in order:
        req = trace[i]
        match = None
        for n in range(len(req.hash_ids), min_shared - 1, -1):
            c = tails.get(req.hash_ids[:n])
            if c is not None and trace[convs[c][-1]].input_length < req.input_length:
                match = c
                break
        if match is None:
            match = len(convs)
            convs.append([])
            keys.append(())
        else:
            del tails[keys[match]]
        convs[match].append(i)
        keys[match] = full_ids(req, block_tokens)
        if len(keys[match]) >= min_shared:
            tails[keys[match]] = match  # a later conversation with the same key takes it over
    out = []
    for reqs in convs:
        ids = tuple(trace[i].hash_ids for i in reqs)
        new = [ids[0]] + [ids[k][len(full_ids(trace[reqs[k - 1]], block_tokens)) :] for k in range(1, len(reqs))]
        out.append(Conversation(tuple(reqs), ids, tuple(new)))
    return out


def estimate_tokens(conv: Conversation, turns: int, block_tokens: int, max_tokens: int) -> int:
    """Upper estimate of the prompt tokens of turn `turns` (1-based) once scaled."""
    blocks = sum(len(ids) for ids in conv.new_ids[:turns])
    return TEMPLATE_TOKENS + blocks * block_tokens + (turns - 1) * max_tokens + (2 * turns - 1) * PER_MESSAGE_TOKENS


def select(
    convs: Sequence[Conversation],
    turns: int,
    block_tokens: int,
    max_tokens: int,
    max_prompt_tokens: int,
    min_turns: int = 4,
) -> tuple[list[Conversation], dict[str, int]]:
    """Conversations with >= max(min_turns, turns) turns whose turn `turns` fits, cut to `turns`
    turns, in trace order; and how many were dropped for which reason."""
    long = [c for c in convs if c.turns >= max(min_turns, turns)]
    fits = [c.cut(turns) for c in long if estimate_tokens(c, turns, block_tokens, max_tokens) <= max_prompt_tokens]
    return fits, {"conversations": len(convs), "with_enough_turns": len(long), "fitting": len(fits)}


def usable(args: Any) -> tuple[list[Conversation], dict[str, int]]:
    """`select` on the conversations of `args.trace`, with the bench's options (`turns`,
    `block_tokens`, `max_tokens`, `max_prompt_tokens`)."""
    convs = group_conversations(load_trace(args.trace))
    return select(convs, args.turns, args.block_tokens, args.max_tokens, args.max_prompt_tokens)


@lru_cache(maxsize=100_000)
def block_words(hash_id: int, block_tokens: int) -> str:
    """The `block_tokens` words (= tokens) of one hash id: the same in every process."""
    seed = int.from_bytes(hashlib.sha256(f"kvgate-vllm-arena:{hash_id}".encode()).digest()[:8], "little")
    return " ".join(random.Random(seed).choices(WORDS, k=block_tokens))


def user_texts(conv: Conversation, block_tokens: int) -> list[str]:
    """Each turn's user message."""
    return [" ".join(block_words(h, block_tokens) for h in ids) for ids in conv.new_ids]


def next_prompt(previous: str, answer: str, text: str) -> str:
    """A completions turn's prompt: the previous turn's prompt and its answer verbatim (so the
    engine's cached prefix is a prefix of this prompt's text), then the new user text."""
    head = f"{previous}{answer}\n" if previous else ""
    return f"{head}User: {text}\nAssistant:"


def scaling(block_tokens: int, max_prompt_tokens: int, max_tokens: int, counts: dict[str, int]) -> dict[str, Any]:
    """What the JSON says of the scaling."""
    return {
        "trace_block_tokens": TRACE_BLOCK_TOKENS,
        "block_tokens": block_tokens,
        "factor": block_tokens / TRACE_BLOCK_TOKENS,
        "how": (
            f"each trace hash id -> {block_tokens} tokens of deterministic words (one SmolLM2 token each, seeded "
            f"by the id); turn k's user message = the blocks of its ids beyond turn k-1's full blocks; the prompt "
            f"= chat template + earlier turns (user texts and the engine's own answers) + that message"
        ),
        "grouping": (
            f"next turn = a later, longer request starting with every full-block id (input_length // "
            f"{TRACE_BLOCK_TOKENS}) of a conversation's latest turn, at least {MIN_SHARED_BLOCKS} blocks"
        ),
        "max_prompt_tokens": max_prompt_tokens,
        "max_tokens": max_tokens,
        **counts,
    }
