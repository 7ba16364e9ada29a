"""How job protocols talk: a small `Channel` per job member, and two implementations of it.

Job protocols (secure sum, stats, BOFRF, ...) are coroutines that never see sockets or the clock:
they call `await ch.send(peer, msg)`, `await ch.recv(Kind, tag, src=...)`, `ch.now_ms()`,
`ch.random_bytes(n)` and `ch.pairwise_seed(peer, label)`. The same protocol code runs
- over the real daemon (`fedpeer/jobs/lifecycle/nodechannel.py`: a channel on the node's transport), and
- over `MemoryNetwork` (fedpeer/testing/memory.py): members in one process, seeded delays (which reorder messages),
  crashes and partitions, for fast deterministic tests (under `looptime`, time is virtual).

Delivery contract (both implementations): `send` is reliable — it returns once the peer has
accepted the message, or raises `PeerUnreachable` after the transport's bounded retries, or
`PeerRefused` at once when the peer received the message and refused it (an authenticated refusal:
the peer is alive; the fault is in what was sent). On the receiving side, a message from a member
that this node's gate refused (malformed for this job) makes `recv` from that member raise
`MalformedFrom` at once, so nobody waits out a timeout for data that will never be accepted. Likewise,
once the failure detector declares a member dead (`alive()` turns false for good, not a mere
suspicion), every `recv` from it raises `PeerDead` at once, and so does every later one until it is
alive again: nobody waits out a hop timeout for a member that membership already buried. A message
is delivered at most once (the real gate drops replays and duplicates). Messages from one sender
may arrive out of order. Every message a job protocol sends is a registered wire dataclass with a
`tag: str` field; `recv` matches on (type, tag[, src]).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fedpeer.errors import JobError

NodeId = bytes
T = TypeVar("T")

MAILBOX_MESSAGES_MAX = 4096     # buffered, not yet received messages per job member
MAILBOX_PER_SENDER_MAX = 1024   # of those, from one sender: a flooding member drops its own, not others'


class PeerUnreachable(JobError):
    def __init__(self, peer: NodeId, detail: str = "") -> None:
        self.peer = peer
        super().__init__(f"peer {peer.hex()[:16]} unreachable{': ' + detail if detail else ''}")


class PeerRefused(PeerUnreachable):
    """The peer received our message and refused it (`reason`: its gate's verdict). Not a dead
    peer: blame the message (and so the sender), never the refusing peer. A subclass of
    PeerUnreachable so that code which only knows "the send failed" still stops."""

    def __init__(self, peer: NodeId, reason: str) -> None:
        self.reason = reason
        JobError.__init__(self, f"peer {peer.hex()[:16]} refused the message: {reason}")
        self.peer = peer


class MalformedFrom(JobError):
    """A member sent this job a message our gate refused (`reason`); raised by `recv` from it."""

    def __init__(self, peer: NodeId, reason: str) -> None:
        self.peer, self.reason = peer, reason
        super().__init__(f"member {peer.hex()[:16]} sent a malformed message: {reason}")


class RecvTimeout(JobError):
    pass


class PeerDead(JobError):
    """The failure detector declared `peer` dead while (or before) we waited for it: raised by
    `recv(..., src=peer)`. Not evidence of misbehaviour: a crash, a kill -9, a cut cable."""

    def __init__(self, peer: NodeId, detail: str = "declared dead by membership") -> None:
        self.peer, self.detail = peer, detail
        super().__init__(f"member {peer.hex()[:16]} {detail}")


@dataclass(frozen=True)
class Waiting:
    """What one pending `recv` waits for (`job show`: "forest from site-3 since 12.4 s")."""

    kind: type
    tag: str
    src: NodeId | None
    since_s: float          # loop time when the wait began

    def describe(self, names: Callable[[NodeId], str], now_s: float) -> str:
        what = getattr(self.kind, "WAITING_FOR", self.kind.__name__)
        who = f" from {names(self.src)}" if self.src is not None else " from any member"
        return f"{what}{who} since {max(0.0, now_s - self.since_s):.1f} s"


class Channel(Protocol):
    me: NodeId
    members: tuple[NodeId, ...]          # the job's members in ring order (sorted keys), me included
    job_id: str

    def now_ms(self) -> int: ...
    def random_bytes(self, n: int) -> bytes: ...                 # OS CSPRNG in the daemon; seeded in tests
    def pairwise_seed(self, peer: NodeId, label: bytes) -> bytes: ...   # 32 bytes only me and peer can derive
    def alive(self, peer: NodeId) -> bool: ...                    # the failure detector's current view
    def leadership(self) -> tuple[int, NodeId | None]: ...        # (term, leader) as this member's election sees it
    def progress(self, phase: str, step: int, total: int,           # where the job is; `point`: a
                 point: Mapping[str, Any] | None = None) -> None: ...  # round's metrics, live
    async def sleep_ms(self, ms: int) -> None: ...                # pause (virtual time under looptime)
    async def send(self, dst: NodeId, msg: object) -> None: ...
    async def recv(self, kind: type[T], tag: str, src: NodeId | None = None,
                   timeout_ms: int = 30_000) -> tuple[NodeId, T]: ...
    def discard(self, tag_prefix: str) -> None: ...              # drop buffered messages of old rounds


@dataclass(frozen=True)
class SubChannel:
    """A job's channel restricted to some of its members (a cluster, a round's participants):
    protocols such as the secure sum then run among those members only."""

    base: Channel
    members: tuple[NodeId, ...]

    def __getattr__(self, name: str) -> object:
        return getattr(self.base, name)


class Mailbox:
    """Messages for one job member, waiting to be received; bounded. When a sender is over its
    share, or the box is full, the oldest message of the sender holding most is dropped: a
    member that floods a job loses its own messages, never the leader's or anyone else's.

    Each receiver waits on its own future, and `put` hands a message straight to the first
    receiver it matches: no shared event, so no wake-up can be lost between receivers."""

    def __init__(self, limit: int = MAILBOX_MESSAGES_MAX, per_sender: int = MAILBOX_PER_SENDER_MAX) -> None:
        self._items: deque[tuple[NodeId, object]] = deque()
        self._per_sender = per_sender
        self._held: dict[NodeId, int] = {}
        self._waiters: list[tuple[type, str, NodeId | None, asyncio.Future]] = []
        self._since: dict[asyncio.Future, float] = {}   # waiter -> loop time its wait began
        self._limit = limit
        self.dropped = 0
        self.refused: dict[NodeId, str] = {}   # member -> why its message was refused (first reason)
        self.dead: set[NodeId] = set()         # members the failure detector declared dead

    def member_dead(self, src: NodeId) -> None:
        """The failure detector declared `src` dead: every receive waiting for a message from it
        (and every later one, until `member_alive`) raises PeerDead instead of timing out.
        Messages it sent before dying stay buffered and are still delivered."""
        self.dead.add(src)
        for waiter in [w for w in self._waiters if w[2] == src and not w[3].done()]:
            self._waiters.remove(waiter)
            waiter[3].set_exception(PeerDead(src))

    def member_alive(self, src: NodeId) -> None:
        """`src` answers again (a false alarm, or a restart): receives from it wait again."""
        self.dead.discard(src)

    def waiting(self) -> list[Waiting]:
        """The receives pending now, oldest first."""
        return sorted((Waiting(kind, tag, src, self._since.get(f, 0.0)) for kind, tag, src, f in self._waiters
                       if not f.done()), key=lambda w: w.since_s)

    def refuse(self, src: NodeId, reason: str) -> None:
        """`src` sent this job a message that failed our checks: every receive waiting for a
        message from `src` (and every later one) raises MalformedFrom instead of timing out."""
        self.refused.setdefault(src, reason)
        for waiter in [w for w in self._waiters if w[2] == src and not w[3].done()]:
            self._waiters.remove(waiter)
            waiter[3].set_exception(MalformedFrom(src, self.refused[src]))

    def put(self, src: NodeId, msg: object) -> None:
        for i, (kind, tag, want, future) in enumerate(self._waiters):
            if not future.done() and _matches(src, msg, kind, tag, want):
                del self._waiters[i]
                future.set_result((src, msg))
                return
        if self._held.get(src, 0) >= self._per_sender:
            self._drop_oldest_of(src)
        elif len(self._items) >= self._limit:
            self._drop_oldest_of(max(self._held, key=lambda k: (self._held[k], k == src)))   # ties: the sender
        self._items.append((src, msg))
        self._held[src] = self._held.get(src, 0) + 1

    def _drop_oldest_of(self, src: NodeId) -> None:
        for i, (s, _) in enumerate(self._items):
            if s == src:
                del self._items[i]
                self._count_out(src)
                self.dropped += 1
                return

    def _count_out(self, src: NodeId) -> None:
        self._held[src] -= 1
        if not self._held[src]:
            del self._held[src]

    def _take(self, kind: type, tag: str, src: NodeId | None) -> tuple[NodeId, object] | None:
        for i, (s, m) in enumerate(self._items):
            if _matches(s, m, kind, tag, src):
                del self._items[i]
                self._count_out(s)
                return s, m
        return None

    async def get(self, kind: type[T], tag: str, src: NodeId | None, timeout_ms: int) -> tuple[NodeId, T]:
        found = self._take(kind, tag, src)
        if found is not None:
            return found  # type: ignore[return-value]
        if src is not None and src in self.refused:
            raise MalformedFrom(src, self.refused[src])
        if src is not None and src in self.dead:
            raise PeerDead(src)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        waiter = (kind, tag, src, future)
        self._waiters.append(waiter)
        self._since[future] = loop.time()
        try:
            return await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError:
            who = f" from {src.hex()[:16]}" if src else ""
            raise RecvTimeout(f"no {kind.__name__} '{tag}'{who} within {timeout_ms} ms") from None
        finally:
            self._since.pop(future, None)
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def discard(self, tag_prefix: str) -> None:
        """Forget buffered messages of finished rounds (e.g. a failed secure-sum attempt)."""
        self._items = deque((s, m) for s, m in self._items if not m.tag.startswith(tag_prefix))  # type: ignore[attr-defined]
        self._held = {}
        for s, _ in self._items:
            self._held[s] = self._held.get(s, 0) + 1


def _matches(src: NodeId, msg: object, kind: type, tag: str, want: NodeId | None) -> bool:
    return type(msg) is kind and msg.tag == tag and (want is None or src == want)  # type: ignore[attr-defined]


class JobObserver(Protocol):
    def secure_sum_done(self, mode: str, seconds: float, *, ok: bool, attempts: int = 1) -> None: ...
    def round_done(self, kind: str, seconds: float) -> None: ...


def observer_of(ch: Any) -> JobObserver | None:
    """The node's metrics behind a job's channel, or None (unit tests, simulator)."""
    return getattr(ch, "metrics", None)


def observe_round(ch: Any, kind: str, started_ms: int) -> None:
    """A training round of a `kind` job begun at `started_ms` (ch.now_ms()) was committed now."""
    observer = observer_of(ch)
    if observer is not None:
        observer.round_done(kind, (ch.now_ms() - started_ms) / 1000)
