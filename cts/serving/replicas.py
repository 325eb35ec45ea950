"""Replicas of one served model, and which conversation each request of a key goes to.

A key's requests (its dialogue, rewrite, search turns and judge calls) share long prefixes: the
search agent resends its whole growing conversation each turn. vLLM keeps those prefixes in its
prefix cache, so a key that stays on one replica finds its earlier turns cached there, while a
key spread over replicas recomputes them on each. The runner therefore opens a `conversation`
for each key (a context variable, so every request made inside that key's task carries it),
and `Replicas.pick` binds a conversation to the least-loaded live replica at its first request
and keeps it there. A replica that refuses connections is marked down and its conversations
move to the others at their next request; a request in flight there when it died is sent again
by the engine's retry.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal
from weakref import WeakKeyDictionary

#: `affinity`: a key's requests go to one replica (chosen least-loaded when the key starts);
#: `round_robin`: each request to the next live replica (what a plain load balancer does).
Routing = Literal["affinity", "round_robin"]


class Conversation:
    """One key's run: the requests made inside `conversation(...)` belong to it. Compared by
    identity, so a key run again (a retried or resumed run) is a new conversation."""

    __slots__ = ("__weakref__", "key")

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"Conversation({self.key!r})"


_current: ContextVar[Conversation | None] = ContextVar("cts_conversation", default=None)


@contextmanager
def conversation(key: str) -> Iterator[Conversation]:
    """The requests made in the block (and in tasks it starts) belong to one conversation."""
    opened = Conversation(key)
    token = _current.set(opened)
    try:
        yield opened
    finally:
        _current.reset(token)


def current_conversation() -> Conversation | None:
    return _current.get()


class Replicas:
    """The base URLs of one model's replicas and where each conversation is bound.

    Bindings are weak: a conversation that has ended (its key recorded) no longer counts toward
    its replica's load, and nothing has to release it."""

    def __init__(self, urls: Sequence[str], routing: Routing = "affinity") -> None:
        if not urls:
            raise ValueError("a model needs at least one endpoint")
        self.urls = [u.rstrip("/") for u in urls]
        self.routing = routing
        self.down: set[int] = set()
        #: Requests sent to each replica and not yet answered.
        self.in_flight = [0] * len(self.urls)
        #: Requests each replica was sent, and conversations moved off a replica found down.
        self.sent = [0] * len(self.urls)
        self.moved = 0
        self._bound: WeakKeyDictionary[Conversation, int] = WeakKeyDictionary()
        self._turn = itertools.count()

    def __len__(self) -> int:
        return len(self.urls)

    def live(self) -> list[int]:
        """Replicas not found down; all of them once every one was (each is tried again)."""
        up = [i for i in range(len(self.urls)) if i not in self.down]
        return up or list(range(len(self.urls)))

    def load(self, i: int) -> tuple[int, int]:
        """Conversations bound to replica i (each will send more), then requests in flight."""
        bound = sum(1 for replica in self._bound.values() if replica == i)
        return bound, self.in_flight[i]

    def pick(self) -> int:
        """The replica for the next request of the current conversation."""
        live = self.live()
        if self.routing == "round_robin":
            return live[next(self._turn) % len(live)]
        opened = current_conversation()
        bound = self._bound.get(opened) if opened is not None else None
        if bound is not None and bound in live:
            return bound
        choice = min(live, key=lambda i: (self.load(i), i))
        if opened is not None:
            self.moved += bound is not None
            self._bound[opened] = choice
        return choice

    def mark_down(self, i: int) -> bool:
        """Replica i refused a connection: no new request goes there while another replica is
        live. False when no other is (the caller then waits and retries as for one server)."""
        if len(self.urls) == 1 or not set(self.live()) - {i}:
            return False
        self.down.add(i)
        return True

    def mark_up(self, i: int) -> None:
        self.down.discard(i)

    def found_down(self) -> str:
        """Which replicas were found down and how many conversations moved ("" if none)."""
        if not self.down:
            return ""
        urls = ", ".join(self.urls[i] for i in sorted(self.down))
        return f"replica(s) found down: {urls} ({self.moved} keys moved to the others)"

    def as_dict(self) -> dict[str, object]:
        """Per replica: its URL, requests sent and whether it was found down."""
        return {
            "routing": self.routing,
            "moved_conversations": self.moved,
            "replicas": [
                {"url": url, "sent": self.sent[i], "down": i in self.down}
                for i, url in enumerate(self.urls)
            ],
        }
