"""SWIM-style membership and failure detection, as a pure state machine.

References are to Das, Gupta, Motivala, "SWIM: Scalable Weakly-consistent
Infection-style Process Group Membership Protocol" (DSN 2002): §3.1 failure
detector (ping / ping-req), §4.1 infection-style dissemination, §4.2 suspicion
sub-protocol and incarnation numbers, §4.3 round-robin probe target selection;
and to Dadgar, Phillips, Currey, "Lifeguard: Local Health Awareness for More
Accurate Failure Detection" (2018), §4.2 independent suspicions.

Layout: this module holds the rules and the state machine (`Membership`); the
code is split along its seams: membership_wire.py (the messages and the `Send`
effect), membership_gossip.py (the piggyback buffer, §4.1),
membership_probes.py (this period's probe, whom to probe next, the other pings
awaiting an answer: §3.1, §4.3), membership_timing.py (MembershipConfig, and
how long to wait for an answer: slow is not dead), members.py (what we hold of
each member, the incarnation's bounds). Their public names are
importable from here.

Rules of this module:

* Pure. Nothing here reads a clock, touches a socket, sleeps or draws from the
  global `random` module. Time arrives as `now_ms` (a monotonic millisecond
  counter, never decreasing) on every call; randomness comes from the
  `random.Random` given to the constructor. The caller (the node shell, or the
  simulator in fedpeer/testing/simnet.py) turns the returned `Send` effects into I/O.
* Two entry points change state: `tick(now_ms)` (call every ~50-100 ms) and
  `receive(src, msg, now_ms)`, where `src` is the sender's authenticated
  NodeId (the transport checked the signature). Both return the messages to
  send. Nothing else has side effects.
* Membership is closed: the set of members is the configured one. Messages
  from, and gossip about, any NodeId not configured are ignored; gossip never
  admits a member. Only the operator changes the set (`set_members`, called
  on a reload of peers.toml): a new member starts as a never-heard
  placeholder and is pinged at once; a removed one is forgotten entirely (its
  gossip, pending probes, and the reports it made about others), so nothing
  it said before its removal can count afterwards.
* Duplicate identities: one process has one advertised address, and moving
  needs a restart, which raises the incarnation. So X's own word going back
  and forth between two addresses (A, then B without a higher incarnation,
  then A again, then B again) means two processes speak with X's key (a
  copied site directory). A single switch is not counted: a restart at a new
  address with lost state (incarnation reset) looks like that once. Each
  return to the other address counts (MemberView.duplicate_*); the evidence
  changes nothing else: which one we follow is still decided below.

Gossip about others is evidence, not truth. Any member may be wrong, buggy or
hostile, so what X is (its incarnation, its address, alive or not) is decided
only by X's own authenticated word and by our own probes:

* X's own word is the `incarnation`/`address` of a Ping or Ack that X itself
  sent (`src == X`). It is the only thing that sets X's incarnation and
  address (peers.toml gives the first address). A new incarnation makes X
  ALIVE. The same incarnation leaves a SUSPECT/DEAD verdict standing: X has
  not heard it yet, and our answer carries it first so X refutes at once. A
  lower incarnation is taken only while we hold X SUSPECT/DEAD: X restarted
  with lost or reset state (also: an incarnation stuck at the ceiling, from the
  old bug) and must be able to come back without anyone hand-editing files;
  while we hold X ALIVE, a lower one is a late message from its past.
  Incarnations above INCARNATION_MAX are ignored.
* An answer to a ping of ours (X's Ack, or an IndirectAck from a relay we asked
  for this probe) proves X is up now: it clears our SUSPECT/DEAD verdict at
  X's known incarnation, and makes a never-heard placeholder ALIVE.
* What a third party says about X is only a report: SUSPECT or DEAD both mean
  "I cannot reach X". ALIVE claims, incarnations and addresses in it are never
  adopted. A report counts if its incarnation lies in [known, known +
  INCARNATION_STEP_MAX] of X's known incarnation (below: stale; far above: a
  lie, or a life of X we never saw). Reports from `suspect_reporters_min`
  distinct members within suspect_timeout_ms, or our own failed probe, start
  our suspicion of X at X's known incarnation (Lifeguard §4.2: one member
  alone cannot make anyone suspect anyone). Only what we suspect or declared
  ourselves is gossiped, so every report an honest member sends is its own.
* X becomes DEAD only by our own suspect timeout (suspect_timeout_ms, longer
  with log n above SUSPECT_SCALE_FROM_MEMBERS members: timing.py). While SUSPECT,
  X is verified every probe period (a never-heard placeholder with a backoff up
  to dead_probe_interval_ms: timing.py verify_interval_ms; at most
  VERIFY_PER_PERIOD_MAX members a period, the longest due first): pinged directly, the
  ping leading with our verdict (see below) so a live X answers (clearing it)
  and refutes, and through one random relay, so a link that only we cannot
  use does not condemn it. DEAD members are verified the same way every
  dead_probe_interval_ms at their last address: this brings back paused
  members and the far side of a healed partition.
* A message sent to a member we hold SUSPECT/DEAD carries that verdict first,
  so the only member able to refute it hears it at once.
* Hearing SUSPECT/DEAD about my current incarnation makes me refute: my
  incarnation + 1 (at INCARNATION_MAX it wraps to 1, which peers take as my
  own word), gossiped ALIVE. At most one refutation per refute_interval_ms, so
  a hostile member cannot drive my incarnation (and the shell's writes of it)
  at its send rate. Claims about any other incarnation of me change nothing:
  peers take my own word. The shell must persist `incarnation` before sending
  anything that carries it.
* A failed probe suspects only the incarnation that was probed, and time in
  which we ourselves did not run (a tick gap over a protocol period, or the
  lateness of our own loop that the caller passes to `tick`) does not count
  against anyone.
* A configured member we have never heard from is a *placeholder*: reported
  SUSPECT (never ALIVE), not gossiped. If nothing arrives within its suspect
  timeout it becomes DEAD locally, still without gossip.
* Every limit and timeout is a field of MembershipConfig or a module constant
  with its unit in the name. State is bounded: one gossip entry per member, one
  report per (member, reporter), pending relayed/extra pings capped at
  pending_probes_per_member_max per member and expired after one period.

* Slow is not dead (Lifeguard §4.1): every wait for X's answer follows X's
  smoothed round-trip time and our own local health, up to PROBE_WAIT_MS_MAX;
  an answer that comes late still proves X up (membership_timing.py).

Known limit: a relay we ask may lie that X answered, which keeps a crashed X
ALIVE at us while that relay is among those asked; it cannot make anyone
suspect or evict X.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from fedpeer.core.membership.gossip import GossipBuffer
from fedpeer.core.membership.members import (
    INCARNATION_MAX,
    INCARNATION_STEP_MAX,
    MemberView,
    _Member,
    start_incarnation,
)
from fedpeer.core.membership.probes import PendingPings, ProbeOrder, _Pending, _Probe
from fedpeer.core.membership.timing import (
    LHM_MAX,
    PROBE_WAIT_MS_MAX,
    RTT_TIMEOUT_MULT,
    SUSPECT_RTT_MULT,
    VerifyBudget,
    MembershipConfig,
    smoothed_rtt_ms,
    suspect_timeout_ms,
    verify_interval_ms,
    wait_ms,
)
from fedpeer.core.membership.wire import Ack, IndirectAck, MemberState, Message, NodeId, Ping, PingReq, Send, Update

__all__ = ["INCARNATION_MAX", "INCARNATION_STEP_MAX", "LHM_MAX", "PROBE_WAIT_MS_MAX", "RTT_TIMEOUT_MULT",
           "SUSPECT_RTT_MULT", "Ack", "IndirectAck", "MemberState", "MemberView", "Membership",
           "MembershipConfig", "Message", "NodeId", "Ping", "PingReq", "Send", "Update", "start_incarnation"]

class Membership:
    """One member's view of the federation. See the module docstring for the rules."""

    def __init__(self, me: NodeId, address: str, incarnation: int, peers: Mapping[NodeId, str],
                 config: MembershipConfig, rng: random.Random, now_ms: int) -> None:
        assert me not in peers, "peers must not include me"
        assert 0 <= incarnation <= INCARNATION_MAX, "use start_incarnation() on the persisted value"
        self._me = me
        self._address = address
        self._incarnation = incarnation
        self._cfg = config
        self._rng = rng
        self._now_ms = now_ms
        self._members = {node: _Member(MemberState.SUSPECT, 0, addr, now_ms)
                         for node, addr in sorted(peers.items())}
        self._configured = dict(peers)   # peers.toml's addresses: set_members notices changes
        self._gossip = GossipBuffer()    # SWIM §4.1: what our messages carry piggybacked
        self._pending = PendingPings(rng.getrandbits(32))  # pings other than the period's probe
        self._probe: _Probe | None = None
        self._order = ProbeOrder()       # SWIM §4.3: whom the next period probes
        self._last_tick_ms: int | None = None
        self._period_end_ms = now_ms + config.probe_interval_ms
        self._next_refute_ms = now_ms
        self._refute_pending = False
        self._lhm = 0                    # local health multiplier (membership_timing.py)
        self._changes = 0                # see `changes`
        self._verify_budget = VerifyBudget(now_ms)     # _timers: verifications we may send now
        # Announce myself: gossip carries my own word to members I do not ping directly soon.
        self._enqueue(Update(me, MemberState.ALIVE, incarnation, address))

    # -- public API -------------------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self._incarnation

    @property
    def changes(self) -> int:
        """A counter that moves whenever what view() says changes, except a member's later
        last_seen_ms and rtt_ms: a caller that reacts to states, incarnations, addresses and
        first contact walks view() only when it moved (the node does so after every message)."""
        return self._changes

    def view(self) -> list[MemberView]:
        """Every member except me, ordered by NodeId."""
        return [MemberView(node, m.state, m.incarnation, m.address, m.last_seen_ms, m.rtt_ms,
                           m.duplicate_count, m.duplicate_address, m.duplicate_ms)
                for node, m in self._members.items()]  # kept in sorted order (set_members too)

    def states(self) -> dict[NodeId, MemberState]:
        """Our verdict about every member except me: what view() says, without building records
        (for callers that poll it after every message, like the node's state-change log)."""
        return {node: m.state for node, m in self._members.items()}

    def address_of(self, node: NodeId) -> str:
        """Last known address of `node` (mine for me). KeyError if not a member."""
        return self._address if node == self._me else self._members[node].address

    def set_members(self, peers: Mapping[NodeId, str], now_ms: int) -> list[Send]:
        """The operator's new member set (peers.toml reloaded): node -> configured address.

        Added members start as placeholders and get a join ping now (returned). Removed members
        are forgotten with everything they told us. A kept member whose configured address
        changed is tried at the new one at once (the operator's word); its own word, when it
        comes, decides again."""
        assert self._me not in peers, "peers must not include me"
        self._advance_clock(now_ms)
        removed = [node for node in self._members if node not in peers]
        for node in removed:
            self._forget(node)
        sends = []
        for node, address in peers.items():
            m = self._members.get(node)
            if m is None:
                self._members[node] = _Member(MemberState.SUSPECT, 0, address, now_ms,
                                              next_ping_ms=now_ms + self._cfg.probe_interval_ms)
                sends.append(self._ping(node, self._track(node, now_ms)))
            elif m.address != address and self._configured.get(node) != address:
                m.address = address
                sends.append(self._ping(node, self._track(node, now_ms)))
        self._configured = dict(peers)
        self._members = dict(sorted(self._members.items()))
        self._changes += 1
        self._order.restart()   # reshuffled over the new set at the next probe
        return sends

    def set_config(self, config: MembershipConfig) -> None:
        """New timings (peers.toml reloaded): running timers keep their deadlines; every timer
        set from now on uses the new values."""
        self._cfg = config

    def _forget(self, node: NodeId) -> None:
        del self._members[node]
        self._gossip.discard(node)
        self._pending.forget(node)
        if self._probe is not None and (self._probe.target == node or node in (self._probe.relays or ())):
            self._probe = None   # its outcome would be about (or through) a non-member
        for m in self._members.values():
            m.reports.pop(node, None)

    def tick(self, now_ms: int, late_ms: int = 0) -> list[Send]:
        """`late_ms`: how late the caller's own loop ran this tick (its wake-up came that long
        after it was due): time in which we could not read an ack, so it counts against no one."""
        self._advance_clock(now_ms)
        sends: list[Send] = []
        if self._last_tick_ms is None:
            sends += self._join(now_ms)
        else:
            self._compensate_stall(now_ms, max(0, late_ms))
        self._last_tick_ms = now_ms
        if self._pending:
            self._pending.expire(now_ms)
        if self._refute_pending and now_ms >= self._next_refute_ms:
            self._refute(now_ms)
        sends += self._timers(now_ms)  # first, so a member that just died is not probed
        sends += self._run_probe(now_ms)
        return sends

    def receive(self, src: NodeId, msg: Message, now_ms: int) -> list[Send]:
        self._advance_clock(now_ms)
        member = self._members.get(src)
        if member is None:  # me, or not a configured member: membership is closed
            return []
        if member.last_seen_ms is None:
            self._changes += 1
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
                m.next_ping_ms = now_ms + self._cfg.probe_interval_ms  # the join ping verifies first
            sends.append(self._ping(node, self._track(node, now_ms)))
        self._period_end_ms = now_ms + self._cfg.probe_interval_ms
        return sends

    def _compensate_stall(self, now_ms: int, late_ms: int) -> None:
        # A tick gap longer than a period means *we* were not running (SIGSTOP, suspended VM,
        # long GC): we could neither receive acks nor refutations, so that time must not count
        # against anyone. Abandon the probe (its outcome says nothing) and shift suspect timers.
        gap_ms = now_ms - self._last_tick_ms
        if gap_ms > self._cfg.probe_interval_ms:
            for m in self._members.values():
                if m.state is MemberState.SUSPECT:
                    m.state_since_ms += gap_ms
            self._probe = None
            self._period_end_ms = now_ms
            return
        # A shorter lateness of our own loop (a busy loop: the ack may sit unread in its queue)
        # likewise counts against no one: the probe's deadlines and the suspicion timers move
        # on by it (Lifeguard's local health, measured on the loop itself: timing.py).
        late_ms = min(late_ms, gap_ms)
        if late_ms <= 0:
            return
        for m in self._members.values():
            if m.state is MemberState.SUSPECT:
                m.state_since_ms += late_ms
        self._period_end_ms += late_ms
        if self._probe is not None:
            self._probe.indirect_ms += late_ms

    # -- failure detector (SWIM §3.1, §4.3) -------------------------------------------------

    def _run_probe(self, now_ms: int) -> list[Send]:
        sends: list[Send] = []
        p = self._probe
        if p is not None and not p.acked and p.relays is None and now_ms >= p.indirect_ms:
            sends += self._send_ping_reqs(p)
        if now_ms < self._period_end_ms:
            return sends
        if p is not None and not p.acked and p.target in self._members:
            self._lhm = min(LHM_MAX, self._lhm + 1)     # a failed probe: maybe it, maybe us
            self._members[p.target].late_probe = (p.probe_id, p.started_ms)
            self._suspect(p.target, p.target_incarnation, now_ms)  # no ack within the period
        self._probe = None
        self._period_end_ms = now_ms + self._cfg.probe_interval_ms
        target = self._next_target()
        if target is not None:
            incarnation = self._members[target].incarnation
            self._probe = _Probe(target, incarnation, self._pending.new_probe_id(), now_ms,
                                 indirect_ms=now_ms + self._wait_ms(target, self._cfg.probe_timeout_ms))
            # a slow target gets a longer window: its answer must be able to arrive within it
            self._period_end_ms = now_ms + self._wait_ms(target, self._cfg.probe_interval_ms)
            sends.append(self._ping(target, self._probe.probe_id))
        return sends

    def _wait_ms(self, node: NodeId, base_ms: int, health: bool = True) -> int:
        """How long an answer from `node` may take (membership_timing.py, "slow is not dead"):
        `base_ms` or RTT_TIMEOUT_MULT of its smoothed RTT, whichever is longer, times our own
        health factor (unless `health` is False), at most PROBE_WAIT_MS_MAX."""
        return wait_ms(base_ms, self._members[node].rtt_ms, self._lhm if health else 0)

    def _suspect_timeout_ms(self, node: NodeId) -> int:
        return suspect_timeout_ms(self._cfg.suspect_timeout_ms, self._members[node].rtt_ms, len(self._members) + 1)

    def _next_target(self) -> NodeId | None:
        # §4.3 round robin (ProbeOrder); the DEAD are verified by their own timer instead.
        if all(m.state is MemberState.DEAD for m in self._members.values()):
            return None
        while True:  # ends within two passes: some member is not DEAD
            node = self._order.next(self._members, self._rng)
            if self._members[node].state is not MemberState.DEAD:
                return node

    def _send_ping_reqs(self, p: _Probe) -> list[Send]:
        others = [node for node, m in self._members.items()   # never heard from: likely not up yet
                  if node != p.target and m.heard and m.state is not MemberState.DEAD]
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
            self._set(node, m, MemberState.SUSPECT, now_ms)

    def _timers(self, now_ms: int) -> list[Send]:
        due = []
        for node, m in self._members.items():
            if m.state is MemberState.SUSPECT:
                if now_ms - m.state_since_ms >= self._suspect_timeout_ms(node):
                    self._confirm_dead(node, m, now_ms)
                elif now_ms >= m.next_ping_ms:
                    due.append((False, m.next_ping_ms, node))
            elif m.state is MemberState.DEAD and now_ms >= m.next_ping_ms:
                due.append((True, m.next_ping_ms, node))     # the suspects first: they may be about to die
        if not due:
            return []
        # At most VERIFY_PER_PERIOD_MAX verifications a period, suspects first, longest due first: a node short
        # of CPU that suspects many members must not flood everyone (timing.py).
        self._verify_budget.refill(now_ms, self._cfg.probe_interval_ms)
        sends = []
        for _, _, node in sorted(due):
            if not self._verify_budget.take():
                break
            m = self._members[node]
            if m.state is MemberState.SUSPECT:
                # Verify it ourselves every period rather than wait for the round robin
                # (up to 2n - 1 periods): a live member answers well within the suspect
                # timeout (a placeholder whose join ping was lost, too), and the direct ping
                # leads with our verdict so it also refutes.
                # as often as its link allows (no flood of a slow one); our health: no matter.
                # Never heard from: with a backoff (its own join ping will come when it starts).
                interval_ms = self._wait_ms(node, self._cfg.probe_interval_ms, health=False)
                if not m.heard:
                    interval_ms = verify_interval_ms(interval_ms, now_ms - m.state_since_ms,
                                                     self._cfg.dead_probe_interval_ms)
                m.next_ping_ms = now_ms + interval_ms
            else:
                # Not in SWIM (which needs an explicit re-join): pinging the dead at their last
                # address lets restarted members and the far side of a healed partition rejoin.
                m.next_ping_ms = now_ms + self._cfg.dead_probe_interval_ms
            sends += self._verify(node, now_ms)
        return sends

    def _verify(self, node: NodeId, now_ms: int) -> list[Send]:
        """A direct ping, and one through a random relay: only our own probes may clear or
        confirm a verdict now that gossip cannot, so a member we cannot reach directly (a
        one-way firewall, a cut link) must still be able to answer through someone else."""
        sends = [self._ping(node, self._track(node, now_ms))]
        relays = [r for r, m in self._members.items() if r != node and m.state is MemberState.ALIVE]
        if relays:
            relay = self._rng.choice(relays)
            probe_id = self._track(node, now_ms, relay=relay)
            sends.append(Send(relay, self._members[relay].address,
                              PingReq(probe_id, node, self._piggyback(relay))))
        return sends

    def _confirm_dead(self, node: NodeId, m: _Member, now_ms: int) -> None:
        if m.heard:  # §4.2: an unrefuted suspicion is confirmed (by us alone) and gossiped
            self._set(node, m, MemberState.DEAD, now_ms)
        else:  # a placeholder: we learnt nothing worth gossiping
            self._changes += 1
            m.state = MemberState.DEAD
            m.state_since_ms = now_ms
            m.next_ping_ms = now_ms + self._cfg.dead_probe_interval_ms

    # -- pings and acks ---------------------------------------------------------------------

    def _track(self, target: NodeId, now_ms: int, requester: NodeId | None = None,
               requester_probe_id: int = 0, relay: NodeId | None = None) -> int:
        """Remember a non-probe ping; returns its probe id. Oldest entries go first when full."""
        cap = self._cfg.pending_probes_per_member_max * (len(self._members) + 1)
        expires_ms = now_ms + self._wait_ms(target, self._cfg.probe_interval_ms)
        return self._pending.track(_Pending(target, now_ms, expires_ms, requester, requester_probe_id, relay), cap)

    def _ping(self, dst: NodeId, probe_id: int) -> Send:
        return Send(dst, self._members[dst].address,
                    Ping(probe_id, self._incarnation, self._address, self._piggyback(dst)))

    def _on_ping(self, src: NodeId, msg: Ping, now_ms: int) -> list[Send]:
        self._own_word(src, msg.incarnation, msg.address, now_ms)
        self._apply_all(src, msg.updates, now_ms)  # may refute: the Ack then carries it
        ack = Ack(msg.probe_id, self._incarnation, self._address, self._piggyback(src))
        return [Send(src, msg.address, ack)]  # answer where the (authenticated) sender says it is

    def _on_ack(self, src: NodeId, msg: Ack, now_ms: int) -> list[Send]:
        self._own_word(src, msg.incarnation, msg.address, now_ms)
        self._apply_all(src, msg.updates, now_ms)
        p = self._probe
        if p is not None and p.probe_id == msg.probe_id and p.target == src:
            if not p.acked:
                self._sample_rtt(src, now_ms - p.started_ms)
                p.acked = True
                self._lhm = max(0, self._lhm - 1)
                self._answered(src, now_ms)
            return []
        late = self._members[src].late_probe
        if late is not None and late[0] == msg.probe_id:    # a probe judged lost: X is slow, not dead
            self._members[src].late_probe = None
            self._sample_rtt(src, now_ms - late[1])
            self._answered(src, now_ms)
            return []
        pending = self._pending.get(msg.probe_id)
        if pending is None or pending.target != src or pending.relay is not None:
            return []  # late, duplicate or foreign ack: X's own word above is all it gives
        self._pending.remove(msg.probe_id)
        self._sample_rtt(src, now_ms - pending.sent_ms)
        self._answered(src, now_ms)
        if pending.requester is None:
            return []
        requester = pending.requester
        msg_back = IndirectAck(pending.requester_probe_id, src, self._piggyback(requester))
        return [Send(requester, self._members[requester].address, msg_back)]

    def _on_ping_req(self, src: NodeId, msg: PingReq, now_ms: int) -> list[Send]:
        self._apply_all(src, msg.updates, now_ms)
        if msg.target not in self._members or msg.target == src:
            return []
        probe_id = self._track(msg.target, now_ms, src, msg.probe_id)
        return [self._ping(msg.target, probe_id)]

    def _on_indirect_ack(self, src: NodeId, msg: IndirectAck, now_ms: int) -> list[Send]:
        self._apply_all(src, msg.updates, now_ms)
        p = self._probe
        if (p is not None and p.relays is not None and src in p.relays and not p.acked
                and p.probe_id == msg.probe_id and p.target == msg.target):
            p.acked = True
            self._lhm = max(0, self._lhm - 1)
            self._answered(msg.target, now_ms)  # a relay we chose vouches: our own probe's answer
            return []
        pending = self._pending.get(msg.probe_id)
        if pending is not None and pending.relay == src and pending.target == msg.target:
            self._pending.remove(msg.probe_id)  # the relayed half of a _verify
            self._answered(msg.target, now_ms)
        return []

    def _sample_rtt(self, node: NodeId, rtt_ms: int) -> None:
        m = self._members[node]
        m.rtt_ms = smoothed_rtt_ms(m.rtt_ms, rtt_ms)

    # -- what X says, what others say (see the module docstring) -----------------------------

    def _own_word(self, node: NodeId, incarnation: int, address: str, now_ms: int) -> None:
        """X's authenticated Ping/Ack: the only source of X's incarnation and address."""
        m = self._members[node]
        if incarnation > INCARNATION_MAX:
            return  # out of range (a peer still on the old bug): its message counts, not its number
        if m.heard and address != m.address and incarnation <= m.incarnation:
            # one process, one address per incarnation: back at the other address means two processes
            if m.duplicate_address == address and m.last_word_address == m.address:
                m.duplicate_count += 1
                m.duplicate_ms = now_ms
            m.duplicate_address = address
            self._changes += 1
        m.last_word_address = address
        if m.heard and (incarnation == m.incarnation or (
                incarnation < m.incarnation and m.state is MemberState.ALIVE)):
            return  # same self (a verdict stands until refuted), or a late message from its past
        m.heard = True
        m.incarnation, m.address = incarnation, address
        self._set(node, m, MemberState.ALIVE, now_ms)

    def _answered(self, node: NodeId, now_ms: int) -> None:
        """A ping of ours was answered: X is up now, whatever others reported or we concluded."""
        m = self._members[node]
        if m.state is not MemberState.ALIVE:
            m.heard = True
            self._set(node, m, MemberState.ALIVE, now_ms)

    def _apply_all(self, src: NodeId, updates: tuple[Update, ...], now_ms: int) -> None:
        for u in updates:
            if u.node == self._me:
                self._about_me(u, now_ms)
            elif u.node != src and u.state is not MemberState.ALIVE:
                self._report(src, u, now_ms)
            # ALIVE about a third party, and anything about the sender itself beyond the
            # Ping/Ack's own fields, says nothing we may adopt.

    def _report(self, src: NodeId, u: Update, now_ms: int) -> None:
        """src says it cannot reach u.node (SUSPECT or DEAD alike): evidence, not a verdict."""
        m = self._members.get(u.node)
        if m is None or not m.heard or m.state is not MemberState.ALIVE:
            return  # not a member; a placeholder already counting down; already suspected
        if not m.incarnation <= u.incarnation <= m.incarnation + INCARNATION_STEP_MAX:
            return  # about a past self (stale), or a jump no honest member could have seen
        m.reports[src] = now_ms  # bounded: one entry per member
        if len(m.reports) < self._cfg.suspect_reporters_min:
            return  # the common case under a lone liar's flood: nothing more to do
        oldest_ms = now_ms - self._cfg.suspect_timeout_ms  # older news: X answered since, or we
        m.reports = {r: at for r, at in m.reports.items() if at > oldest_ms}  # would suspect it
        if len(m.reports) >= self._cfg.suspect_reporters_min:
            self._set(u.node, m, MemberState.SUSPECT, now_ms)  # at X's known incarnation

    def _about_me(self, u: Update, now_ms: int) -> None:
        # §4.2: only I may declare myself alive, by outbidding a suspicion of my current self.
        # Claims about other incarnations of me are stale or lies: peers take my own word.
        if u.state is MemberState.ALIVE or u.incarnation != self._incarnation:
            return
        if now_ms >= self._next_refute_ms:
            self._refute(now_ms)
        else:
            self._refute_pending = True  # done by tick once the interval is over

    def _refute(self, now_ms: int) -> None:
        inc = self._incarnation
        self._incarnation = inc + 1 if inc < INCARNATION_MAX else 1  # 1: peers take my own word
        self._next_refute_ms = now_ms + self._cfg.refute_interval_ms
        self._refute_pending = False
        self._lhm = min(LHM_MAX, self._lhm + 1)    # others could not reach us in time: we may be the slow one
        self._enqueue(Update(self._me, MemberState.ALIVE, self._incarnation, self._address))

    def _set(self, node: NodeId, m: _Member, state: MemberState, now_ms: int) -> None:
        """Our own verdict about node changes: reset its evidence, gossip only what we concluded."""
        self._changes += 1
        m.state = state
        m.state_since_ms = now_ms
        m.reports.clear()
        if state is MemberState.ALIVE:
            self._gossip.discard(node)  # our earlier suspicion is void; X's word is its own to spread
            return
        m.next_ping_ms = now_ms + (0 if state is MemberState.SUSPECT else self._cfg.dead_probe_interval_ms)
        self._enqueue(Update(node, state, m.incarnation, m.address))

    # -- dissemination (SWIM §4.1) ----------------------------------------------------------

    def _enqueue(self, u: Update) -> None:
        self._gossip.enqueue(u)  # one entry per member (membership_gossip.py)
        assert len(self._gossip) <= len(self._members) + 1

    def _piggyback(self, dst: NodeId) -> tuple[Update, ...]:
        """Updates to carry on a message to dst: dst's own bad news first, then gossip."""
        out = []
        m = self._members.get(dst)
        if m is not None and m.heard and m.state is not MemberState.ALIVE:
            # Tell the subject first: it is the only one who can refute (§4.2), and a member that
            # is talking to us is plainly alive. This is what heals pauses and partitions.
            out.append(Update(dst, m.state, m.incarnation, m.address))
        room = self._cfg.piggyback_max - len(out)
        if room <= 0:
            return tuple(out)
        limit = self._cfg.retransmit_limit(len(self._members) + 1)
        out += self._gossip.take(dst, room, limit)
        return tuple(out)
