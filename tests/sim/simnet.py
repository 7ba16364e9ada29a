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
* Faults: per-copy drop and duplicate probability, directed link cuts
  (`partition`, `cut`, `heal`), `crash`/`restart` (in-flight messages to a
  crashed node are lost; a restarted node gets incarnation + 1), and
  `pause`/`resume` (SIGSTOP: no ticks, inbound messages queue and are handed
  over on resume).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fedpeer.core.membership import Membership, MembershipConfig, NodeId


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


def membership_factory(config: MembershipConfig) -> NodeFactory:
    def build(spec: NodeSpec) -> Membership:
        return Membership(me=spec.node_id, address=spec.address, incarnation=spec.incarnation,
                          peers=spec.peers, config=config, rng=spec.rng, now_ms=spec.now_ms)
    return build


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
