"""A seeded discrete-event network for pure protocol state machines.

Rules:

* One `random.Random(seed)` drives everything: link delays, drops, duplicates,
  tick phases and the per-node rngs handed to node factories. The same seed and
  the same sequence of calls replay exactly.
* Time is a fake millisecond clock (`now_ms`) that only `run_until` advances.
  Events sit in a heap ordered by (time, sequence number); random per-message
  delays reorder messages.
* Nodes are generic: anything with `tick(now_ms) -> list[send]` and
  `receive(src_id, msg, now_ms) -> list[send]`, where a send has `.dst`
  (NodeId), `.address` ("host:port") and `.msg`. Sends are routed by address,
  as a real network does, and dropped if the node listening there has a
  different id (the real transport's signature check would reject them).
* Slow links: `slow(i, (low, high))` adds a uniform extra delay to every copy
  to or from node i (a site behind a thin, queueing uplink).
* Faults: per-copy drop and duplicate probability, directed link cuts
  (`partition`, `cut`, `heal`), `crash`/`restart` (in-flight messages to a
  crashed node are lost; a restarted node gets incarnation + 1), and
  `pause`/`resume` (SIGSTOP: no ticks, inbound messages queue and are handed
  over on resume).
* `ByzantineMember` is a member whose key is in everyone's allowlist but whose
  gossip lies (see its docstring); `membership_factory(config, liars=...)`
  builds it for the given indexes.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fedpeer.core.membership.swim import (
    Ack,
    IndirectAck,
    Membership,
    MembershipConfig,
    MemberState,
    NodeId,
    Ping,
    PingReq,
    Send,
    Update,
)


class SimNode(Protocol):
    def tick(self, now_ms: int) -> list[Any]: ...

    def receive(self, src: NodeId, msg: Any, now_ms: int) -> list[Any]: ...


@dataclass(frozen=True)
class NodeSpec:
    """Everything a factory needs to build (or rebuild) node `index`."""

    index: int
    node_id: NodeId
    address: str
    incarnation: int
    peers: dict[NodeId, str]
    rng: random.Random
    now_ms: int


NodeFactory = Callable[[NodeSpec], SimNode]


def membership_factory(config: MembershipConfig, liars: frozenset[int] = frozenset()) -> NodeFactory:
    def build(spec: NodeSpec) -> Membership | ByzantineMember:
        node = Membership(me=spec.node_id, address=spec.address, incarnation=spec.incarnation,
                          peers=spec.peers, config=config, rng=spec.rng, now_ms=spec.now_ms)
        return ByzantineMember(node, spec) if spec.index in liars else node
    return build


FAKE_ADDRESS = "127.0.0.1:9"
WIRE_INCARNATION_MAX = 2**63 - 1  # the largest the wire lets through
WIRE_UPDATES_MAX = 64             # fedpeer/wire/frame.py _UPDATES_MAX
LIE_REFRESH_TICKS = 4


class ByzantineMember:
    """A member with a valid key that lies about everyone else.

    It runs an honest Membership inside, so it answers pings and looks alive, but every message
    it sends carries, instead of honest gossip, lies: a suspicion of the recipient itself, then
    (shuffled afresh each tick) for every other member: its death at 2**63 - 1 with a fake
    address, its death and its suspicion at its current incarnation (what an insider knows), a
    suspicion at the next one with a fake address, and ALIVE at a higher one with a fake address.
    (The lies are redrawn every LIE_REFRESH_TICKS ticks: drawing them is what costs in a sim.)
    It announces absurd incarnations of its own now and then, never relays ping-reqs (so every
    indirect probe that asks it fails), and floods: each tick it pings flood_per_tick random
    members.
    """

    def __init__(self, inner: Membership, spec: NodeSpec, flood_per_tick: int = 1) -> None:
        self.inner, self.me, self.rng = inner, spec.node_id, spec.rng
        self.peers = dict(spec.peers)
        self.flood_per_tick = flood_per_tick
        self.lies_sent = 0
        self._pool: list[Update] = []
        self._ticks = 0
        self._about_dst: dict[NodeId, int] = {}

    @property
    def incarnation(self) -> int:
        return self.inner.incarnation

    def view(self) -> Any:
        return self.inner.view()

    def address_of(self, node: NodeId) -> str:
        return self.inner.address_of(node)

    def tick(self, now_ms: int) -> list[Any]:
        if self._ticks % LIE_REFRESH_TICKS == 0:
            self._pool = self._lies()
        self._ticks += 1
        sends = self.inner.tick(now_ms)
        for dst in self.rng.sample(sorted(self.peers), min(self.flood_per_tick, len(self.peers))):
            sends.append(Send(dst, self.peers[dst], Ping(self.rng.getrandbits(32), 0, "", ())))
        return [self._poison(s) for s in sends]

    def receive(self, src: NodeId, msg: Any, now_ms: int) -> list[Any]:
        if isinstance(msg, PingReq):
            return []  # never relays: every indirect probe that counts on it fails
        return [self._poison(s) for s in self.inner.receive(src, msg, now_ms)]

    def _poison(self, send: Send) -> Send:
        msg = send.msg
        about_dst = self._about_dst.get(send.dst, 0)
        lies = (Update(send.dst, MemberState.SUSPECT, about_dst, FAKE_ADDRESS),
                *self._pool[:WIRE_UPDATES_MAX - 1])
        self.lies_sent += len(lies)
        match msg:
            case Ping() | Ack():
                incarnation = msg.incarnation
                if self.rng.random() < 0.05:   # its own number: absurd now and then
                    incarnation = self.rng.choice([WIRE_INCARNATION_MAX, 2**62, incarnation + 10**6])
                address = msg.address or self.inner.address_of(self.me)
                return Send(send.dst, send.address, type(msg)(msg.probe_id, incarnation, address, lies))
            case PingReq() | IndirectAck():
                return Send(send.dst, send.address, type(msg)(msg.probe_id, msg.target, lies))
        raise TypeError(type(msg).__name__)

    def _lies(self) -> list[Update]:
        pool = []
        self._about_dst = {v.node: v.incarnation for v in self.inner.view()}
        for x, inc in self._about_dst.items():
            pool += [Update(x, MemberState.DEAD, WIRE_INCARNATION_MAX, FAKE_ADDRESS),
                     Update(x, MemberState.DEAD, inc, FAKE_ADDRESS),
                     Update(x, MemberState.SUSPECT, inc, self.peers[x]),
                     Update(x, MemberState.SUSPECT, inc + 1, FAKE_ADDRESS),
                     Update(x, MemberState.ALIVE, inc + 1 + self.rng.randrange(1_000), FAKE_ADDRESS)]
        self.rng.shuffle(pool)
        return pool


_TICK, _DELIVER = 0, 1


class SimNet:
    def __init__(self, seed: int, n_nodes: int, config: MembershipConfig | None = None, *,
                 drop_rate: float = 0.0, dup_rate: float = 0.0,
                 delay_ms: tuple[int, int] = (1, 20), tick_ms: int = 50,
                 factory: NodeFactory | None = None) -> None:
        assert 1 <= n_nodes <= 255 and 0 <= drop_rate < 1 and 0 <= dup_rate < 1
        assert 0 <= delay_ms[0] <= delay_ms[1] and tick_ms >= 1
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.drop_rate, self.dup_rate = drop_rate, dup_rate
        self.delay_ms, self.tick_ms = delay_ms, tick_ms
        self.factory = factory or membership_factory(config or MembershipConfig())
        self.ids: list[NodeId] = [bytes([i + 1]) * 32 for i in range(n_nodes)]
        self.addresses: list[str] = [f"10.0.0.{i + 1}:7000" for i in range(n_nodes)]
        self.nodes: list[SimNode | None] = [None] * n_nodes
        self.incarnations = [0] * n_nodes
        self.stats: Counter[str] = Counter()
        self.index_of = {node_id: i for i, node_id in enumerate(self.ids)}
        self._route = {addr: i for i, addr in enumerate(self.addresses)}
        self._epoch = [0] * n_nodes  # bumped on crash/restart/pause: stale ticks are skipped
        self._paused: dict[int, list[tuple[int, Any]]] = {}  # index -> queued (src index, msg)
        self._cut: set[tuple[int, int]] = set()
        self._slow: dict[int, tuple[int, int]] = {}   # node -> extra delay range (ms) on its link
        self._heap: list[tuple[int, int, int, int, int, Any]] = []
        self._seq = itertools.count()
        for i in range(n_nodes):
            self._boot(i)

    # -- topology and faults ----------------------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.ids)

    def partition(self, groups: Iterable[Iterable[int]]) -> None:
        """Cut every link between different groups (nodes in no group are isolated)."""
        group_of = {i: g for g, members in enumerate(groups) for i in members}
        self._cut = {(a, b) for a in range(self.n) for b in range(self.n)
                     if a != b and (a not in group_of or group_of.get(a) != group_of.get(b))}

    def cut(self, a: int, b: int, *, both_ways: bool = True) -> None:
        self._cut.add((a, b))
        if both_ways:
            self._cut.add((b, a))

    def heal(self) -> None:
        self._cut.clear()

    def slow(self, i: int, extra_ms: tuple[int, int]) -> None:
        """Node i sits behind a slow link: every copy to or from it takes extra_ms more."""
        assert 0 <= extra_ms[0] <= extra_ms[1]
        self._slow[i] = extra_ms

    def crash(self, i: int) -> None:
        node = self.nodes[i]
        assert node is not None, f"node {i} is already down"
        self.incarnations[i] = getattr(node, "incarnation", self.incarnations[i])
        self.nodes[i] = None
        self._paused.pop(i, None)
        self._epoch[i] += 1

    def restart(self, i: int, address: str | None = None) -> None:
        """Boot a fresh node with the same id and incarnation + 1 (the shell persists it)."""
        assert self.nodes[i] is None, f"node {i} is running; crash it first"
        if address is not None:
            del self._route[self.addresses[i]]
            self.addresses[i] = address
            self._route[address] = i
        self.incarnations[i] += 1
        self._boot(i)

    def pause(self, i: int) -> None:
        assert self.nodes[i] is not None and i not in self._paused
        self._paused[i] = []
        self._epoch[i] += 1

    def resume(self, i: int) -> None:
        queued = self._paused.pop(i)
        for src, msg in queued:  # the kernel hands over the socket backlog in arrival order
            self._hand_over(src, i, msg)
        self._schedule_tick(i, self.now_ms + self.rng.randrange(self.tick_ms))

    def is_up(self, i: int) -> bool:
        """Running and not paused."""
        return self.nodes[i] is not None and i not in self._paused

    def node(self, i: int) -> Any:
        node = self.nodes[i]
        assert node is not None, f"node {i} is down"
        return node

    def view(self, i: int) -> Any:
        return self.node(i).view()

    # -- running ----------------------------------------------------------------------------

    def run_until(self, until_ms: int) -> None:
        while self._heap and self._heap[0][0] <= until_ms:
            at, _, kind, a, b, payload = heapq.heappop(self._heap)
            self.now_ms = at
            if kind == _TICK:
                self._on_tick(a, b)
            else:
                self._on_deliver(a, b, payload)
        self.now_ms = max(self.now_ms, until_ms)

    def run_for(self, duration_ms: int) -> None:
        self.run_until(self.now_ms + duration_ms)

    def run_checking(self, until_ms: int, check: Callable[[SimNet], bool],
                     every_ms: int = 50) -> int | None:
        """Run to until_ms, calling check every every_ms; return the first time it is True."""
        while self.now_ms < until_ms:
            self.run_until(min(until_ms, self.now_ms + every_ms))
            if check(self):
                return self.now_ms
        return None

    # -- internals --------------------------------------------------------------------------

    def _boot(self, i: int) -> None:
        peers = {self.ids[j]: self.addresses[j] for j in range(self.n) if j != i}
        spec = NodeSpec(i, self.ids[i], self.addresses[i], self.incarnations[i], peers,
                        random.Random(self.rng.getrandbits(64)), self.now_ms)
        self.nodes[i] = self.factory(spec)
        self._epoch[i] += 1
        self._schedule_tick(i, self.now_ms + self.rng.randrange(self.tick_ms))

    def _push(self, at: int, kind: int, a: int, b: int, payload: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, a, b, payload))

    def _schedule_tick(self, i: int, at: int) -> None:
        self._push(at, _TICK, i, self._epoch[i], None)

    def _on_tick(self, i: int, epoch: int) -> None:
        if epoch != self._epoch[i]:
            return  # node crashed, restarted or paused since this tick was scheduled
        node = self.nodes[i]
        assert node is not None
        self._dispatch(i, node.tick(self.now_ms))
        self._schedule_tick(i, self.now_ms + self.tick_ms)

    def _dispatch(self, src: int, sends: list[Any]) -> None:
        for send in sends:
            dst = self._route.get(send.address)
            if dst is None or self.ids[dst] != send.dst:
                self.stats["misrouted"] += 1
                continue
            self.stats["sent"] += 1
            copies = 2 if self.rng.random() < self.dup_rate else 1
            for _ in range(copies):
                if self.rng.random() < self.drop_rate:
                    self.stats["dropped"] += 1
                    continue
                delay = self.rng.randint(*self.delay_ms)
                for end in (src, dst):   # no draw unless a link is slow: old seeds replay as before
                    if end in self._slow:
                        delay += self.rng.randint(*self._slow[end])
                self._push(self.now_ms + delay, _DELIVER, src, dst, send.msg)

    def _on_deliver(self, src: int, dst: int, msg: Any) -> None:
        if (src, dst) in self._cut or self.nodes[dst] is None:
            self.stats["lost"] += 1
            return
        if dst in self._paused:
            self._paused[dst].append((src, msg))
            return
        self._hand_over(src, dst, msg)

    def _hand_over(self, src: int, dst: int, msg: Any) -> None:
        node = self.nodes[dst]
        assert node is not None
        self.stats["delivered"] += 1
        self._dispatch(dst, node.receive(self.ids[src], msg, self.now_ms))
