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

from fedpeer.core.membership import (
    Ack,
    IndirectAck,
    MembershipConfig,
    Membership,
    MemberState,
    Ping,
    PingReq,
    Send,
    Update,
    supersedes,
)

A, S, D = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
CFG = MembershipConfig()
STEP_MS = 50
IDS = [bytes([i + 1]) * 32 for i in range(10)]
ADDRS = [f"10.0.0.{i + 1}:7000" for i in range(10)]
STRANGER = bytes([0xEE]) * 32


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
        # Learnt from B (gossip / indirect ack) within a period or two, never heard directly,
        # and never suspected afterwards.
        first = history.index(A)
        assert first * STEP_MS <= 2 * CFG.probe_interval_ms
        assert set(history[first:]) == {A}
        assert state(c.m(2), 0) is A
        assert member(c.m(0), 2).last_seen_ms is None
        assert indirect_acks, "the indirect path was never exercised"
        assert c.m(2).incarnation == 0  # never needed to refute
    else:
        assert history[-1] is D
        assert not indirect_acks


# -- incarnations, refutation, precedence ------------------------------------------------------

def test_refutation_raises_incarnation_and_is_gossiped():
    a = make(0, 3)
    out = gossip_from(a, 1, (Update(IDS[0], S, 0, ADDRS[0]),), now_ms=10)
    assert a.incarnation == 1
    [ack] = out
    assert isinstance(ack.msg, Ack) and ack.msg.incarnation == 1
    assert Update(IDS[0], A, 1, ADDRS[0]) in ack.msg.updates
    gossip_from(a, 1, (Update(IDS[0], D, 3, ADDRS[0]),), now_ms=20)
    assert a.incarnation == 4
    gossip_from(a, 1, (Update(IDS[0], S, 2, ADDRS[0]), Update(IDS[0], A, 4, ADDRS[0])), now_ms=30)
    assert a.incarnation == 4  # stale suspicion and my own current claim change nothing
    gossip_from(a, 1, (Update(IDS[0], A, 4, "1.2.3.4:1"),), now_ms=40)
    assert a.incarnation == 5  # a wrong address about me is outbid too


_TABLE = [
    # new state/inc vs old state/inc -> overrides?
    (A, 2, S, 1, True), (A, 1, S, 1, False), (A, 0, S, 1, False),
    (A, 2, A, 1, True), (A, 1, A, 1, False),
    (A, 2, D, 1, True), (A, 1, D, 1, False),
    (S, 1, A, 1, True), (S, 2, A, 1, True), (S, 0, A, 1, False),
    (S, 2, S, 1, True), (S, 1, S, 1, False),
    (S, 2, D, 1, True), (S, 1, D, 1, False),
    (D, 1, A, 1, True), (D, 2, A, 1, True), (D, 0, A, 1, False),
    (D, 1, S, 1, True), (D, 0, S, 1, False),
    (D, 2, D, 1, True), (D, 1, D, 1, False),
]


@pytest.mark.parametrize("new,new_inc,old,old_inc,expected", _TABLE)
def test_precedence_table(new, new_inc, old, old_inc, expected):
    assert supersedes(new, new_inc, old, old_inc) is expected
    a = make(0, 3)
    gossip_from(a, 1, (Update(IDS[2], old, old_inc, "old:1"),), now_ms=0)
    assert (state(a, 2), member(a, 2).incarnation) == (old, old_inc)
    gossip_from(a, 1, (Update(IDS[2], new, new_inc, "new:1"),), now_ms=1)
    got = (state(a, 2), member(a, 2).incarnation, a.address_of(IDS[2]))
    assert got == ((new, new_inc, "new:1") if expected else (old, old_inc, "old:1"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([A, S, D]), st.integers(0, 4)), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_gossip_converges_to_the_maximum_whatever_the_order(updates, rnd):
    # The precedence is a total order on (incarnation, state), so two members hearing the same
    # gossip in different orders agree, and the record only ever moves up.
    shuffled = updates[:]
    rnd.shuffle(shuffled)
    finals = []
    for order in (updates, shuffled):
        a = make(0, 3)
        keys = []
        for now, (st_, inc) in enumerate(order):
            gossip_from(a, 1, (Update(IDS[2], st_, inc, ADDRS[2]),), now_ms=now)
            v = member(a, 2)
            keys.append((v.incarnation, [A, S, D].index(v.state)))
        assert keys == sorted(keys)
        finals.append(keys[-1])
    best = max((inc, [A, S, D].index(st_)) for st_, inc in updates)
    assert finals == [best, best]


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


def test_address_change_propagates_via_gossip():
    a = make(0, 3)
    a.receive(IDS[2], Ping(1, 0, ADDRS[2], ()), 0)
    assert a.address_of(IDS[2]) == ADDRS[2]
    out = gossip_from(a, 1, (Update(IDS[2], A, 1, "10.9.9.9:7000"),), now_ms=10)
    assert a.address_of(IDS[2]) == "10.9.9.9:7000"
    assert Update(IDS[2], A, 1, "10.9.9.9:7000") in out[0].msg.updates  # and passed on
    gossip_from(a, 1, (Update(IDS[2], A, 0, "10.0.0.66:7000"),), now_ms=20)
    assert a.address_of(IDS[2]) == "10.9.9.9:7000"  # stale incarnation cannot move it back
    sends = []
    for t in range(30, 3_000, 50):
        sends += a.tick(t)
    assert any(s.dst == IDS[2] for s in sends)
    assert {s.address for s in sends if s.dst == IDS[2]} == {"10.9.9.9:7000"}


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
    a = make(0, 2)
    a.tick(0)
    a.receive(IDS[1], Ack(0, 0, ADDRS[1], ()), 5)  # any ack: node 1 is now heard, ALIVE
    gossip_from(a, 1, (Update(IDS[1], S, 0, ADDRS[1]),), now_ms=10)  # someone suspects it
    assert state(a, 1) is S
    a.tick(50)
    a.tick(50 + 30_000)  # we were stopped for 30 s: its suspicion timer must not have run
    assert state(a, 1) is S
    for t in range(30_100, 30_050 + CFG.suspect_timeout_ms - 100, 50):
        a.tick(t)
    assert state(a, 1) is S
    for t in range(30_050 + CFG.suspect_timeout_ms, 30_050 + CFG.suspect_timeout_ms + 200, 50):
        a.tick(t)
    assert state(a, 1) is D


def test_suspected_member_gets_its_own_suspicion_first_so_it_can_refute():
    a = make(0, 3)
    a.receive(IDS[2], Ping(1, 0, ADDRS[2], ()), 0)
    filler = tuple(Update(IDS[1], A, k, ADDRS[1]) for k in range(1, 3))
    gossip_from(a, 1, filler + (Update(IDS[2], S, 0, ADDRS[2]),), now_ms=1)
    out = a.receive(IDS[2], Ping(2, 0, ADDRS[2], ()), 2)
    assert out[0].msg.updates[0] == Update(IDS[2], S, 0, ADDRS[2])
    assert state(a, 2) is S  # a same-incarnation ping is not a refutation
    a.receive(IDS[2], Ack(99, 1, ADDRS[2], ()), 3)
    assert state(a, 2) is A


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
    news = Update(IDS[3], S, 7, ADDRS[3])
    for t in range(1, 200):
        tally(gossip_from(a, 1 + t % 2, (news,) if t == 1 else (), now_ms=t))
    limit = CFG.retransmit_mult * math.ceil(math.log2(n + 1))
    assert limit == 9
    assert counts[news] == limit
    assert counts[Update(IDS[0], A, 0, ADDRS[0])] == limit  # my own join announcement
    assert counts[Update(IDS[4], A, 0, ADDRS[4])] == limit  # learnt from its ping
    assert counts[Update(IDS[3], A, 0, ADDRS[3])] < limit  # superseded by `news` and dropped


def test_fewest_sent_first():
    cfg = MembershipConfig(piggyback_max=1)
    a = make(0, 3, config=cfg)
    suspicion = Update(IDS[2], S, 0, ADDRS[2])
    me = Update(IDS[0], A, 0, ADDRS[0])
    carried = [gossip_from(a, 1, (suspicion,), now_ms=0)[0].msg.updates]
    carried += [gossip_from(a, 1, (), now_ms=t)[0].msg.updates for t in range(1, 14)]
    limit = cfg.retransmit_limit(3)
    assert limit == 6
    # Oldest of the least-sent first, alternating, each exactly `limit` times, then nothing left
    # (ALIVE about node 1 itself is never sent to node 1).
    assert carried == [(me,), (suspicion,)] * limit + [(), ()]


def test_piggyback_is_capped():
    cfg = MembershipConfig(piggyback_max=2)
    a = make(0, 8, config=cfg)
    for j in range(1, 8):
        a.receive(IDS[j], Ping(1, 0, ADDRS[j], ()), 0)
    out = gossip_from(a, 1, (), now_ms=1)
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
    for t in range(600, 4_000, 50):
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


def test_indirect_ack_carries_what_the_target_said_about_itself():
    b = make(1, 3)
    b.receive(IDS[2], Ping(1, 3, ADDRS[2], ()), 0)
    for _ in range(3 * CFG.retransmit_limit(3)):  # b's gossip about it is long used up
        assert b.receive(IDS[0], Ping(2, 0, ADDRS[0], ()), 0)
    [relay] = b.receive(IDS[0], PingReq(42, IDS[2], ()), 0)
    assert relay.dst == IDS[2] and isinstance(relay.msg, Ping)
    [back] = b.receive(IDS[2], Ack(relay.msg.probe_id, 3, ADDRS[2], ()), 5)
    assert isinstance(back.msg, IndirectAck) and back.dst == IDS[0]
    assert (back.msg.probe_id, back.msg.target) == (42, IDS[2])
    assert back.msg.updates[0] == Update(IDS[2], A, 3, ADDRS[2])
    a = make(0, 3)  # a requester that has never heard from node 2 learns it is alive, at inc 3
    a.receive(IDS[1], back.msg, 6)
    assert (state(a, 2), member(a, 2).incarnation, member(a, 2).last_seen_ms) == (A, 3, None)


def test_a_member_that_dies_at_a_period_boundary_is_not_probed():
    a = make(0, 2)
    [join] = a.tick(0)
    a.receive(IDS[1], Ack(join.msg.probe_id, 0, ADDRS[1], ()), 1)
    suspect_from = 1_000
    for t in range(50, suspect_from + CFG.suspect_timeout_ms, 50):
        for s in a.tick(t):  # X answers every probe but never refutes
            a.receive(IDS[1], Ack(s.msg.probe_id, 0, ADDRS[1], ()), t)
        if t == suspect_from:
            gossip_from(a, 1, (Update(IDS[1], S, 0, ADDRS[1]),), now_ms=t)
    boundary = suspect_from + CFG.suspect_timeout_ms
    assert boundary % CFG.probe_interval_ms == 0 and state(a, 1) is S
    assert a.tick(boundary) == []  # dies now; the period's probe does not go to a dead member
    assert state(a, 1) is D
