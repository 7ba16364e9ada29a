"""The operator changes the member set of running pure cores (a reload of peers.toml):
membership adds, forgets and re-addresses members; the election's quorum follows the set;
two processes with one key are noticed. No event loop, no sockets."""

from __future__ import annotations

from fedpeer.core.election.raft import Heartbeat, HeartbeatReply, RequestVote, Role
from fedpeer.core.membership.swim import MembershipConfig, Ping, PingReq, Update
from tests.unit.test_election import IDS as EIDS
from tests.unit.test_election import Cluster as ElectionCluster
from tests.unit.test_election import beat, msgs
from tests.unit.test_election import make as make_election
from tests.unit.test_membership import (
    ADDRS,
    IDS,
    A,
    Cluster,
    D,
    S,
    heard,
    make,
    member,
    state,
)

# -- membership -------------------------------------------------------------------------------

def test_an_added_member_is_pinged_at_once_and_becomes_alive_without_a_restart():
    c = Cluster(4)
    for i in range(3):   # site 3 is not yet in the others' peers.toml
        c.m(i).set_members({IDS[j]: ADDRS[j] for j in range(3) if j != i}, 0)
    c.run_until(2_000)
    assert IDS[3] not in {v.node for v in c.m(0).view()}
    sends = c.m(0).set_members({IDS[j]: ADDRS[j] for j in (1, 2, 3)}, c.now_ms)
    assert [(s.dst, type(s.msg)) for s in sends] == [(IDS[3], Ping)], "the newcomer is pinged at once"
    c.deliver(0, sends)
    assert state(c.m(0), 3) is A


def test_a_removed_member_is_forgotten_with_its_reports_and_ignored_afterwards():
    c = Cluster(4)
    c.run_until(1_000)
    m = c.m(0)
    x = member(m, 2)
    # member 1 reports 2 as suspect: evidence that must not outlive 1's removal
    m.receive(IDS[1], Ping(9, member(m, 1).incarnation, ADDRS[1],
                           (Update(IDS[2], S, x.incarnation, ADDRS[2]),)), c.now_ms)
    m.set_members({IDS[2]: ADDRS[2], IDS[3]: ADDRS[3]}, c.now_ms)
    assert [v.node for v in m.view()] == [IDS[2], IDS[3]]
    # one more report from 3 would have made two reporters with 1's: now it is one alone
    m.receive(IDS[3], Ping(9, member(m, 3).incarnation, ADDRS[3],
                           (Update(IDS[2], S, x.incarnation, ADDRS[2]),)), c.now_ms)
    assert state(m, 2) is A
    assert m.receive(IDS[1], Ping(10, 99, ADDRS[1], ()), c.now_ms) == []   # not a member any more
    for _ in range(40):   # no probe, relay or ping ever goes to the removed member
        sends = m.tick(c.now_ms)
        assert all(s.dst != IDS[1] and not (isinstance(s.msg, PingReq) and s.msg.target == IDS[1])
                   for s in sends)
        c.now_ms += 50


def test_a_new_configured_address_is_tried_at_once():
    m = make(0, 3)
    m.tick(0)
    sends = m.set_members({IDS[1]: "10.9.9.9:7000", IDS[2]: ADDRS[2]}, 100)
    assert [(s.dst, s.address) for s in sends] == [(IDS[1], "10.9.9.9:7000")]
    assert m.set_members({IDS[1]: "10.9.9.9:7000", IDS[2]: ADDRS[2]}, 200) == []   # unchanged: nothing


def test_a_member_speaking_from_two_addresses_back_and_forth_is_a_duplicate_identity():
    m = make(0, 3)
    heard(m, 1, incarnation=3)
    m.receive(IDS[1], Ping(2, 3, "10.7.7.7:7000", ()), 100)      # same key, another process ...
    assert member(m, 1).duplicate_count == 0, "one switch may be a restart at a new address"
    m.receive(IDS[1], Ping(3, 3, ADDRS[1], ()), 150)             # ... and the first one again
    m.receive(IDS[1], Ping(4, 2, "10.7.7.7:7000", ()), 200)
    v = member(m, 1)
    assert (v.duplicate_count, v.duplicate_address, v.duplicate_ms) == (1, "10.7.7.7:7000", 200)
    assert v.address == ADDRS[1], "which process we follow is not changed by the evidence"
    m.receive(IDS[1], Ping(5, 3, ADDRS[1], ()), 250)
    m.receive(IDS[1], Ping(6, 3, "10.7.7.7:7000", ()), 300)
    assert member(m, 1).duplicate_count == 2
    m.receive(IDS[1], Ping(7, 4, "10.8.8.8:7000", ()), 400)      # a restart at a new address: a move
    assert member(m, 1).duplicate_count == 2 and member(m, 1).address == "10.8.8.8:7000"


def test_a_restart_at_a_new_address_with_lost_state_is_not_a_duplicate():
    m = make(0, 3)
    heard(m, 1, incarnation=7)
    for t in range(100, 2_000, 100):   # the new process, incarnation reset, until we take its word
        m.receive(IDS[1], Ping(t, 1, "10.9.9.9:7000", ()), t)
    assert member(m, 1).duplicate_count == 0


def test_a_dead_member_re_added_starts_again_as_a_placeholder():
    c = Cluster(3)
    c.run_until(500)
    c.down.add(2)
    c.run_until(12_000)
    assert state(c.m(0), 2) is D
    c.m(0).set_members({IDS[1]: ADDRS[1]}, c.now_ms)
    c.m(0).set_members({IDS[1]: ADDRS[1], IDS[2]: ADDRS[2]}, c.now_ms)
    assert state(c.m(0), 2) is S and member(c.m(0), 2).last_seen_ms is None


# -- election ---------------------------------------------------------------------------------

def test_the_quorum_follows_the_member_set():
    e = make_election(0, 3)
    assert e.quorum == 2
    e.set_members(EIDS[:5], 0)
    assert (e.members, e.quorum) == (tuple(EIDS[:5]), 3)
    e.set_members(EIDS[:2], 0)
    assert e.quorum == 2


def test_a_leader_steps_down_on_a_change_and_the_new_set_elects_in_a_higher_term():
    c = ElectionCluster(3)
    leader = c.run_until_leader()
    term = c.e(leader).term
    for i in range(3):
        c.e(i).set_members(EIDS[:3], c.now_ms)   # unchanged set: nothing moves
    assert c.e(leader).role is Role.LEADER
    for i in range(3):
        r = c.e(i).set_members(EIDS[:2] if i < 2 else EIDS[:3], c.now_ms)
        assert r.persist is None, "the term and the vote cast in it are kept"
    assert all(c.e(i).role is Role.FOLLOWER for i in range(2)) and c.e(leader).leader in (None, EIDS[leader])
    c.down.add(2)   # removed from the federation by sites 0 and 1
    new_leader = c.run_until_leader()
    assert new_leader in (0, 1) and c.e(new_leader).term > term
    assert c.e(new_leader).quorum == 2


def test_a_follower_re_checks_its_leaders_certificate_against_the_new_quorum():
    e = make_election(1, 3)
    assert msgs(e.receive(EIDS[0], beat(1, 0, 2), 0), HeartbeatReply) == [HeartbeatReply(1, follows=True)]
    e.set_members(EIDS[:5], 100)   # 5 members: 2 votes no longer make a leader
    assert e.leader is None
    assert msgs(e.receive(EIDS[0], Heartbeat(1, 0, 0), 200), HeartbeatReply) == [HeartbeatReply(1, follows=False)]
    assert e.leader is None
    assert msgs(e.receive(EIDS[0], beat(1, 0, 2, 3), 300), HeartbeatReply) == [HeartbeatReply(1, follows=True)]
    assert e.leader == EIDS[0]


def test_a_removed_member_cannot_vote_or_lead():
    e = make_election(0, 3)
    e.set_members(EIDS[:2], 0)
    before = e.stats.ignored_messages
    assert e.receive(EIDS[2], RequestVote(1, 0, 0), 5_000).sends == ()
    assert e.stats.ignored_messages == before + 1


def test_new_timings_apply_to_the_timers_set_after_them():
    c = Cluster(3)
    c.run_until(500)
    c.m(0).set_config(MembershipConfig(suspect_timeout_ms=20_000))
    c.down.add(2)
    c.run_until(12_000)   # dead by now under the 4 s default (test above)
    assert state(c.m(0), 2) is S
    c.run_until(25_000)
    assert state(c.m(0), 2) is D
