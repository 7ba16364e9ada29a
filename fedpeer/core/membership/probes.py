"""The failure detector's bookkeeping (fedpeer/core/membership/swim.py; Das et al., DSN 2002, §3.1):
this period's probe, whom to probe next (§4.3), and the other pings that await an answer.

Probe ids are 32-bit and wrap; the period's probe and every other ping draw them from one
counter. Pending pings are bounded (the caller's cap, pending_probes_per_member_max per member;
the oldest go first) and expire after one probe period (RTT-aware: the caller sets expires_ms)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from fedpeer.core.membership.wire import NodeId

_PROBE_ID_MASK = 0xFFFF_FFFF  # probe ids are 32-bit and wrap; collisions are also filtered by src


@dataclass(slots=True)
class _Probe:  # this period's failure-detector probe (SWIM §3.1)
    target: NodeId
    target_incarnation: int  # a failure only says something about this incarnation
    probe_id: int
    started_ms: int
    acked: bool = False
    relays: tuple[NodeId, ...] | None = None  # None until the ping-req phase
    indirect_ms: int = 0     # when ping-reqs go out if the target has not answered (RTT-aware)


@dataclass(frozen=True, slots=True)
class _Pending:  # a ping other than the period's probe: join, verify, dead member, relay
    target: NodeId
    sent_ms: int
    expires_ms: int
    requester: NodeId | None = None  # set: we relay this ping for requester's probe
    requester_probe_id: int = 0
    relay: NodeId | None = None      # set: we asked relay to ping target for us (a PingReq)


class PendingPings:
    """The pings other than the period's probe that await an answer, by probe id, and the probe
    id counter that they and the period's probes share."""

    def __init__(self, first_probe_id: int) -> None:
        self._entries: dict[int, _Pending] = {}
        self._next_probe_id = first_probe_id

    def __len__(self) -> int:
        return len(self._entries)

    def new_probe_id(self) -> int:
        probe_id = self._next_probe_id
        self._next_probe_id = (probe_id + 1) & _PROBE_ID_MASK
        return probe_id

    def track(self, entry: _Pending, cap: int) -> int:
        """Remember a non-probe ping; returns its probe id. Oldest entries go first when full."""
        while len(self._entries) >= cap:
            del self._entries[next(iter(self._entries))]
        probe_id = self.new_probe_id()
        self._entries[probe_id] = entry
        return probe_id

    def get(self, probe_id: int) -> _Pending | None:
        return self._entries.get(probe_id)

    def remove(self, probe_id: int) -> None:
        del self._entries[probe_id]

    def expire(self, now_ms: int) -> None:
        # A relay is useless once the requester's period is over; join/dead pings likewise.
        for probe_id in [pid for pid, e in self._entries.items() if e.expires_ms <= now_ms]:
            del self._entries[probe_id]

    def forget(self, node: NodeId) -> None:
        """Drop every ping to, for, or through `node` (no longer a member)."""
        self._entries = {pid: e for pid, e in self._entries.items()
                         if node not in (e.target, e.requester, e.relay)}


class ProbeOrder:
    """Whom to probe next (SWIM §4.3): round-robin over a shuffled list, reshuffled after each
    full pass, bounds the time until a failed member is probed by anyone to (2n - 1) periods."""

    def __init__(self) -> None:
        self._order: list[NodeId] = []
        self._pos = 0

    def restart(self) -> None:
        """Start a new pass, over the members of the next call (the member set changed)."""
        self._order, self._pos = [], 0

    def next(self, members: Iterable[NodeId], rng: random.Random) -> NodeId:
        """The next member of this pass; a new pass, shuffled by rng, once this one is done."""
        if self._pos >= len(self._order):
            self._order = list(members)
            rng.shuffle(self._order)
            self._pos = 0
        node = self._order[self._pos]
        self._pos += 1
        return node
