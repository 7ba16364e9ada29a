"""Unit tests of the pure SWIM state machine: no event loop, no sockets, no simulator.

`Cluster` below delivers messages instantly and synchronously (zero latency), so
the timing assertions can be exact multiples of the 50 ms step.
"""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.core.membership.swim import (
    INCARNATION_MAX,
    INCARNATION_STEP_MAX,
    Ack,
    IndirectAck,
    Membership,
    MembershipConfig,
    MemberState,
    Ping,
    PingReq,
    Send,
    Update,
    start_incarnation,
)

A, S, D = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
CFG = MembershipConfig()
STEP_MS = 50
IDS = [bytes([i + 1]) * 32 for i in range(10)]
ADDRS = [f"10.0.0.{i + 1}:7000" for i in range(10)]
STRANGER = bytes([0xEE]) * 32
FAKE = "127.0.0.1:9"
WIRE_INCARNATION_MAX = 2**63 - 1  # the largest the wire lets through (fedpeer/wire/frame.py)


def make(i: int, n: int, *, incarnation: int = 0, now_ms: int = 0, address: str | None = None,
         config: MembershipConfig = CFG, seed: int = 0) -> Membership:
    peers = {IDS[j]: ADDRS[j] for j in range(n) if j != i}
    return Membership(me=IDS[i], address=address or ADDRS[i], incarnation=incarnation, peers=peers,
                      config=config, rng=random.Random(seed + i), now_ms=now_ms)


def state(m: Membership, j: int) -> MemberState:
    return {v.node: v.state for v in m.view()}[IDS[j]]


def member(m: Membership, j: int):
    return {v.node: v for v in m.view()}[IDS[j]]


class Cluster:
    """n Memberships, instant delivery; `down` nodes and `cut` (src, dst) links drop messages."""

    def __init__(self, n: int, config: MembershipConfig = CFG, seed: int = 0) -> None:
        self.nodes = {IDS[i]: make(i, n, config=config, seed=seed) for i in range(n)}
        self.down: set[int] = set()
        self.cut: set[tuple[int, int]] = set()
        self.now_ms = 0
        self.log: list[tuple[int, int, Send]] = []  # (time, src index, send), delivered or not

    def index(self, node: bytes) -> int:
        return IDS.index(node)

    def deliver(self, src: int, sends: list[Send]) -> None:
        queue = deque((src, s) for s in sends)
        while queue:
            s_i, send = queue.popleft()
            self.log.append((self.now_ms, s_i, send))
            d_i = self.index(send.dst)
            if d_i in self.down or (s_i, d_i) in self.cut:
                continue
            node = self.nodes[send.dst]
            assert send.address == node.address_of(send.dst), "sent to a stale address"
            queue.extend((d_i, r) for r in node.receive(IDS[s_i], send.msg, self.now_ms))

    def step(self) -> None:
        for node_id, node in self.nodes.items():
            i = self.index(node_id)
            if i not in self.down:
                self.deliver(i, node.tick(self.now_ms))
        self.now_ms += STEP_MS

    def run_until(self, until_ms: int) -> None:
        while self.now_ms <= until_ms:
            self.step()

    def m(self, i: int) -> Membership:
        return self.nodes[IDS[i]]


def gossip_from(m: Membership, src: int, updates: tuple[Update, ...], now_ms: int,
                incarnation: int = 0) -> list[Send]:
    """Deliver updates to m piggybacked on a Ping from IDS[src]."""
    return m.receive(IDS[src], Ping(1, incarnation, ADDRS[src], updates), now_ms)


def heard(m: Membership, j: int, incarnation: int = 0, now_ms: int = 0) -> None:
    """Node j's own word reaches m: a Ping from j itself."""
    m.receive(IDS[j], Ping(1, incarnation, ADDRS[j], ()), now_ms)


def reported(m: Membership, update: Update, now_ms: int, by: tuple[int, ...] = (1, 2)) -> None:
    """The same report from each member in `by` (default: two, enough to start a suspicion)."""
    for src in by:
        gossip_from(m, src, (update,), now_ms)


# -- join -------------------------------------------------------------------------------------

def test_join_converges_in_one_round_and_nobody_is_alive_before_being_heard():
    c = Cluster(5)
    for i in range(5):
        assert all(v.state is S and v.last_seen_ms is None for v in c.m(i).view())
    c.step()  # everyone's first tick pings everyone
    for i in range(5):
        assert [v.state for v in c.m(i).view()] == [A] * 4, f"node {i}"
        assert all(v.last_seen_ms == 0 for v in c.m(i).view())
    first_round = [s for t, _, s in c.log if t == 0]
    assert sum(isinstance(s.msg, Ping) for s in first_round) == 5 * 4


def test_member_never_heard_from_is_never_reported_alive():
    c = Cluster(3)
    c.down.add(2)  # configured but never started
    seen = set()
    while c.now_ms <= 12_000:
        c.step()
        seen |= {state(c.m(0), 2), state(c.m(1), 2)}
    assert A not in seen
    assert state(c.m(0), 2) is D and state(c.m(1), 2) is D
    assert state(c.m(0), 1) is A and state(c.m(1), 0) is A
    # Nothing we learnt nothing about is gossiped: no update about node 2 ever went out.
    assert not any(u.node == IDS[2] for _, _, s in c.log for u in s.msg.updates)


# -- failure detection -----------------------------------------------------------------------

def test_silent_member_goes_suspect_after_one_period_then_dead_after_suspect_timeout():
    c = Cluster(2)  # A alone probes X: every period's target is X, no one else can gossip
    c.run_until(1_000)
    a = c.m(0)
    assert state(a, 1) is A
    c.down.add(1)
    silenced_ms = c.now_ms
    probes = []
    suspect_at = dead_at = None
    while dead_at is None and c.now_ms < 20_000:
        before = len(c.log)
        c.step()
        t = c.now_ms - STEP_MS
        probes += [t for _, src, s in c.log[before:] if src == 0 and isinstance(s.msg, Ping)]
        if suspect_at is None and state(a, 1) is S:
            suspect_at = t
        if state(a, 1) is D:
            dead_at = t
    first_probe = probes[0]
    assert silenced_ms <= first_probe < silenced_ms + CFG.probe_interval_ms
    assert suspect_at == first_probe + CFG.probe_interval_ms
    assert dead_at == suspect_at + CFG.suspect_timeout_ms
    # While suspect the member is still probed every period.
    assert all(b - a_ == CFG.probe_interval_ms
               for a_, b in zip(probes, probes[1:]) if b <= suspect_at)


def test_ping_req_goes_out_after_probe_timeout_to_other_members():
    c = Cluster(5)
    c.run_until(1_000)
    c.cut |= {(0, 4)}  # A's pings to X vanish; X itself is fine
    t0 = c.now_ms
    c.run_until(t0 + 5 * CFG.probe_interval_ms * 4)
    pings = [(t, s) for t, src, s in c.log if t >= t0 and src == 0 and s.dst == IDS[4]
             and isinstance(s.msg, Ping)]
    assert pings, "A never probed X"
    t_ping, ping = pings[0]
    reqs = [(t, s) for t, src, s in c.log if src == 0 and isinstance(s.msg, PingReq)
            and s.msg.probe_id == ping.msg.probe_id]
    assert len(reqs) == CFG.indirect_probes
    assert {t for t, _ in reqs} == {t_ping + CFG.probe_timeout_ms}
    assert {s.dst for _, s in reqs} <= set(IDS[1:4])
    assert all(s.msg.target == IDS[4] for _, s in reqs)


@pytest.mark.parametrize("relay_reaches_x", [True, False])
def test_indirect_probe_saves_member_with_broken_direct_link(relay_reaches_x):
    c = Cluster(3)
    c.cut |= {(0, 2), (2, 0)}  # A <-> X broken from the start, both ways
    if not relay_reaches_x:
        c.cut |= {(1, 2), (2, 1)}  # control: X is unreachable for everyone
    history = []
    while c.now_ms <= 20_000:
        c.step()
        history.append(state(c.m(0), 2))
    indirect_acks = [s for _, src, s in c.log if isinstance(s.msg, IndirectAck) and s.dst == IDS[0]]
    if relay_reaches_x:
        # Learnt through our own probe via B (an indirect ack) on the first probe of X (in the
        # first or second period), never heard directly, and never suspected afterwards.
        first = history.index(A)
        assert first * STEP_MS <= 2 * CFG.probe_interval_ms + CFG.probe_timeout_ms
        assert set(history[first:]) == {A}
        assert state(c.m(2), 0) is A
        assert member(c.m(0), 2).last_seen_ms is None
        assert indirect_acks, "the indirect path was never exercised"
        assert c.m(2).incarnation == 0  # never needed to refute
    else:
        assert history[-1] is D
        assert not indirect_acks


# -- refutation: only X raises X's incarnation -------------------------------------------------

def test_refutation_raises_incarnation_by_one_and_is_gossiped():
    a = make(0, 3)
    out = gossip_from(a, 1, (Update(IDS[0], S, 0, ADDRS[0]),), now_ms=10)
    assert a.incarnation == 1
    [ack] = out
    assert isinstance(ack.msg, Ack) and ack.msg.incarnation == 1
    assert Update(IDS[0], A, 1, ADDRS[0]) in ack.msg.updates
    gossip_from(a, 2, (Update(IDS[0], D, 1, FAKE),), now_ms=10 + CFG.refute_interval_ms)
    assert a.incarnation == 2  # a death notice of my current self: one more step
    # Claims about any other incarnation of me, or ALIVE ones, change nothing: peers take my word.
    for k, claim in enumerate((Update(IDS[0], S, 1, ADDRS[0]), Update(IDS[0], D, 3, ADDRS[0]),
                               Update(IDS[0], D, WIRE_INCARNATION_MAX, FAKE),
                               Update(IDS[0], A, 2, FAKE), Update(IDS[0], A, 9, ADDRS[0]))):
        gossip_from(a, 1, (claim,), now_ms=2_000 + k * CFG.refute_interval_ms)
        assert a.incarnation == 2, claim


def test_refutation_is_rate_limited():
    # A member that suspects me at my current incarnation in every message cannot drive my
    # incarnation (and the shell's write of it to disk) at its send rate.
    a = make(0, 3)
    a.tick(0)
    for t in range(1, 2_000):
        gossip_from(a, 1, (Update(IDS[0], S, a.incarnation, FAKE),), now_ms=t)
        if t % 50 == 0:
            a.tick(t)
    assert a.incarnation == 1 + 1_999 // CFG.refute_interval_ms  # one refutation per interval
    gossip_from(a, 1, (Update(IDS[0], S, a.incarnation, FAKE),), now_ms=2_100)  # refuted at once
    before = a.incarnation
    gossip_from(a, 1, (Update(IDS[0], S, a.incarnation, FAKE),), now_ms=2_200)  # too soon
    assert a.incarnation == before
    a.tick(2_100 + CFG.refute_interval_ms)  # a deferred refutation is not forgotten
    assert a.incarnation == before + 1


def test_refutation_at_the_ceiling_wraps_and_peers_take_the_members_word():
    x = make(3, 4, incarnation=INCARNATION_MAX)
    a = make(0, 4)
    heard(a, 3, INCARNATION_MAX)
    a.tick(0)
    reported(a, Update(IDS[3], S, INCARNATION_MAX, ADDRS[3]), 10)
    [verify] = [s for s in a.tick(50) if s.dst == IDS[3]]
    x.receive(IDS[0], verify.msg, 60)
    assert x.incarnation == 1  # never past INCARNATION_MAX
    [join] = [s for s in x.tick(70) if s.dst == IDS[0]]  # X's own ping carries its new number
    a.receive(IDS[3], join.msg, 80)
    assert (state(a, 3), member(a, 3).incarnation) == (A, 1)


# -- gossip about others is evidence, not truth ---------------------------------------------

def test_third_party_death_notice_at_a_huge_incarnation_changes_nothing():
    # The attack as reproduced on real daemons: one member's ping says X is dead at 2**63 - 1,
    # at a fake address. Even from every other member, it moves neither X's state, nor its
    # incarnation, nor its address, and nobody passes it on.
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j, incarnation=5)
    lie = Update(IDS[3], D, WIRE_INCARNATION_MAX, FAKE)
    out = []
    for t in range(1, 200):
        out += gossip_from(a, 1 + t % 2, (lie,), now_ms=t)
        out += a.tick(t)
    assert (state(a, 3), member(a, 3).incarnation, a.address_of(IDS[3])) == (A, 5, ADDRS[3])
    assert not any(u.node == IDS[3] and u.state is not A for s in out for u in s.msg.updates)


@pytest.mark.parametrize("lie", [D, S])
def test_third_party_death_is_only_a_suspicion_and_x_refutes_it(lie):
    c = Cluster(4)
    c.run_until(1_000)
    x_inc = c.m(3).incarnation
    # Members 1 and 2 (two reporters: one alone starts nothing) tell node 0 that X is dead.
    for src in (1, 2):
        gossip_from(c.m(0), src, (Update(IDS[3], lie, x_inc, FAKE),), c.now_ms)
    assert (state(c.m(0), 3), member(c.m(0), 3).incarnation) == (S, x_inc)  # never DEAD on hearsay
    assert c.m(0).address_of(IDS[3]) == ADDRS[3]
    history = []
    for _ in range(2 * CFG.suspect_timeout_ms // STEP_MS):
        c.step()
        history.append(state(c.m(0), 3))
    assert D not in history
    assert c.m(3).incarnation == x_inc + 1  # X heard the suspicion (our ping led with it) and refuted
    assert [(v.state, v.incarnation) for v in c.m(0).view()][2] == (A, x_inc + 1)
    first_alive = history.index(A)
    assert first_alive * STEP_MS <= CFG.probe_interval_ms  # cleared by our own verify ping


def test_one_reporter_alone_starts_no_suspicion_but_two_do():
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j, incarnation=2)
    for t in range(1, 100):
        gossip_from(a, 1, (Update(IDS[3], S, 2, ADDRS[3]), Update(IDS[3], D, 2, ADDRS[3])), t)
    assert state(a, 3) is A
    gossip_from(a, 2, (Update(IDS[3], S, 2, ADDRS[3]),), 100)
    assert (state(a, 3), member(a, 3).incarnation) == (S, 2)


def test_old_reports_expire():
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j, incarnation=2)
    gossip_from(a, 1, (Update(IDS[3], S, 2, ADDRS[3]),), 0)
    gossip_from(a, 2, (Update(IDS[3], S, 2, ADDRS[3]),), CFG.suspect_timeout_ms)
    assert state(a, 3) is A  # the first report is as old as a suspicion's whole life
    gossip_from(a, 1, (Update(IDS[3], S, 2, ADDRS[3]),), CFG.suspect_timeout_ms + 1)
    assert state(a, 3) is S


@pytest.mark.parametrize("offset,counts", [(-1, False), (0, True), (1, True),
                                           (INCARNATION_STEP_MAX, True),
                                           (INCARNATION_STEP_MAX + 1, False), (2**40, False)])
def test_reports_count_only_near_the_incarnation_x_announced(offset, counts):
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j, incarnation=10)
    reported(a, Update(IDS[3], D, 10 + offset, FAKE), 1)
    # A report that counts suspects X at the incarnation X itself announced, never at the
    # reporter's number, and never moves its address.
    assert (state(a, 3), member(a, 3).incarnation, a.address_of(IDS[3])) == (S if counts else A, 10, ADDRS[3])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.sampled_from([A, S, D]),
                          st.sampled_from([0, 1, 4, 5, 6, 37, 2**62, WIRE_INCARNATION_MAX]),
                          st.sampled_from([ADDRS[3], FAKE])), max_size=30))
def test_no_gossip_from_others_moves_x_incarnation_or_address_or_kills_it(reports):
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j, incarnation=5)
    for now, (src, st_, inc, addr) in enumerate(reports, start=1):
        gossip_from(a, src, (Update(IDS[3], st_, inc, addr),), now)
        v = member(a, 3)
        assert (v.incarnation, v.address) == (5, ADDRS[3])
        assert v.state is not D  # DEAD only by our own timeout
    # Suspected iff both others reported it at an incarnation that counts.
    counting = {src for src, st_, inc, _ in reports if st_ is not A and 5 <= inc <= 5 + INCARNATION_STEP_MAX}
    assert member(a, 3).state is (S if counting == {1, 2} else A)


def test_gossip_about_unknown_node_is_ignored_and_not_forwarded():
    a = make(0, 3)
    gossip_from(a, 1, (Update(STRANGER, A, 5, "evil:1"),), now_ms=0)
    assert STRANGER not in {v.node for v in a.view()}
    with pytest.raises(KeyError):
        a.address_of(STRANGER)
    out = a.tick(10) + gossip_from(a, 1, (), now_ms=20)
    assert not any(u.node == STRANGER for s in out for u in s.msg.updates)
    # Nor does a message from an unknown sender do anything.
    assert a.receive(STRANGER, Ping(7, 0, "evil:1", ()), 30) == []
    assert len(a.view()) == 2


def test_address_changes_only_by_the_members_own_word():
    a = make(0, 3)
    heard(a, 2)
    for k, claim in enumerate((Update(IDS[2], A, 1, FAKE), Update(IDS[2], A, 2**40, FAKE),
                               Update(IDS[2], S, 0, FAKE), Update(IDS[2], D, 1, FAKE))):
        gossip_from(a, 1, (claim,), now_ms=10 + k)
        assert a.address_of(IDS[2]) == ADDRS[2], claim
        assert member(a, 2).incarnation == 0
    # Its own Ping at a new incarnation moves it; a late one from its past does not move it back.
    a.receive(IDS[2], Ping(3, 1, "10.9.9.9:7000", ()), 20)
    assert (a.address_of(IDS[2]), member(a, 2).incarnation) == ("10.9.9.9:7000", 1)
    a.receive(IDS[2], Ack(4, 0, ADDRS[2], ()), 21)
    assert (a.address_of(IDS[2]), member(a, 2).incarnation) == ("10.9.9.9:7000", 1)
    sends = []
    for t in range(30, 3_000, 50):
        sends += a.tick(t)
    assert {s.address for s in sends if s.dst == IDS[2]} == {"10.9.9.9:7000"}


def test_indirect_ack_carries_no_third_party_claim_about_the_target():
    b = make(1, 3)
    b.receive(IDS[2], Ping(1, 3, ADDRS[2], ()), 0)
    [relay] = b.receive(IDS[0], PingReq(42, IDS[2], ()), 0)
    assert relay.dst == IDS[2] and isinstance(relay.msg, Ping)
    [back] = b.receive(IDS[2], Ack(relay.msg.probe_id, 3, ADDRS[2], ()), 5)
    assert isinstance(back.msg, IndirectAck) and back.dst == IDS[0]
    assert (back.msg.probe_id, back.msg.target) == (42, IDS[2])
    assert not any(u.node == IDS[2] for u in back.msg.updates)  # X's word is X's to give


# -- recovery from the old bug: an incarnation out of range -------------------------------------

@pytest.mark.parametrize("persisted,expected", [(None, 1), (0, 1), (41, 42),
                                                (INCARNATION_MAX - 1, INCARNATION_MAX),
                                                (INCARNATION_MAX, 1), (2**63, 1), (-1, 1)])
def test_start_incarnation_resets_out_of_range_values(persisted, expected):
    assert start_incarnation(persisted) == expected


def test_a_member_stuck_at_a_huge_incarnation_comes_back_by_its_own_word():
    # A peer remembers X at INCARNATION_MAX (announced by X before a restart reset it to 1).
    a = make(0, 4)
    heard(a, 3, incarnation=INCARNATION_MAX)
    a.receive(IDS[3], Ping(2, 1, "10.0.0.77:7000", ()), 1)
    assert member(a, 3).incarnation == INCARNATION_MAX  # held ALIVE: a late message from its past
    reported(a, Update(IDS[3], S, INCARNATION_MAX, ADDRS[3]), 2)
    assert state(a, 3) is S
    a.receive(IDS[3], Ping(3, 1, "10.0.0.77:7000", ()), 3)  # X's own word, after its restart
    assert (state(a, 3), member(a, 3).incarnation, a.address_of(IDS[3])) == (A, 1, "10.0.0.77:7000")


def test_an_out_of_range_incarnation_from_the_member_itself_is_ignored():
    a = make(0, 3)
    heard(a, 2, incarnation=4)
    [ack] = a.receive(IDS[2], Ping(9, WIRE_INCARNATION_MAX, FAKE, ()), 1)
    assert (member(a, 2).incarnation, a.address_of(IDS[2])) == (4, ADDRS[2])
    assert isinstance(ack.msg, Ack)  # still answered: the message counts, not its number


def test_an_answer_to_our_ping_clears_a_suspicion_at_the_same_incarnation():
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j)
    a.tick(0)
    reported(a, Update(IDS[3], S, 0, ADDRS[3]), 10)
    assert state(a, 3) is S
    [verify] = [s for s in a.tick(50) if s.dst == IDS[3]]
    assert verify.msg.updates[0] == Update(IDS[3], S, 0, ADDRS[3])  # our verdict first
    a.receive(IDS[3], Ack(verify.msg.probe_id + 1, 0, ADDRS[3], ()), 60)
    assert state(a, 3) is S  # not an answer to a ping of ours
    a.receive(IDS[3], Ack(verify.msg.probe_id, 0, ADDRS[3], ()), 61)
    assert (state(a, 3), member(a, 3).incarnation) == (A, 0)


def verify_sends(m: Membership, now_ms: int, target: int) -> tuple[Send, Send]:
    sends = m.tick(now_ms)
    [direct] = [s for s in sends if s.dst == IDS[target] and isinstance(s.msg, Ping)]
    [relayed] = [s for s in sends if isinstance(s.msg, PingReq) and s.msg.target == IDS[target]]
    return direct, relayed


@pytest.mark.parametrize("verdict", [S, D])
def test_a_member_we_cannot_reach_directly_is_verified_through_a_relay(verdict):
    # Gossip can no longer vouch for X, so our own verification must work when only our direct
    # link to X is broken (a one-way firewall): a suspect each period, a dead member each
    # dead_probe_interval_ms, also asks one random relay to ping it.
    a = make(0, 4)
    for j in (1, 2, 3):
        heard(a, j)
    a.tick(0)
    reported(a, Update(IDS[3], S, 0, ADDRS[3]), 10)
    t = 50
    if verdict is D:
        for t in range(50, 50 + CFG.suspect_timeout_ms + CFG.dead_probe_interval_ms, 50):
            for s in a.tick(t):  # the others answer; nothing reaches X or comes back from it
                if isinstance(s.msg, Ping) and s.dst != IDS[3]:
                    a.receive(s.dst, Ack(s.msg.probe_id, 0, s.address, ()), t)
        assert state(a, 3) is D
        t += 50
    direct, relayed = verify_sends(a, t, 3)
    assert direct.msg.updates[0].node == IDS[3]  # our verdict first, so X can refute
    relay = IDS.index(relayed.dst)
    other = 3 - relay
    a.receive(IDS[other], IndirectAck(relayed.msg.probe_id, IDS[3], ()), t + 1)
    assert state(a, 3) is verdict  # only the relay we asked may vouch
    a.receive(IDS[relay], IndirectAck(relayed.msg.probe_id + 1, IDS[3], ()), t + 1)
    assert state(a, 3) is verdict  # nor for another probe
    a.receive(IDS[relay], IndirectAck(relayed.msg.probe_id, IDS[3], ()), t + 2)
    assert (state(a, 3), member(a, 3).incarnation, a.address_of(IDS[3])) == (A, 0, ADDRS[3])


def test_a_placeholder_whose_join_ping_was_lost_is_pinged_again_with_a_backoff():
    a = make(0, 3)
    heard(a, 1)
    a.tick(0)  # the join ping to node 2 is lost
    pings = [t for t in range(50, 3_000, 50) for s in a.tick(t)
             if s.dst == IDS[2] and isinstance(s.msg, Ping)]
    # verified at 0.5, 1 and 2 s (timing.py verify_interval_ms), whatever the round robin does
    assert {500, 1_000, 2_000} <= set(pings)
    assert all(b - a_ <= CFG.dead_probe_interval_ms for a_, b in zip([0, *pings], pings))  # not n apart


def test_restarted_member_with_higher_incarnation_is_alive_again():
    c = Cluster(3)
    c.run_until(1_000)
    c.down.add(2)
    c.run_until(12_000)
    assert state(c.m(0), 2) is D and state(c.m(1), 2) is D
    old = c.m(2).incarnation
    c.nodes[IDS[2]] = make(2, 3, incarnation=old + 1, now_ms=c.now_ms, address="10.0.0.99:7000")
    c.down.discard(2)
    restart_ms = c.now_ms
    c.step()
    for i in (0, 1):
        assert (state(c.m(i), 2), member(c.m(i), 2).incarnation) == (A, old + 1)
        assert c.m(i).address_of(IDS[2]) == "10.0.0.99:7000"
        assert member(c.m(i), 2).last_seen_ms == restart_ms
    assert [v.state for v in c.m(2).view()] == [A, A]


def test_paused_member_refutes_and_comes_back():
    c = Cluster(3)
    c.run_until(1_000)
    c.down.add(2)  # SIGSTOP: it neither ticks nor hears (instant net: nothing queues)
    c.run_until(16_000)
    assert state(c.m(0), 2) is D and state(c.m(1), 2) is D
    c.down.discard(2)
    resumed_ms = c.now_ms
    c.run_until(resumed_ms + CFG.dead_probe_interval_ms + 2 * STEP_MS)
    assert c.m(2).incarnation >= 1  # it had to outbid its own death notice
    assert state(c.m(0), 2) is A and state(c.m(1), 2) is A
    assert [v.state for v in c.m(2).view()] == [A, A]  # the stall did not make it suspect others


def test_stall_does_not_count_against_others():
    a = make(0, 4)
    a.tick(0)
    for j in (1, 2, 3):
        heard(a, j, now_ms=5)
    reported(a, Update(IDS[3], S, 0, ADDRS[3]), 10)  # two others suspect it
    assert state(a, 3) is S
    a.tick(50)
    a.tick(50 + 30_000)  # we were stopped for 30 s: its suspicion timer must not have run
    assert state(a, 3) is S
    for t in range(30_100, 30_050 + CFG.suspect_timeout_ms - 100, 50):
        a.tick(t)
    assert state(a, 3) is S
    for t in range(30_050 + CFG.suspect_timeout_ms, 30_050 + CFG.suspect_timeout_ms + 200, 50):
        a.tick(t)
    assert state(a, 3) is D


def test_suspected_member_gets_its_own_suspicion_first_so_it_can_refute():
    a = make(0, 4)
    heard(a, 3)
    reported(a, Update(IDS[3], S, 0, ADDRS[3]), 1)
    out = a.receive(IDS[3], Ping(2, 0, ADDRS[3], ()), 2)
    assert out[0].msg.updates[0] == Update(IDS[3], S, 0, ADDRS[3])
    assert state(a, 3) is S  # a same-incarnation ping is not a refutation
    a.receive(IDS[3], Ack(99, 1, ADDRS[3], ()), 3)
    assert (state(a, 3), member(a, 3).incarnation) == (A, 1)


# -- gossip, rtt, bounded state ---------------------------------------------------------------

def test_each_update_is_piggybacked_lambda_log_n_times():
    n = 5
    a = make(0, n)
    counts: dict[Update, int] = {}

    def tally(sends):
        for s in sends:
            assert len(s.msg.updates) <= CFG.piggyback_max
            for u in s.msg.updates:
                counts[u] = counts.get(u, 0) + 1

    for j in range(1, n):
        tally(a.receive(IDS[j], Ping(1, 0, ADDRS[j], ()), 0))
    news = Update(IDS[3], S, 0, ADDRS[3])
    for t in range(1, 200):
        tally(gossip_from(a, 1 + t % 2, (news,) if t <= 2 else (), now_ms=t))  # 2 reporters: adopted
    limit = CFG.retransmit_mult * math.ceil(math.log2(n + 1))
    assert limit == 9
    assert counts[news] == limit  # our own suspicion, once adopted
    assert counts[Update(IDS[0], A, 0, ADDRS[0])] == limit  # my own join announcement
    assert not any(u.node == IDS[4] for u in counts)  # what node 4 says of itself is its own to say


def test_fewest_sent_first():
    cfg = MembershipConfig(piggyback_max=1)
    a = make(0, 4, config=cfg)
    suspicion = Update(IDS[3], S, 0, ADDRS[3])
    me = Update(IDS[0], A, 0, ADDRS[0])
    assert heard(a, 3) is None and gossip_from(a, 1, (suspicion,), 1)[0].msg.updates == (me,)
    carried = [gossip_from(a, 2, (suspicion,), 2)[0].msg.updates]  # adopted: sent 0, `me` 2
    carried += [gossip_from(a, 1, (), now_ms=t)[0].msg.updates for t in range(3, 20)]
    limit = cfg.retransmit_limit(4)
    assert limit == 9
    # The least-sent first (oldest first among equals), each exactly `limit` times, then nothing
    # (nothing about node 1 itself is ever sent to node 1).
    assert carried == [(suspicion,), (suspicion,)] + [(me,), (suspicion,)] * (limit - 2) + [(), ()]


def test_piggyback_is_capped():
    cfg = MembershipConfig(piggyback_max=2)
    a = make(0, 8, config=cfg)
    for j in range(1, 8):
        heard(a, j)
    for j in range(3, 8):  # five suspicions of ours and my own announcement to spread
        reported(a, Update(IDS[j], S, 0, ADDRS[j]), 1)
    out = gossip_from(a, 1, (), now_ms=2)
    assert len(out[0].msg.updates) == 2


def test_rtt_ewma_and_last_seen():
    a = make(0, 2)
    [join] = a.tick(0)
    a.receive(IDS[1], Ack(join.msg.probe_id, 0, ADDRS[1], ()), 40)
    assert member(a, 1).rtt_ms == 40.0 and member(a, 1).last_seen_ms == 40
    t = 50
    while True:
        probe = [s for s in a.tick(t) if isinstance(s.msg, Ping)]
        if probe:
            break
        t += 50
    a.receive(IDS[1], Ack(probe[0].msg.probe_id, 0, ADDRS[1], ()), t + 90)
    assert member(a, 1).rtt_ms == pytest.approx(0.8 * 40 + 0.2 * 90)
    a.receive(IDS[1], Ack(probe[0].msg.probe_id, 0, ADDRS[1], ()), t + 500)  # duplicate: no sample
    assert member(a, 1).rtt_ms == pytest.approx(0.8 * 40 + 0.2 * 90)
    assert member(a, 1).last_seen_ms == t + 500


def test_ping_req_flood_is_bounded_and_expires():
    n = 3
    a = make(0, n)
    a.tick(0)
    flood = []
    for k in range(1_000):
        flood += a.receive(IDS[1], PingReq(k, IDS[2], ()), 1)
    assert len(flood) == 1_000 and all(s.dst == IDS[2] for s in flood)
    relayed = []
    for s in flood:  # X answers every relayed ping
        relayed += a.receive(IDS[2], Ack(s.msg.probe_id, 0, ADDRS[2], ()), 2)
    cap = CFG.pending_probes_per_member_max * n
    assert 0 < len(relayed) <= cap
    newest = set(range(1_000 - len(relayed), 1_000))
    assert {s.msg.probe_id for s in relayed} == newest  # the oldest were evicted
    late = a.receive(IDS[1], PingReq(5_000, IDS[2], ()), 3)
    a.tick(3 + CFG.probe_interval_ms)
    expired = Ack(late[0].msg.probe_id, 0, ADDRS[2], ())
    assert a.receive(IDS[2], expired, 3 + CFG.probe_interval_ms) == []


def test_flood_does_not_break_own_probe():
    c = Cluster(3)
    c.run_until(600)
    for _ in range(600, 4_000, 50):
        for k in range(50):
            c.m(1).receive(IDS[2], PingReq(k, IDS[0], ()), c.now_ms)  # replies discarded
        c.step()
    assert state(c.m(1), 0) is A and state(c.m(1), 2) is A


def test_indirect_ack_only_counts_from_an_asked_relay():
    a = make(0, 3)
    for j in (1, 2):
        a.receive(IDS[j], Ping(1, 0, ADDRS[j], ()), 0)
    a.tick(0)
    t, probe = 50, None
    while probe is None:
        probe = next((s for s in a.tick(t) if isinstance(s.msg, Ping)), None)
        t += 50
    target = IDS.index(probe.dst)
    other = 3 - target
    # An IndirectAck before any PingReq went out, or from a member never asked, is ignored.
    a.receive(IDS[other], IndirectAck(probe.msg.probe_id, probe.dst, ()), t)
    for t2 in range(t, t + CFG.probe_interval_ms + 50, 50):
        a.tick(t2)
    assert state(a, target) is S


def test_config_validation():
    with pytest.raises(ValueError):
        MembershipConfig(probe_timeout_ms=600)
    with pytest.raises(ValueError):
        MembershipConfig(piggyback_max=0)


@pytest.mark.parametrize("restarts_mid_probe", [True, False])
def test_failed_probe_of_a_past_incarnation_does_not_suspect_the_new_one(restarts_mid_probe):
    a = make(0, 2)
    [join] = a.tick(0)
    a.receive(IDS[1], Ack(join.msg.probe_id, 0, ADDRS[1], ()), 5)
    t = 50
    while not any(isinstance(s.msg, Ping) for s in a.tick(t)):  # the probe X never answers
        t += 50
    if restarts_mid_probe:  # X restarted: its join ping carries incarnation 1
        a.receive(IDS[1], Ping(77, 1, ADDRS[1], ()), t + 100)
    for t2 in range(t + 150, t + CFG.probe_interval_ms + 50, 50):
        a.tick(t2)
    assert (state(a, 1), member(a, 1).incarnation) == ((A, 1) if restarts_mid_probe else (S, 0))


def test_a_member_that_dies_at_a_period_boundary_is_not_probed():
    a = make(0, 4)
    suspect_from = 1_000
    for t in range(0, suspect_from + CFG.suspect_timeout_ms, 50):
        for s in a.tick(t):  # everyone answers, X only until two others report it, then never
            if isinstance(s.msg, Ping) and (s.dst != IDS[3] or t < suspect_from):
                a.receive(s.dst, Ack(s.msg.probe_id, 0, s.address, ()), t)
        if t == suspect_from:
            reported(a, Update(IDS[3], S, 0, ADDRS[3]), t)
    boundary = suspect_from + CFG.suspect_timeout_ms
    assert boundary % CFG.probe_interval_ms == 0 and state(a, 3) is S
    assert not any(s.dst == IDS[3] for s in a.tick(boundary))  # dies now: neither probed nor verified
    assert state(a, 3) is D


