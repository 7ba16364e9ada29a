"""The in-memory network job protocols run over in tests and simulations: every member in one
process, seeded delays (which reorder messages), crashes, partitions and refusals, under the same
`Channel` interface (fedpeer/runtime/channel.py) the daemon's channel implements."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fedpeer.runtime.channel import Mailbox, NodeId, PeerRefused, PeerUnreachable

T = TypeVar("T")


@dataclass
class MemoryNetwork:
    """Job members in one process. Seeded: the same seed gives the same delays and outcomes.

    delay_ms: (low, high) uniform per message, so messages overtake each other; ack_ms: how much
    later the sender's send returns (its acknowledgement's way back; 0: at delivery).
    leadership: each member's view of (term, leader); by default term 1, led by the first member
    (simulations plug in real election cores).
    crash(node): the node's sends fail, messages to it are lost, and `alive` reports it dead
    after `detect_ms` (like the failure detector); at that moment every member's receives from it
    raise PeerDead (as the daemon's registry does when membership declares a member dead).
    detect_skew_ms: (low, high) extra delay, drawn per (observer, crashed member), before that
    observer's failure detector declares a crash (0: every member declares it at the same moment).
    restart(node): a crashed member is back (a new incarnation: alive to every failure detector
    again, but its jobs are gone: what is sent to it for them is refused as "unknown_job", as the
    daemon's job registry does). rejoin(node, job_id): a restarted member runs its part of the
    job again (its daemon's attempt to rejoin, fedpeer/jobs/lifecycle/rejoin.py): an empty mailbox,
    and messages for the job are taken again.
    partition(groups): sends across groups raise PeerUnreachable after `unreachable_ms` (the
    transport's retries giving up). refuse(src, dst, msg) -> reason plays the receiver's gate: a
    refused message raises PeerRefused at the sender and makes the receiver's `recv` from src raise
    MalformedFrom (as over the real daemon).
    """

    members: Sequence[NodeId]
    seed: int = 0
    delay_ms: tuple[float, float] = (0.0, 2.0)
    ack_ms: float = 0.0       # the acknowledgement's way back: a send returns this long after its delivery
    unreachable_ms: float = 200.0
    detect_ms: float = 500.0
    detect_skew_ms: tuple[float, float] = (0.0, 0.0)
    rng: random.Random = field(init=False)
    mailboxes: dict[tuple[str, NodeId], Mailbox] = field(default_factory=dict)
    crashed_at: dict[NodeId, float] = field(default_factory=dict)
    groups: list[set[NodeId]] | None = None
    sent: list[tuple[NodeId, NodeId, object]] = field(default_factory=list)   # every delivered message, for tests
    progress_log: list[tuple[NodeId, str, int, int]] = field(default_factory=list)
    points: list[tuple[NodeId, dict]] = field(default_factory=list)     # progress(point=...), in order
    leadership: Callable[[NodeId], tuple[int, NodeId | None]] | None = None
    refuse: Callable[[NodeId, NodeId, object], str | None] | None = None   # (src, dst, msg) -> reason to refuse
    declared_dead: set[NodeId] = field(default_factory=set)   # crashed, and detect_ms has passed
    skew: dict[tuple[NodeId, NodeId], float] = field(default_factory=dict)   # (observer, crashed) -> extra ms
    declared_by: dict[NodeId, set[NodeId]] = field(default_factory=dict)  # observer -> crashed it declared (skew)
    restarted: set[NodeId] = field(default_factory=set)       # crashed and back: its jobs are gone

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.members = tuple(sorted(self.members))

    def channel(self, me: NodeId, job_id: str = "job", members: Sequence[NodeId] | None = None) -> MemoryChannel:
        return MemoryChannel(self, me, tuple(sorted(members or self.members)), job_id)

    def mailbox(self, job_id: str, node: NodeId) -> Mailbox:
        box = self.mailboxes.get((job_id, node))
        if box is None:
            box = self.mailboxes[(job_id, node)] = Mailbox()
            for dead in self.declared_dead | self.declared_by.get(node, set()):
                box.member_dead(dead)
        return box

    def crash(self, node: NodeId) -> None:
        loop = asyncio.get_running_loop()
        self.crashed_at[node] = at = loop.time()
        if self.detect_skew_ms == (0.0, 0.0):
            loop.call_later(self.detect_ms / 1000, self._declare_dead, node, at)
            return
        for observer in self.members:   # each failure detector in its own time
            if observer != node:
                self.skew[observer, node] = extra = self.rng.uniform(*self.detect_skew_ms)
                loop.call_later((self.detect_ms + extra) / 1000, self._declare_dead_to, observer, node, at)

    def restart(self, node: NodeId) -> None:
        """A crashed member is back: alive again to every failure detector, without its jobs."""
        assert node in self.crashed_at, "restart of a member that did not crash"
        del self.crashed_at[node]
        self.restarted.add(node)
        self.declared_dead.discard(node)
        for declared in self.declared_by.values():
            declared.discard(node)
        for box in self.mailboxes.values():
            box.member_alive(node)

    def rejoin(self, node: NodeId, job_id: str) -> None:
        """A restarted member runs the job `job_id` again, from an empty mailbox."""
        assert node in self.restarted and node not in self.crashed_at, "rejoin of a member not restarted"
        self.restarted.discard(node)
        self.mailboxes.pop((job_id, node), None)

    def _declare_dead(self, node: NodeId, at: float) -> None:
        if self.crashed_at.get(node) != at:
            return     # restarted meanwhile
        self.declared_dead.add(node)
        for box in self.mailboxes.values():
            box.member_dead(node)

    def _declare_dead_to(self, observer: NodeId, node: NodeId, at: float) -> None:
        if self.crashed_at.get(node) != at:
            return     # restarted meanwhile
        self.declared_by.setdefault(observer, set()).add(node)
        for (_, who), box in self.mailboxes.items():
            if who == observer:
                box.member_dead(node)

    def partition(self, *groups: set[NodeId]) -> None:
        self.groups = [set(g) for g in groups]

    def heal(self) -> None:
        self.groups = None

    def reachable(self, a: NodeId, b: NodeId) -> bool:
        if a in self.crashed_at or b in self.crashed_at:
            return False
        return self.groups is None or any(a in g and b in g for g in self.groups)


@dataclass
class MemoryChannel:
    net: MemoryNetwork
    me: NodeId
    members: tuple[NodeId, ...]
    job_id: str

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    def random_bytes(self, n: int) -> bytes:
        return self.net.rng.randbytes(n)

    def pairwise_seed(self, peer: NodeId, label: bytes) -> bytes:
        a, b = sorted((self.me, peer))   # both ends derive the same; differs per network seed and job
        key = hashlib.blake2b(self.net.seed.to_bytes(8, "big", signed=True) + self.job_id.encode(),
                              digest_size=32).digest()
        return hashlib.blake2b(a + b + label, key=key, digest_size=32, person=b"fedpeer-test").digest()

    def alive(self, peer: NodeId) -> bool:
        at = self.net.crashed_at.get(peer)
        detect_ms = self.net.detect_ms + self.net.skew.get((self.me, peer), 0.0)
        return at is None or asyncio.get_running_loop().time() - at < detect_ms / 1000

    def leadership(self) -> tuple[int, NodeId | None]:
        if self.net.leadership is None:
            return 1, self.net.members[0]
        return self.net.leadership(self.me)

    def progress(self, phase: str, step: int, total: int, point: Mapping[str, Any] | None = None) -> None:
        self.net.progress_log.append((self.me, phase, step, total))
        if point is not None:
            self.net.points.append((self.me, dict(point)))

    async def sleep_ms(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    async def send(self, dst: NodeId, msg: object) -> None:
        assert dst in self.members and dst != self.me, "send to a non-member or to self"
        if self.me in self.net.crashed_at or self.me in self.net.restarted:
            raise asyncio.CancelledError()   # a crashed member does nothing more (nor its jobs, once back)
        if not self.net.reachable(self.me, dst):
            await asyncio.sleep(self.net.unreachable_ms / 1000)
            raise PeerUnreachable(dst, "simulated")
        if dst in self.net.restarted:      # back without its jobs: the daemon's registry refuses
            await asyncio.sleep(self.net.rng.uniform(*self.net.delay_ms) / 1000)
            raise PeerRefused(dst, "unknown_job")
        low, high = self.net.delay_ms
        await asyncio.sleep(self.net.rng.uniform(low, high) / 1000)
        if not self.net.reachable(self.me, dst):
            raise PeerUnreachable(dst, "simulated")
        reason = self.net.refuse(self.me, dst, msg) if self.net.refuse is not None else None
        if reason is not None:   # as the real gate: the receiver's job learns it, the sender is told
            self.net.mailbox(self.job_id, dst).refuse(self.me, reason)
            raise PeerRefused(dst, reason)
        self.net.sent.append((self.me, dst, msg))
        self.net.mailbox(self.job_id, dst).put(self.me, msg)
        if self.net.ack_ms:
            await asyncio.sleep(self.net.ack_ms / 1000)

    async def recv(self, kind: type[T], tag: str, src: NodeId | None = None,
                   timeout_ms: int = 30_000) -> tuple[NodeId, T]:
        return await self.net.mailbox(self.job_id, self.me).get(kind, tag, src, timeout_ms)

    def discard(self, tag_prefix: str) -> None:
        self.net.mailbox(self.job_id, self.me).discard(tag_prefix)
