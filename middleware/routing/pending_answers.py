"""Approximate mode's answers not yet in the prefix index, hashed when their conversation goes on.

A replica that answered holds the prompt's blocks and the answer's. Only a later turn of the same
conversation can match the answer's blocks: they carry the answer's text, which no other prompt
starts with. So rather than hash every answer as it finishes (a conversation's last answer is
never matched), the router notes (salt, the conversation's message-run key) → the replica, and
the next turn, whose messages start with that conversation, has them hashed and recorded on that
replica before its own match. The match sees the same blocks as if the answer had been recorded
at its finish, and each turn's text is hashed once rather than twice (the answer's record, then
the next prompt).

Only where this process's index is the only one (a LocalState): with routing state shared between
processes, a next turn may reach a process that never saw the note, so there answers are hashed
and shared as they finish. May import kvgate.index.kv; nothing of the proxy.

Invariant: a note is taken at most once, and only by a prompt whose leading messages have the
noted conversation's roles and texts (kvgate.index.kv.prompt.message_runs) under the same salt, so
a tenant's note never records blocks for another's prompt. Notes are bounded, oldest dropped
first; a dropped note costs a next turn the answer's blocks in its match, never an error.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple, Sequence

MAX_NOTES = 65536  # answers awaiting their next turn; each is a few hundred bytes


class AnswerNote(NamedTuple):
    """A finished answer left unhashed: the key of its conversation's message runs (prompt +
    answer), how many messages that is, and the salt its prompt was hashed under."""

    key: int
    messages: int
    salt: str | None


class PendingAnswers:
    """Thread-safe: notes come from the record step's thread, takes from the planner's."""

    def __init__(self, size: int = MAX_NOTES) -> None:
        if size < 1:
            raise ValueError("PendingAnswers needs room for at least one note")
        self._size = size
        self._notes: OrderedDict[tuple[str | None, int], tuple[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._notes)

    def note(self, replica: str, answer: AnswerNote) -> None:
        """`replica` holds the noted conversation's blocks (a later note of the same key wins)."""
        key = (answer.salt, answer.key)
        with self._lock:
            self._notes[key] = (replica, answer.messages)
            self._notes.move_to_end(key)
            while len(self._notes) > self._size:
                self._notes.popitem(last=False)

    def take(self, salt: str | None, runs: Sequence[int]) -> list[tuple[str, int]]:
        """(replica, message count) of each note on a leading run of these messages (`runs`:
        their message_runs), shortest first; taken, so each is applied once."""
        if not self._notes:  # the usual case of a fresh conversation: no lock taken
            return []
        found: list[tuple[str, int]] = []
        with self._lock:
            for k, run in enumerate(runs):
                held = self._notes.pop((salt, run), None)
                if held is not None and held[1] == k + 1:
                    found.append(held)
        return found

    def forget(self, replica: str) -> None:
        """The replica left the route: its notes go with it."""
        with self._lock:
            for key in [key for key, (name, _) in self._notes.items() if name == replica]:
                del self._notes[key]
