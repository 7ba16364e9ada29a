"""SWIM-style membership and failure detection, as a pure state machine.

References are to Das, Gupta, Motivala, "SWIM: Scalable Weakly-consistent
Infection-style Process Group Membership Protocol" (DSN 2002): §3.1 failure
detector (ping / ping-req), §4.1 infection-style dissemination, §4.2 suspicion
sub-protocol and incarnation numbers, §4.3 round-robin probe target selection.

Rules of this module:

* Pure. Nothing here reads a clock, touches a socket, sleeps or draws from the
  global `random` module. Time arrives as `now_ms` (a monotonic millisecond
  counter, never decreasing) on every call; randomness comes from the
  `random.Random` given to the constructor. The caller (the node shell, or the
  simulator in tests/sim/simnet.py) turns the returned `Send` effects into I/O.
* Two entry points change state: `tick(now_ms)` (call every ~50-100 ms) and
  `receive(src, msg, now_ms)`, where `src` is the sender's authenticated
  NodeId (the transport checked the signature). Both return the messages to
  send. Nothing else has side effects.
* Membership is closed: the set of members is fixed at construction. Messages
  from, and gossip about, any NodeId not configured are ignored; gossip never
  admits a member.
* Every member record orders its (state, incarnation) pairs by the key
  (incarnation, ALIVE < SUSPECT < DEAD); an update is applied iff its key is
  strictly greater (this is the SWIM §4.2 precedence, extended so that
  ALIVE(i) also overrides DEAD(j) for i > j, which lets a restarted or healed
  member rejoin). Keys therefore only grow, and every member converges to the
  maximum it has heard, whatever the delivery order.
* A configured member we have never heard anything about is a *placeholder*:
  reported SUSPECT (never ALIVE), not gossiped, overridden by any information.
  If nothing arrives within suspect_timeout_ms it becomes DEAD locally, still
  without gossip (we have learnt nothing worth telling).
* Only the member itself can make itself ALIVE: ALIVE updates originate from
  its own authenticated Ping/Ack (incarnation + address) or its own
  refutation, and are then spread by gossip.
* Hearing SUSPECT/DEAD about myself at my incarnation (or anything newer than
  my incarnation) makes me refute: incarnation = theirs + 1, gossip ALIVE.
  The shell must persist `incarnation` before sending anything that carries it.
* A message sent to a member we hold SUSPECT/DEAD carries that verdict first,
  so the only member able to refute it hears it at once. With DEAD members
  pinged every dead_probe_interval_ms, this is what brings back paused
  members and the far side of a healed partition.
* An address is only ever taken together with a winning (state, incarnation):
  an address change needs a new incarnation (the shell bumps it at boot).
* A failed probe suspects only the incarnation that was probed, and time in
  which we ourselves did not run (a tick gap over a protocol period) does not
  count against anyone.
* Every limit and timeout is a field of MembershipConfig with its unit in the
  name. State is bounded: one gossip entry per member, pending relayed/extra
  pings capped at pending_probes_per_member_max per member and expired after
  one protocol period.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

NodeId = bytes  # a member's 32-byte Ed25519 public key; the canonical id on the wire

_PROBE_ID_MASK = 0xFFFF_FFFF  # probe ids are 32-bit and wrap; collisions are also filtered by src
_RTT_EWMA_ALPHA = 0.2


class MemberState(enum.StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


_RANK = {MemberState.ALIVE: 0, MemberState.SUSPECT: 1, MemberState.DEAD: 2}


def supersedes(new_state: MemberState, new_inc: int, old_state: MemberState, old_inc: int) -> bool:
    """SWIM §4.2 precedence: does (new_state, new_inc) override (old_state, old_inc)?

    ALIVE(i) beats ALIVE/SUSPECT/DEAD(j) iff i > j; SUSPECT(i) beats ALIVE(j) iff
    i >= j and SUSPECT/DEAD(j) iff i > j; DEAD(i) beats ALIVE/SUSPECT(j) iff i >= j
    and DEAD(j) iff i > j. All of this is one lexicographic order, which is what
    makes gossip order-independent.
    """
    return (new_inc, _RANK[new_state]) > (old_inc, _RANK[old_state])


@dataclass(frozen=True)
class MembershipConfig:
    probe_interval_ms: int = 500        # one probe per protocol period
    probe_timeout_ms: int = 300         # direct ack wait before indirect probes
    indirect_probes: int = 3            # k members asked to ping-req
    suspect_timeout_ms: int = 4000      # suspect -> dead
    dead_probe_interval_ms: int = 2000  # how often to ping a dead member at its last address
    piggyback_max: int = 8              # updates carried per message
    retransmit_mult: int = 3            # lambda: each update sent lambda*ceil(log2(n+1)) times
    pending_probes_per_member_max: int = 4  # relayed/join/dead pings awaiting an ack, per member

    def __post_init__(self) -> None:
        if not 0 < self.probe_timeout_ms < self.probe_interval_ms:
            raise ValueError("need 0 < probe_timeout_ms < probe_interval_ms")
        for name in ("suspect_timeout_ms", "dead_probe_interval_ms", "piggyback_max",
                     "retransmit_mult", "pending_probes_per_member_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.indirect_probes < 0:
            raise ValueError("indirect_probes must be >= 0")

    def retransmit_limit(self, n_members: int) -> int:
        """SWIM §4.1: lambda*ceil(log2(n+1)) sends reach everyone w.h.p."""
        return self.retransmit_mult * max(1, math.ceil(math.log2(n_members + 1)))


@dataclass(frozen=True)
class Update:  # gossip about one member
    node: NodeId
    state: MemberState
    incarnation: int
    address: str  # "host:port"


@dataclass(frozen=True)
class Ping:
    probe_id: int
    incarnation: int
    address: str
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class Ack:
    probe_id: int
    incarnation: int
    address: str
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class PingReq:  # "please probe target for me"
    probe_id: int
    target: NodeId
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class IndirectAck:  # intermediary -> requester: target answered
    probe_id: int
    target: NodeId
    updates: tuple[Update, ...]


Message = Ping | Ack | PingReq | IndirectAck
# incarnation/address in Ping/Ack are the SENDER's own (authenticated by the transport's signature).


@dataclass(frozen=True)
class Send:  # effect: the shell sends msg to dst at address
    dst: NodeId
    address: str
    msg: Message


@dataclass(frozen=True)
class MemberView:
    node: NodeId
    state: MemberState
    incarnation: int
    address: str
    last_seen_ms: int | None
    rtt_ms: float | None


@dataclass(slots=True)
class _Member:
    state: MemberState
    incarnation: int
    address: str
    state_since_ms: int             # suspect timer base while SUSPECT
    heard: bool = False             # False: config placeholder, no information yet
    last_seen_ms: int | None = None
    rtt_ms: float | None = None
    next_dead_ping_ms: int = 0


@dataclass(slots=True)
class _Probe:  # this period's failure-detector probe (SWIM §3.1)
    target: NodeId
    target_incarnation: int  # a failure only says something about this incarnation
    probe_id: int
    started_ms: int
    acked: bool = False
    relays: tuple[NodeId, ...] | None = None  # None until the ping-req phase


@dataclass(frozen=True, slots=True)
class _Pending:  # a ping other than the period's probe: join, dead member, relay for a ping-req
    target: NodeId
    sent_ms: int
    expires_ms: int
    requester: NodeId | None = None
    requester_probe_id: int = 0


@dataclass(slots=True)
class _Gossip:
    update: Update
    sent: int = 0


class Membership:
    """One member's view of the federation. See the module docstring for the rules."""

    def __init__(self, me: NodeId, address: str, incarnation: int, peers: Mapping[NodeId, str],
                 config: MembershipConfig, rng: random.Random, now_ms: int) -> None:
        assert me not in peers, "peers must not include me"
        assert incarnation >= 0
        self._me = me
        self._address = address
        self._incarnation = incarnation
        self._cfg = config
        self._rng = rng
        self._now_ms = now_ms
        self._members = {node: _Member(MemberState.SUSPECT, 0, addr, now_ms)
                         for node, addr in sorted(peers.items())}
        self._gossip: dict[NodeId, _Gossip] = {}
        self._pending: dict[int, _Pending] = {}
        self._probe: _Probe | None = None
        self._order: list[NodeId] = []
        self._order_pos = 0
        self._next_probe_id = rng.getrandbits(32)
        self._last_tick_ms: int | None = None
        self._period_end_ms = now_ms + config.probe_interval_ms
        # Announce myself: a restarted member's new incarnation/address must reach members
        # that cannot hear it directly (§4.1 dissemination of joins).
        self._enqueue(Update(me, MemberState.ALIVE, incarnation, address))

    # -- public API -------------------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self._incarnation

    def view(self) -> list[MemberView]:
        """Every member except me, ordered by NodeId."""
        return [MemberView(node, m.state, m.incarnation, m.address, m.last_seen_ms, m.rtt_ms)
                for node, m in self._members.items()]  # built in sorted order, never reordered

    def address_of(self, node: NodeId) -> str:
        """Last known address of `node` (mine for me). KeyError if not a member."""
        return self._address if node == self._me else self._members[node].address

    def tick(self, now_ms: int) -> list[Send]:
        self._advance_clock(now_ms)
        sends: list[Send] = []
        if self._last_tick_ms is None:
            sends += self._join(now_ms)
        else:
            self._compensate_stall(now_ms)
        self._last_tick_ms = now_ms
        if self._pending:
            self._expire_pending(now_ms)
        sends += self._timers(now_ms)  # first, so a member that just died is not probed
        sends += self._run_probe(now_ms)
        return sends

    def receive(self, src: NodeId, msg: Message, now_ms: int) -> list[Send]:
        self._advance_clock(now_ms)
        member = self._members.get(src)
        if member is None:  # me, or not a configured member: membership is closed
            return []
        member.last_seen_ms = now_ms
        match msg:
            case Ping():
                return self._on_ping(src, msg, now_ms)
            case Ack():
                return self._on_ack(src, msg, now_ms)
            case PingReq():
                return self._on_ping_req(src, msg, now_ms)
            case IndirectAck():
                return self._on_indirect_ack(src, msg, now_ms)
        raise TypeError(f"not a membership message: {type(msg).__name__}")

    # -- clock ------------------------------------------------------------------------------

    def _advance_clock(self, now_ms: int) -> None:
        assert now_ms >= self._now_ms, f"time went backwards: {now_ms} < {self._now_ms}"
        self._now_ms = now_ms

    def _join(self, now_ms: int) -> list[Send]:
        # Ping everyone at start so a fresh federation converges in one round trip instead of
        # one full round-robin pass. Placeholder timers start now, not at construction.
        sends = []
        for node, m in self._members.items():
            if not m.heard:
                m.state_since_ms = now_ms
            sends.append(self._ping(node, self._track(node, now_ms)))
        self._period_end_ms = now_ms + self._cfg.probe_interval_ms
        return sends

    def _compensate_stall(self, now_ms: int) -> None:
        # A tick gap longer than a period means *we* were not running (SIGSTOP, suspended VM,
        # long GC): we could neither receive acks nor refutations, so that time must not count
        # against anyone. Abandon the probe (its outcome says nothing) and shift suspect timers.
        gap_ms = now_ms - self._last_tick_ms
        if gap_ms <= self._cfg.probe_interval_ms:
            return
        for m in self._members.values():
            if m.state is MemberState.SUSPECT:
                m.state_since_ms += gap_ms
        self._probe = None
        self._period_end_ms = now_ms

    # -- failure detector (SWIM §3.1, §4.3) -------------------------------------------------

    def _run_probe(self, now_ms: int) -> list[Send]:
        sends: list[Send] = []
        p = self._probe
        if (p is not None and not p.acked and p.relays is None
                and now_ms >= p.started_ms + self._cfg.probe_timeout_ms):
            sends += self._send_ping_reqs(p)
        if now_ms < self._period_end_ms:
            return sends
        if p is not None and not p.acked:
            self._suspect(p.target, p.target_incarnation, now_ms)  # no ack within the period
        self._probe = None
        self._period_end_ms = now_ms + self._cfg.probe_interval_ms
        target = self._next_target()
        if target is not None:
            incarnation = self._members[target].incarnation
            self._probe = _Probe(target, incarnation, self._new_probe_id(), now_ms)
            sends.append(self._ping(target, self._probe.probe_id))
        return sends

    def _next_target(self) -> NodeId | None:
        # §4.3: round-robin over a shuffled list, reshuffled after each full pass, bounds the
        # time until a failed member is probed by anyone to (2n - 1) periods.
        if all(m.state is MemberState.DEAD for m in self._members.values()):
            return None
        while True:  # ends within two passes: some member is not DEAD
            if self._order_pos >= len(self._order):
                self._order = list(self._members)
                self._rng.shuffle(self._order)
                self._order_pos = 0
            node = self._order[self._order_pos]
            self._order_pos += 1
            if self._members[node].state is not MemberState.DEAD:
                return node

    def _send_ping_reqs(self, p: _Probe) -> list[Send]:
        others = [node for node, m in self._members.items()
                  if node != p.target and m.state is not MemberState.DEAD]
        p.relays = tuple(self._rng.sample(others, min(self._cfg.indirect_probes, len(others))))
        return [Send(node, self._members[node].address,
                     PingReq(p.probe_id, p.target, self._piggyback(node)))
                for node in p.relays]

    def _suspect(self, node: NodeId, probed_incarnation: int, now_ms: int) -> None:
        m = self._members[node]
        # Only a member we know ALIVE becomes a (gossiped) suspect; placeholders already count
        # down locally, and an existing suspicion keeps its original timer. If the member moved
        # to a new incarnation while we probed (it restarted, or refuted), our silence was about
        # its past self: the next probe will judge the new one.
        if m.heard and m.state is MemberState.ALIVE and m.incarnation == probed_incarnation:
            self._apply(Update(node, MemberState.SUSPECT, m.incarnation, m.address), now_ms)

    def _timers(self, now_ms: int) -> list[Send]:
        sends = []
        for node, m in self._members.items():
            if m.state is MemberState.SUSPECT:
                if now_ms - m.state_since_ms >= self._cfg.suspect_timeout_ms:
                    self._confirm_dead(node, m, now_ms)
            elif m.state is MemberState.DEAD and now_ms >= m.next_dead_ping_ms:
                # Not in SWIM (which needs an explicit re-join): pinging the dead at their last
                # address lets restarted members and the far side of a healed partition rejoin.
                # The Ping carries their death notice (see _piggyback), so a live one refutes.
                m.next_dead_ping_ms = now_ms + self._cfg.dead_probe_interval_ms
                sends.append(self._ping(node, self._track(node, now_ms)))
        return sends

    def _confirm_dead(self, node: NodeId, m: _Member, now_ms: int) -> None:
        if m.heard:  # §4.2: an unrefuted suspicion is confirmed and gossiped
            self._apply(Update(node, MemberState.DEAD, m.incarnation, m.address), now_ms)
        else:  # a placeholder: we learnt nothing worth gossiping
            m.state = MemberState.DEAD
            m.state_since_ms = now_ms
            m.next_dead_ping_ms = now_ms + self._cfg.dead_probe_interval_ms

    # -- pings and acks ---------------------------------------------------------------------

    def _new_probe_id(self) -> int:
        probe_id = self._next_probe_id
        self._next_probe_id = (probe_id + 1) & _PROBE_ID_MASK
        return probe_id

    def _track(self, target: NodeId, now_ms: int, requester: NodeId | None = None,
               requester_probe_id: int = 0) -> int:
        """Remember a non-probe ping; returns its probe id. Oldest entries go first when full."""
        cap = self._cfg.pending_probes_per_member_max * (len(self._members) + 1)
        while len(self._pending) >= cap:
            del self._pending[next(iter(self._pending))]
        probe_id = self._new_probe_id()
        self._pending[probe_id] = _Pending(target, now_ms, now_ms + self._cfg.probe_interval_ms,
                                           requester, requester_probe_id)
        return probe_id

    def _expire_pending(self, now_ms: int) -> None:
        # A relay is useless once the requester's period is over; join/dead pings likewise.
        for probe_id in [pid for pid, e in self._pending.items() if e.expires_ms <= now_ms]:
            del self._pending[probe_id]

    def _ping(self, dst: NodeId, probe_id: int) -> Send:
        return Send(dst, self._members[dst].address,
                    Ping(probe_id, self._incarnation, self._address, self._piggyback(dst)))

    def _on_ping(self, src: NodeId, msg: Ping, now_ms: int) -> list[Send]:
        self._apply(Update(src, MemberState.ALIVE, msg.incarnation, msg.address), now_ms)
        self._apply_all(msg.updates, now_ms)  # may refute: the Ack then carries the new incarnation
        ack = Ack(msg.probe_id, self._incarnation, self._address, self._piggyback(src))
        return [Send(src, msg.address, ack)]  # answer where the (authenticated) sender says it is

    def _on_ack(self, src: NodeId, msg: Ack, now_ms: int) -> list[Send]:
        self._apply(Update(src, MemberState.ALIVE, msg.incarnation, msg.address), now_ms)
        self._apply_all(msg.updates, now_ms)
        p = self._probe
        if p is not None and p.probe_id == msg.probe_id and p.target == src:
            if not p.acked:
                self._sample_rtt(src, now_ms - p.started_ms)
                p.acked = True
            return []
        pending = self._pending.get(msg.probe_id)
        if pending is None or pending.target != src:
            return []  # late, duplicate or foreign ack: the proof of life above is all it gives
        del self._pending[msg.probe_id]
        self._sample_rtt(src, now_ms - pending.sent_ms)
        if pending.requester is None:
            return []
        return [self._indirect_ack(pending, src)]

    def _indirect_ack(self, pending: _Pending, target: NodeId) -> Send:
        # Carry what the target just told us about itself, so a requester that cannot reach it
        # directly still learns its incarnation (and a placeholder becomes ALIVE).
        t = self._members[target]
        lead = ((Update(target, MemberState.ALIVE, t.incarnation, t.address),)
                if t.state is MemberState.ALIVE else ())
        requester = pending.requester
        assert requester is not None
        msg = IndirectAck(pending.requester_probe_id, target, self._piggyback(requester, lead))
        return Send(requester, self._members[requester].address, msg)

    def _on_ping_req(self, src: NodeId, msg: PingReq, now_ms: int) -> list[Send]:
        self._apply_all(msg.updates, now_ms)
        if msg.target not in self._members or msg.target == src:
            return []
        probe_id = self._track(msg.target, now_ms, src, msg.probe_id)
        return [self._ping(msg.target, probe_id)]

    def _on_indirect_ack(self, src: NodeId, msg: IndirectAck, now_ms: int) -> list[Send]:
        self._apply_all(msg.updates, now_ms)
        p = self._probe
        if (p is not None and p.relays is not None and src in p.relays
                and p.probe_id == msg.probe_id and p.target == msg.target):
            p.acked = True
        return []

    def _sample_rtt(self, node: NodeId, rtt_ms: int) -> None:
        m = self._members[node]
        m.rtt_ms = float(rtt_ms) if m.rtt_ms is None else (
            (1 - _RTT_EWMA_ALPHA) * m.rtt_ms + _RTT_EWMA_ALPHA * rtt_ms)

    # -- state and dissemination (SWIM §4.1, §4.2) ------------------------------------------

    def _apply_all(self, updates: tuple[Update, ...], now_ms: int) -> None:
        for update in updates:
            self._apply(update, now_ms)

    def _apply(self, u: Update, now_ms: int) -> None:
        if u.node == self._me:
            self._maybe_refute(u)
            return
        m = self._members.get(u.node)
        if m is None:
            return  # gossip never admits a member
        if m.heard and not supersedes(u.state, u.incarnation, m.state, m.incarnation):
            return
        assert u.incarnation >= 0
        m.heard = True
        m.state, m.incarnation, m.address = u.state, u.incarnation, u.address
        m.state_since_ms = now_ms
        if u.state is MemberState.DEAD:
            m.next_dead_ping_ms = now_ms + self._cfg.dead_probe_interval_ms
        self._enqueue(u)  # §4.1: whoever learns something new spreads it

    def _maybe_refute(self, u: Update) -> None:
        # §4.2: only I may declare myself alive, by outbidding the incarnation of any claim about
        # me that is not exactly my current ALIVE self (suspicion, death, stale address, or a
        # higher incarnation left over from a previous run that the shell failed to persist).
        if u.incarnation < self._incarnation:
            return
        if (u.incarnation == self._incarnation and u.state is MemberState.ALIVE
                and u.address == self._address):
            return
        self._incarnation = u.incarnation + 1
        self._enqueue(Update(self._me, MemberState.ALIVE, self._incarnation, self._address))

    def _enqueue(self, u: Update) -> None:
        # One entry per member: a newer update replaces (and resets) an older one, so the buffer
        # is bounded by the member count and never carries contradictory news.
        self._gossip.pop(u.node, None)
        self._gossip[u.node] = _Gossip(u)
        assert len(self._gossip) <= len(self._members) + 1

    def _piggyback(self, dst: NodeId, lead: tuple[Update, ...] = ()) -> tuple[Update, ...]:
        """Updates to carry on a message to dst: lead, dst's own bad news, then gossip."""
        out = list(lead)
        skip = {u.node for u in lead} | {dst}
        m = self._members.get(dst)
        if (m is not None and m.heard and m.state is not MemberState.ALIVE
                and len(out) < self._cfg.piggyback_max):
            # Tell the subject first: it is the only one who can refute (§4.2), and a member that
            # is talking to us is plainly alive. This is what heals pauses and partitions.
            out.append(Update(dst, m.state, m.incarnation, m.address))
        room = self._cfg.piggyback_max - len(out)
        if room <= 0:
            return tuple(out)
        limit = self._cfg.retransmit_limit(len(self._members) + 1)
        chosen = sorted((g for node, g in self._gossip.items() if node not in skip),
                        key=lambda g: g.sent)[:room]  # fewest-sent first (stable: oldest first)
        for g in chosen:
            out.append(g.update)
            g.sent += 1
            if g.sent >= limit:
                del self._gossip[g.update.node]
        return tuple(out)
