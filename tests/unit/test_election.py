"""Unit tests of the pure Raft election state machine: no event loop, no sockets, no simulator.

`Cluster` below plays the shell for n nodes: it stores each Ready's `persist` before
delivering its sends (instantly and synchronously, in FIFO order) and can crash/restart a
node from its stored hard state. Time moves in 50 ms ticks.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from fedpeer.core.election.raft import (
    MEMBERS_MAX,
    TERM_STEP_MAX,
    VOTE_DOMAIN,
    Commit,
    Election,
    ElectionConfig,
    HardState,
    Heartbeat,
    HeartbeatReply,
    PreVote,
    PreVoteReply,
    Ready,
    RequestVote,
    RequestVoteReply,
    Role,
    Send,
    VoteSig,
    vote_statement,
)
from fedpeer.testing.fakesig import FakeKeyring

CFG = ElectionConfig()
STEP_MS = 50
IDS = [bytes([i + 1]) * 32 for i in range(9)]
STRANGER = bytes([0xEE]) * 32
F, P, C, L = Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER
KEYS = FakeKeyring(IDS)  # each member's vote signatures; see fedpeer/testing/fakesig.py
NO_COMMIT = Commit()     # nothing committed yet (Commit is frozen: one shared default is safe)


def make(i: int = 0, n: int = 3, *, term: int = 0, voted_for: bytes | None = None,
         commit: Commit | None = None, now_ms: int = 0, seed: int = 0) -> Election:
    return Election(IDS[i], IDS[:n], CFG, random.Random(seed * 100 + i),
                    HardState(term, voted_for), now_ms, commit or Commit(),
                    sign=KEYS.signer(IDS[i]), verify=KEYS.verify)


def sig(term: int, candidate: int, voter: int) -> bytes:
    """Member `voter`'s signature on its vote of `term` for member `candidate`."""
    return KEYS.signer(IDS[voter])(vote_statement(term, IDS[candidate]))


def vote(term: int, candidate: int, voter: int) -> RequestVoteReply:
    return RequestVoteReply(term, True, sig(term, candidate, voter))


def cert(term: int, leader: int, *voters: int) -> tuple[VoteSig, ...]:
    return tuple(VoteSig(IDS[v], sig(term, leader, v)) for v in voters)


def beat(term: int, leader: int, *voters: int, commit: Commit = NO_COMMIT) -> Heartbeat:
    """A heartbeat of `leader` proving its election with the votes of `voters`."""
    return Heartbeat(term, commit.term, commit.index, cert(term, leader, *voters))


def msgs(ready: Ready, kind: type | None = None) -> list:
    return [s.msg for s in ready.sends if kind is None or isinstance(s.msg, kind)]


def only(ready: Ready):
    assert len(ready.sends) == 1, ready.sends
    return ready.sends[0].msg


class Cluster:
    """n Elections and a shell: persist-then-send, instant delivery, `down` nodes, `cut` links."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed = n, seed
        self.store = [HardState() for _ in range(n)]  # what each node's disk holds
        self.nodes: list[Election | None] = [make(i, n, seed=seed) for i in range(n)]
        self.down: set[int] = set()
        self.cut: set[tuple[int, int]] = set()
        self.now_ms = 0
        self.leaders: dict[int, int] = {}  # term -> index of its leader, over the whole run
        self.heartbeats: list[tuple[int, int, Heartbeat]] = []  # (src, dst, msg) delivered

    def e(self, i: int) -> Election:
        node = self.nodes[i]
        assert node is not None
        return node

    def handle(self, i: int, ready: Ready) -> None:
        queue: deque[tuple[int, Send]] = deque()

        def apply(src: int, r: Ready) -> None:  # what the shell does with each Ready, at once
            if r.persist is not None:
                self.store[src] = r.persist  # persist first ...
            assert self.store[src] == self.e(src).hard_state, "a change was not reported"
            if self.e(src).role is L:
                assert self.leaders.setdefault(self.e(src).term, src) == src, "two leaders"
            queue.extend((src, send) for send in r.sends)  # ... then send

        apply(i, ready)
        while queue:
            src, send = queue.popleft()
            dst = IDS.index(send.dst)
            if dst in self.down or (src, dst) in self.cut:
                continue
            if isinstance(send.msg, Heartbeat):
                self.heartbeats.append((src, dst, send.msg))
            apply(dst, self.e(dst).receive(IDS[src], send.msg, self.now_ms))

    def step(self) -> None:
        for i in range(self.n):
            if i not in self.down:
                self.handle(i, self.e(i).tick(self.now_ms))
        self.now_ms += STEP_MS

    def run_for(self, duration_ms: int) -> None:
        end = self.now_ms + duration_ms
        while self.now_ms < end:
            self.step()

    def run_until_leader(self, within_ms: int = 10_000) -> int:
        end = self.now_ms + within_ms
        while self.now_ms < end:
            self.step()
            lead = self.stable_leader()
            if lead is not None:
                return lead
        raise AssertionError("no leader")

    def stable_leader(self) -> int | None:
        up = [i for i in range(self.n) if i not in self.down]
        leaders = [i for i in up if self.e(i).role is L]
        if len(leaders) != 1:
            return None
        lead = self.e(leaders[0])
        ok = all(self.e(i).term == lead.term and self.e(i).leader == lead.me for i in up)
        return leaders[0] if ok else None

    def isolate(self, i: int) -> None:
        self.cut |= {(i, j) for j in range(self.n)} | {(j, i) for j in range(self.n)}

    def crash(self, i: int) -> None:
        self.down.add(i)
        self.nodes[i] = None

    def restart(self, i: int) -> None:
        self.down.discard(i)
        self.nodes[i] = Election(IDS[i], IDS[:self.n], CFG, random.Random(self.seed + 1000 + i),
                                 self.store[i], self.now_ms, sign=KEYS.signer(IDS[i]), verify=KEYS.verify)


# -- configuration and construction -----------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"heartbeat_interval_ms": 0},
    {"heartbeat_interval_ms": 600},  # less than two heartbeats per lease
    {"election_timeout_min_ms": 2000, "election_timeout_max_ms": 2000},  # no randomization
    {"election_timeout_min_ms": 2000, "election_timeout_max_ms": 1000},
])
def test_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        ElectionConfig(**kwargs)


def test_construction_is_validated():
    rng, hs, crypto = random.Random(0), HardState(), {"sign": KEYS.signer(IDS[0]), "verify": KEYS.verify}
    with pytest.raises(ValueError, match="include me"):
        Election(IDS[0], IDS[1:3], CFG, rng, hs, 0, **crypto)
    with pytest.raises(ValueError, match="distinct"):
        Election(IDS[0], [IDS[0], IDS[1], IDS[1]], CFG, rng, hs, 0, **crypto)
    too_many = [bytes([i % 256, i // 256]) * 16 for i in range(MEMBERS_MAX + 1)]
    with pytest.raises(ValueError, match="members"):
        Election(too_many[0], too_many, CFG, rng, hs, 0, **crypto)
    with pytest.raises(ValueError):
        Election(IDS[0], IDS[:3], CFG, rng, HardState(-1), 0, **crypto)
    with pytest.raises(TypeError, match="sign"):  # no silent default: a shell must sign its votes
        Election(IDS[0], IDS[:3], CFG, rng, hs, 0)


def test_commit_ahead_of_persisted_term_adopts_that_term_without_a_vote():
    e = make(0, term=3, voted_for=IDS[1], commit=Commit(5, 9))
    assert e.hard_state == HardState(5, None) and e.commit == Commit(5, 9)
    assert e.tick(1).persist == HardState(5, None)  # handed to the shell at the first step
    assert e.tick(2).persist is None
    e = make(0, term=5, voted_for=IDS[1], commit=Commit(5, 9))
    assert e.hard_state == HardState(5, IDS[1])


# -- elections -------------------------------------------------------------------------------

def test_federation_of_one_elects_itself_after_one_timeout():
    e = make(0, n=1)
    assert (e.role, e.term, e.leader) == (F, 0, None)
    t = 0
    while e.role is not L:
        r = e.tick(t)
        t += STEP_MS
    assert CFG.election_timeout_min_ms <= t - STEP_MS < CFG.election_timeout_max_ms
    assert (e.term, e.leader) == (1, IDS[0])
    assert r == Ready(HardState(1, IDS[0]), ())
    stats = e.stats
    assert (stats.pre_votes_started, stats.elections_started, stats.elections_won) == (1, 1, 1)
    assert e.tick(t + 60_000) == Ready(None, ())  # no peers to lose: leads forever


@pytest.mark.parametrize("seed", range(20))
def test_three_nodes_elect_exactly_one_leader_in_term_one(seed):
    c = Cluster(3, seed)
    lead = c.run_until_leader(within_ms=CFG.election_timeout_max_ms + 2 * STEP_MS)
    assert c.e(lead).term == 1  # instant delivery, distinct timeouts: one pre-vote, one election
    assert [c.e(i).role for i in range(3)].count(L) == 1
    assert c.store[lead] == HardState(1, IDS[lead])
    assert all(c.store[i] == HardState(1, IDS[lead]) for i in range(3))  # votes persisted
    c.run_for(20_000)  # and it stays: heartbeats hold the followers, replies hold the leader
    assert c.stable_leader() == lead and c.e(lead).term == 1


def test_campaign_messages_step_by_step():
    a, b = make(0), make(1)
    t = CFG.election_timeout_max_ms
    r = a.tick(t)
    assert a.role is P and a.term == 0 and r.persist is None  # PreVote changes nothing durable
    assert msgs(r) == [PreVote(1, 0, 0)] * 2 and [s.dst for s in r.sends] == IDS[1:3]
    r = b.receive(IDS[0], PreVote(1, 0, 0), t)
    assert only(r) == PreVoteReply(1, True) and r.persist is None and b.term == 0
    r = a.receive(IDS[1], PreVoteReply(1, True), t)  # 2 of 3: become a candidate
    assert a.role is C and r.persist == HardState(1, IDS[0])
    assert msgs(r) == [RequestVote(1, 0, 0)] * 2
    r = b.receive(IDS[0], RequestVote(1, 0, 0), t)
    assert only(r) == vote(1, 0, 1) and r.persist == HardState(1, IDS[0])  # a signed vote
    r = a.receive(IDS[1], only(r), t)
    assert a.role is L and a.leader == IDS[0] and r.persist is None
    assert msgs(r) == [beat(1, 0, 1)] * 2  # announced at once, proven by b's vote
    r = b.receive(IDS[0], Heartbeat(1, 0, 0), t)  # b's own vote and a's make a quorum of 3
    assert only(r) == HeartbeatReply(1, follows=True) and b.leader == IDS[0] and b.role is F
    c = make(2)
    r = c.receive(IDS[0], beat(1, 0, 1), t)  # c did not vote: the certificate convinces it
    assert only(r) == HeartbeatReply(1, follows=True) and c.leader == IDS[0] and c.term == 1


def elected(n: int = 2, term: int = 0) -> tuple[Election, Ready]:
    """Node 0 of n, walked through one won election at time election_timeout_max_ms."""
    a = make(0, n=n, term=term)
    t = CFG.election_timeout_max_ms
    a.tick(t)
    for j in range(1, n // 2 + 1):
        a.receive(IDS[j], PreVoteReply(term + 1, True), t)
    for j in range(1, n // 2 + 1):
        r = a.receive(IDS[j], vote(term + 1, 0, j), t)
    assert a.role is L
    return a, r


def test_leader_heartbeats_every_interval():
    a, r = elected(2)
    t0 = CFG.election_timeout_max_ms
    assert msgs(r) == [beat(1, 0, 1)]
    beats, certificates = [], []
    for t in range(t0 + STEP_MS, t0 + 900, STEP_MS):
        r = a.tick(t)
        a.receive(IDS[1], HeartbeatReply(1, follows=True), t)
        if msgs(r, Heartbeat):
            beats.append(t - t0)
            certificates += [m.certificate for m in msgs(r, Heartbeat)]
    assert beats == [200, 400, 600, 800]
    assert certificates == [()] * 4  # it follows: the proof need not travel again


# -- vote rules ------------------------------------------------------------------------------

def test_one_vote_per_term_persisted_before_the_reply_and_kept_across_restart():
    v = make(2)
    r = v.receive(IDS[0], RequestVote(5, 0, 0), 0)
    assert r.persist == HardState(5, IDS[0]) and only(r) == vote(5, 0, 2)
    r = v.receive(IDS[1], RequestVote(5, 0, 0), 0)
    assert r.persist is None and only(r) == RequestVoteReply(5, False)  # refused: no signature
    r = v.receive(IDS[0], RequestVote(5, 0, 0), 0)  # a retransmission is answered the same way
    assert r.persist is None and only(r) == vote(5, 0, 2)
    # Restart from what was persisted: still no second vote in term 5.
    v2 = make(2, term=5, voted_for=IDS[0], now_ms=10)
    assert only(v2.receive(IDS[1], RequestVote(5, 0, 0), 10)) == RequestVoteReply(5, False)
    assert only(v2.receive(IDS[0], RequestVote(5, 0, 0), 10)) == vote(5, 0, 2)
    r = v2.receive(IDS[1], RequestVote(6, 0, 0), 10)  # a new term: a new vote
    assert r.persist == HardState(6, IDS[1]) and only(r) == vote(6, 1, 2)


@pytest.mark.parametrize(("cand", "granted"), [
    (Commit(2, 7), True), (Commit(2, 8), True), (Commit(3, 0), True),
    (Commit(2, 6), False), (Commit(1, 9), False), (Commit(0, 0), False),
])
def test_vote_and_pre_vote_only_for_an_up_to_date_candidate(cand, granted):
    v = make(2, term=4, commit=Commit(2, 7))
    r = v.receive(IDS[0], PreVote(5, cand.term, cand.index), 0)
    assert only(r) == (PreVoteReply(5, True) if granted else PreVoteReply(4, False))
    r = v.receive(IDS[0], RequestVote(5, cand.term, cand.index), 0)
    assert only(r) == (vote(5, 0, 2) if granted else RequestVoteReply(5, False))
    # Refusing still adopts the term (§5.1) but casts no vote, so a better candidate can win.
    assert r.persist == HardState(5, IDS[0] if granted else None)


def test_node_behind_on_commits_can_never_lead():
    c = Cluster(3)
    for i in (1, 2):
        c.e(i).set_commit(0, 4)
    c.now_ms = CFG.election_timeout_max_ms  # node 0 times out first, with the oldest commit
    r = c.e(0).tick(c.now_ms)
    assert msgs(r) == [PreVote(1, 0, 0)] * 2
    assert c.e(1).receive(IDS[0], r.sends[0].msg, c.now_ms) == Ready(
        None, (Send(IDS[0], PreVoteReply(0, False)),))
    c.handle(0, r)  # both refuse: node 0 gives up without having touched a term
    assert c.e(0).role is F and all(c.e(i).term == 0 for i in range(3))
    lead = c.run_until_leader()
    assert lead != 0 and c.e(0).stats.elections_won == 0
    assert c.e(0).stats.pre_votes_started >= 1 and c.e(0).stats.elections_started == 0


def test_candidate_with_refusals_from_a_majority_gives_up():
    a = make(0, n=5)
    a.tick(CFG.election_timeout_max_ms)
    assert a.role is P
    a.receive(IDS[1], PreVoteReply(0, False), CFG.election_timeout_max_ms)
    a.receive(IDS[2], PreVoteReply(0, False), CFG.election_timeout_max_ms)
    assert a.role is P  # 3 of 5 still possible
    a.receive(IDS[3], PreVoteReply(0, False), CFG.election_timeout_max_ms)
    assert a.role is F and a.term == 0


# -- PreVote ---------------------------------------------------------------------------------

def test_pre_vote_never_changes_a_term_on_either_side():
    v = make(1, term=3, voted_for=IDS[2])
    r = v.receive(IDS[0], PreVote(9, 0, 0), 0)
    assert only(r) == PreVoteReply(9, True) and r.persist is None
    assert v.hard_state == HardState(3, IDS[2])  # granting a pre-vote is not voting
    assert only(v.receive(IDS[2], PreVote(3, 0, 0), 0)) == PreVoteReply(3, False)  # not ahead
    a = make(0, term=3)
    r = a.tick(CFG.election_timeout_max_ms)
    assert a.role is P and r.persist is None and msgs(r) == [PreVote(4, 0, 0)] * 2
    r = a.receive(IDS[1], PreVoteReply(7, True), CFG.election_timeout_max_ms)  # not our campaign
    assert a.role is P and r == Ready(None, ())


def test_refused_pre_vote_with_a_higher_term_makes_the_laggard_catch_up():
    a = make(0, term=2)
    a.tick(CFG.election_timeout_max_ms)
    r = a.receive(IDS[1], PreVoteReply(6, False), CFG.election_timeout_max_ms)
    assert a.role is F and r.persist == HardState(6, None)


def test_isolated_node_campaigns_forever_without_bumping_its_term():
    c = Cluster(3)
    lead = c.run_until_leader()
    term = c.e(lead).term
    loner = next(i for i in range(3) if i != lead)
    c.isolate(loner)
    c.run_for(60_000)
    assert c.e(loner).term == term and c.e(loner).role is P
    assert c.e(loner).stats.pre_votes_started >= 60_000 // CFG.election_timeout_max_ms
    assert c.e(loner).stats.elections_started == 0
    assert c.stable_leader() is None and c.e(lead).role is L  # the other two carry on


# -- CheckQuorum and leases ------------------------------------------------------------------

def test_leader_without_a_majority_steps_down_within_one_window():
    c = Cluster(3)
    lead = c.run_until_leader()
    others = [i for i in range(3) if i != lead]
    c.isolate(lead)
    cut_ms = c.now_ms
    while c.e(lead).role is L:
        c.step()
    stepped_ms = c.now_ms - STEP_MS
    assert cut_ms + CFG.election_timeout_min_ms - CFG.heartbeat_interval_ms <= stepped_ms
    assert stepped_ms <= cut_ms + CFG.election_timeout_min_ms
    assert c.e(lead).stats.check_quorum_step_downs == 1 and c.e(lead).leader is None
    assert c.e(lead).hard_state == c.store[lead]  # same term, same vote: nothing to persist
    c.run_for(5_000)
    new = [i for i in others if c.e(i).role is L]
    assert len(new) == 1 and c.e(new[0]).term == c.e(lead).term + 1


def test_leader_hearing_from_one_of_two_peers_keeps_leading():
    c = Cluster(3)
    lead = c.run_until_leader()
    c.crash(next(i for i in range(3) if i != lead))
    c.run_for(30_000)
    assert c.e(lead).role is L and c.e(lead).stats.check_quorum_step_downs == 0


def test_leader_and_followers_in_lease_ignore_a_higher_term_vote_request():
    c = Cluster(3)
    lead = c.run_until_leader()
    term = c.e(lead).term
    follower = next(i for i in range(3) if i != lead)
    for i in (lead, follower):
        r = c.e(i).receive(IDS[3 - lead - follower], RequestVote(term + 5, 9, 9), c.now_ms)
        assert r == Ready(None, ()) and c.e(i).term == term
        r = c.e(i).receive(IDS[3 - lead - follower], PreVote(term + 1, 9, 9), c.now_ms)
        assert only(r) == PreVoteReply(term, False)
    # Out of lease, the same request is honoured.
    f = c.e(follower)
    r = f.receive(IDS[3 - lead - follower], RequestVote(term + 5, 9, 9),
                  c.now_ms + CFG.election_timeout_min_ms)
    assert only(r) == vote(term + 5, 3 - lead - follower, follower) and f.leader is None


def test_partitioned_node_rejoining_does_not_depose_the_leader():
    c = Cluster(5, seed=3)
    lead = c.run_until_leader()
    term = c.e(lead).term
    loner = next(i for i in range(5) if i != lead)
    c.isolate(loner)
    c.run_for(15_000)
    assert c.e(loner).stats.pre_votes_started >= 5
    c.cut.clear()
    c.run_for(15_000)
    assert c.stable_leader() == lead
    assert all(c.e(i).term == term for i in range(5))
    assert c.leaders == {term: lead}


# -- terms and fencing -----------------------------------------------------------------------

def test_stale_heartbeat_is_answered_with_the_higher_term_and_deposes_its_sender():
    f = make(1, term=7)
    r = f.receive(IDS[0], Heartbeat(5, 0, 0), 0)
    assert only(r) == HeartbeatReply(7) and f.leader is None and f.term == 7
    a, _ = elected(2)  # a leader of term 1 ...
    r = a.receive(IDS[1], HeartbeatReply(4), CFG.election_timeout_max_ms)  # ... hears term 4
    assert a.role is F and r.persist == HardState(4, None)
    assert a.stats.higher_term_step_downs == 1
    assert a.is_stale(1) and not a.is_stale(4) and not a.is_stale(5)


def test_stale_vote_traffic_is_refused_or_ignored():
    v = make(1, term=7, voted_for=IDS[2])
    assert only(v.receive(IDS[0], RequestVote(6, 9, 9), 0)) == RequestVoteReply(7, False)
    assert only(v.receive(IDS[0], PreVote(7, 9, 9), 0)) == PreVoteReply(7, False)
    for msg in (RequestVoteReply(6, True), PreVoteReply(6, False), HeartbeatReply(3)):
        assert v.receive(IDS[0], msg, 0) == Ready(None, ())
    assert v.hard_state == HardState(7, IDS[2]) and v.role is F


def test_higher_term_heartbeat_makes_a_candidate_follow_and_persists_the_term():
    a = make(0)
    a.tick(CFG.election_timeout_max_ms)
    a.receive(IDS[1], PreVoteReply(1, True), CFG.election_timeout_max_ms)
    assert a.role is C
    r = a.receive(IDS[2], beat(3, 2, 1, commit=Commit(2, 11)), CFG.election_timeout_max_ms)
    assert (a.role, a.leader, a.term) == (F, IDS[2], 3) and r.persist == HardState(3, None)
    assert a.leader_commit == Commit(2, 11)
    assert only(r) == HeartbeatReply(3, follows=True)


def test_same_term_heartbeat_ends_a_candidacy_and_keeps_the_vote():
    a = make(0, term=4)
    a.tick(CFG.election_timeout_max_ms)
    a.receive(IDS[1], PreVoteReply(5, True), CFG.election_timeout_max_ms)
    assert a.role is C and a.hard_state == HardState(5, IDS[0])
    r = a.receive(IDS[2], beat(5, 2, 1), CFG.election_timeout_max_ms)
    assert a.role is F and a.leader == IDS[2] and r.persist is None


def test_a_second_leader_claim_for_one_term_is_refused():
    f = make(1, term=2)
    f.receive(IDS[0], beat(2, 0, 2), 0)
    assert f.receive(IDS[2], beat(2, 2, 1), 0) == Ready(None, ())
    assert f.leader == IDS[0] and f.stats.ignored_messages == 1


def test_non_members_myself_and_malformed_messages_are_ignored():
    f = make(1, term=2)
    for src, msg in [(STRANGER, Heartbeat(9, 0, 0)), (IDS[1], RequestVote(9, 0, 0)),
                     (IDS[0], Heartbeat(-1, 0, 0)), (IDS[0], RequestVote(2**63, 0, 0)),
                     (IDS[0], PreVoteReply(3, 1)), (IDS[0], Heartbeat(True, 0, 0))]:
        assert f.receive(src, msg, 0) == Ready(None, ())
    assert f.hard_state == HardState(2, None) and f.stats.ignored_messages == 6
    with pytest.raises(TypeError):
        f.receive(IDS[0], object(), 0)


# -- terms advance by small steps (issue 11) -------------------------------------------------

@pytest.mark.parametrize("msg", [Heartbeat(2**62, 0, 0), RequestVote(2**62, 0, 0), PreVote(2**62, 0, 0),
                                 HeartbeatReply(2**62), PreVoteReply(2**62, False), RequestVoteReply(2**62, False),
                                 Heartbeat(2 + TERM_STEP_MAX + 1, 0, 0)])
def test_a_term_jump_beyond_the_step_is_ignored(msg):
    """The attack of issue 11: one member's frame pushed every site to term 2**62."""
    f = make(1, term=2)
    assert f.receive(IDS[0], msg, 0) == Ready(None, ())
    assert (f.term, f.leader, f.role) == (2, None, F)
    assert f.stats.term_jumps_ignored == 1 and f.stats.ignored_messages == 1
    assert not f.is_stale(2)


def test_a_step_within_the_bound_is_followed():
    f = make(1, term=2)
    r = f.receive(IDS[0], beat(2 + TERM_STEP_MAX, 0, 2), 0)
    assert (f.term, f.leader) == (2 + TERM_STEP_MAX, IDS[0])
    assert only(r) == HeartbeatReply(2 + TERM_STEP_MAX, follows=True)
    assert f.stats.term_jumps_ignored == 0


def test_a_member_gains_at_most_one_step_per_message():
    f = make(1, term=0)
    for _ in range(10):       # a burst of pushes at one instant: each moves the term by one step at most
        f.receive(IDS[0], Heartbeat(2**62, 0, 0), 0)
        f.receive(IDS[0], HeartbeatReply(f.term + TERM_STEP_MAX), 0)
    assert f.term == 10 * TERM_STEP_MAX and f.stats.term_jumps_ignored == 10


def test_a_node_far_behind_catches_up_once_elections_could_have_made_the_gap():
    """A restarted node 100 terms behind ignores the leader's heartbeats only until the time
    100 honest elections would have needed (one per election_timeout_min_ms) has passed."""
    gap = 100
    f = make(1, term=0, now_ms=0)
    wait_ms = (gap - TERM_STEP_MAX) * CFG.election_timeout_min_ms
    assert f.receive(IDS[0], beat(gap, 0, 2), wait_ms - 1) == Ready(None, ())
    assert f.term == 0
    r = f.receive(IDS[0], beat(gap, 0, 2), wait_ms)
    assert (f.term, f.leader) == (gap, IDS[0]) and r.persist == HardState(gap, None)


def test_a_node_cut_off_for_many_elections_rejoins_at_once():
    """Cut off, a node's term stands still (PreVote) while the others hold elections, at most one
    per election_timeout_min_ms: that time is its allowance, so the first heartbeat after healing
    is followed, however many elections it missed."""
    f = make(1, term=3)
    elections = 200
    end_ms = elections * CFG.election_timeout_min_ms
    for now_ms in range(0, end_ms + 1, STEP_MS):    # campaigning alone: PreVotes nobody answers
        f.tick(now_ms)
    assert f.term == 3 and f.stats.pre_votes_started > 0
    term = 3 + elections + TERM_STEP_MAX
    r = f.receive(IDS[0], beat(term, 0, 2), end_ms)
    assert (f.term, f.leader) == (term, IDS[0]) and r.persist == HardState(term, None)


def test_time_never_goes_backwards():
    e = make(0, now_ms=100)
    with pytest.raises(AssertionError, match="backwards"):
        e.tick(99)


# -- a leader proves its election (issue 11) -------------------------------------------------

def test_a_vote_statement_names_its_domain_term_and_candidate():
    assert vote_statement(7, IDS[0]) == VOTE_DOMAIN + (7).to_bytes(8, "big") + IDS[0]
    assert vote_statement(7, IDS[0]) not in (vote_statement(8, IDS[0]), vote_statement(7, IDS[1]))


def test_a_heartbeat_claiming_the_next_term_without_proof_makes_nobody_leader():
    """The attack of issue 11: a member announces itself leader of term + 1, then sends the job
    layer 'leader' directives. Its heartbeat moves no term and makes nobody leader."""
    c = Cluster(3)
    lead = c.run_until_leader()
    term = c.e(lead).term
    byz = next(i for i in range(3) if i != lead)
    honest = 3 - lead - byz
    for i in (honest, lead):
        r = c.e(i).receive(IDS[byz], Heartbeat(term + 1, 9, 9), c.now_ms)
        assert only(r) == HeartbeatReply(term, follows=False) and r.persist is None
        assert c.e(i).term == term and c.e(i).stats.uncertified_heartbeats == 1
    assert c.e(honest).leader == IDS[lead] and c.e(lead).role is L
    fresh = make(1)  # no leader known, not in any lease: still nobody's follower
    assert only(fresh.receive(IDS[0], Heartbeat(1, 0, 0), 0)) == HeartbeatReply(0, follows=False)
    assert (fresh.term, fresh.leader) == (0, None)
    c.run_for(5_000)
    assert c.stable_leader() == lead and c.e(lead).term == term


def _bad(b: bytes) -> bytes:
    return bytes([b[0] ^ 1]) + b[1:]


@pytest.mark.parametrize("certificate", [
    pytest.param(cert(3, 0, 1), id="too_few"),
    pytest.param(cert(3, 0, 1, 1), id="duplicate"),
    pytest.param(cert(3, 0, 0, 1), id="leader_counted_twice"),
    pytest.param(cert(2, 0, 1, 2), id="wrong_term"),
    pytest.param(tuple(VoteSig(IDS[v], sig(3, 3, v)) for v in (1, 2)), id="wrong_candidate"),
    pytest.param(tuple(VoteSig(IDS[v], sig(3, 0, 3)) for v in (1, 2)), id="signed_by_another_member"),
    pytest.param(tuple(VoteSig(IDS[v], bytes(64)) for v in (1, 2)), id="made_up"),
    pytest.param(cert(3, 0, 1)[:1] + (VoteSig(IDS[2], _bad(sig(3, 0, 2))),), id="one_bit_off"),
    pytest.param(cert(3, 0, 1, 2) + (VoteSig(IDS[3], bytes(64)),), id="a_bad_one_among_good_ones"),
    pytest.param(cert(3, 0, 1) + (VoteSig(STRANGER, bytes(64)),), id="a_stranger"),
])
def test_a_certificate_that_does_not_prove_a_quorum_is_refused(certificate):
    """Five members (quorum 3): the leader's own vote is implied, two more need signatures."""
    f = make(4, n=5, term=2)
    r = f.receive(IDS[0], Heartbeat(3, 0, 0, certificate), 0)
    assert only(r) == HeartbeatReply(2, follows=False) and r.persist is None
    assert (f.term, f.leader, f.role) == (2, None, F)
    assert f.stats.uncertified_heartbeats == 1 and f.stats.certificates_verified == 0
    r = f.receive(IDS[0], beat(3, 0, 1, 2), 0)  # the same claim, proven
    assert only(r) == HeartbeatReply(3, follows=True) and (f.term, f.leader) == (3, IDS[0])


def test_a_certificate_is_verified_once_per_term_and_leader():
    f = make(4, n=5, term=2)
    before = KEYS.verifications
    forged = tuple(VoteSig(IDS[v], bytes(64)) for v in (1, 2, 3))
    f.receive(IDS[0], Heartbeat(3, 0, 0, forged), 0)
    assert KEYS.verifications - before == 1  # stops at the first bad signature
    f.receive(IDS[0], beat(3, 0, 1, 2), 0)
    assert KEYS.verifications - before == 3 and f.stats.certificates_verified == 1
    for t in range(STEP_MS, 5_000, STEP_MS):  # 99 more heartbeats, with and without the proof
        assert only(f.receive(IDS[0], beat(3, 0, 1, 2) if t % 100 else Heartbeat(3, 0, 0), t)).follows
    assert KEYS.verifications - before == 3 and f.leader == IDS[0]
    f.receive(IDS[1], beat(4, 1, 2, 3), 5_000)  # a new term: a new proof
    assert KEYS.verifications - before == 5 and f.stats.certificates_verified == 2
    assert f.leader == IDS[1]


def test_a_vote_without_a_valid_signature_is_not_counted():
    """A lying voter cannot slip a bad signature into an honest leader's certificate."""
    a = make(0)
    t = CFG.election_timeout_max_ms
    a.tick(t)
    a.receive(IDS[1], PreVoteReply(1, True), t)
    assert a.role is C
    for bad in (RequestVoteReply(1, True), RequestVoteReply(1, True, sig(1, 0, 2)),
                RequestVoteReply(1, True, sig(0, 0, 1)), RequestVoteReply(1, True, sig(1, 2, 1))):
        assert a.receive(IDS[1], bad, t) == Ready(None, ()) and a.role is C
    assert a.stats.bad_vote_signatures == 4
    r = a.receive(IDS[1], vote(1, 0, 1), t)
    assert a.role is L and msgs(r) == [beat(1, 0, 1)] * 2


@pytest.mark.parametrize("n", [3, 5, 7])
def test_a_real_election_proves_itself_and_every_follower_follows(n):
    c = Cluster(n, seed=n)
    lead = c.run_until_leader()
    term = c.e(lead).term
    first = {}
    for src, dst, msg in c.heartbeats:
        assert src == lead and msg.term == term
        first.setdefault(dst, msg)
    assert len(first) == n - 1  # every follower got a certificate of quorum - 1 distinct voters
    for msg in first.values():
        voters = {v.voter for v in msg.certificate}
        assert len(voters) == len(msg.certificate) == c.e(lead).quorum - 1 and IDS[lead] not in voters
        assert all(KEYS.verify(v.voter, vote_statement(term, IDS[lead]), v.sig) for v in msg.certificate)
    c.heartbeats.clear()
    c.run_for(5_000)
    assert c.stable_leader() == lead and {m.certificate for _, _, m in c.heartbeats} == {()}
    for i in range(n):
        if i != lead:
            assert c.e(i).stats.certificates_verified == 1 and c.e(i).stats.uncertified_heartbeats == 0


def test_a_restarted_follower_learns_the_leader_from_the_certificate():
    c = Cluster(5, seed=1)
    lead = c.run_until_leader()
    term = c.e(lead).term
    c.run_for(1_000)  # every follower follows: heartbeats now travel without the certificate
    f = next(i for i in range(5) if i != lead)
    c.crash(f)
    c.restart(f)
    assert (c.e(f).term, c.e(f).leader) == (term, None)
    c.run_for(2 * CFG.heartbeat_interval_ms + STEP_MS)
    assert (c.e(f).term, c.e(f).leader) == (term, IDS[lead]) and c.stable_leader() == lead
    assert c.e(f).stats.uncertified_heartbeats == 1  # the bare heartbeat proved nothing ...
    assert c.e(f).stats.certificates_verified == 1   # ... "not following" brought the proof back


def test_real_keys_through_the_wire_gate(tmp_path):
    """What the node wires: Ed25519 identities sign votes (identity.sign adds SIGN_DOMAIN) and
    identity.verify checks them; every message crosses the real gate (schema and limits)."""
    from fedpeer.errors import RemoteProtocolError
    from fedpeer.identity import Identity, verify
    from fedpeer.wire import frame as wire
    from fedpeer.wire.session import Sessions
    from fedpeer.testing.frames import Forger

    who = {i.public_key: i for i in (Identity.generate() for _ in range(3))}
    keys = sorted(who)
    nodes = {k: Election(k, keys, CFG, random.Random(j), HardState(), 0, sign=who[k].sign, verify=verify)
             for j, k in enumerate(keys)}
    gates = {k: wire.Gate(who[k], who.__contains__, Sessions(), message_bytes_max=1 << 20) for k in keys}
    sealers = {k: Forger(who[k]) for k in keys}
    for src in keys:
        for dst in keys:
            if src != dst:
                sealers[src].pair(gates[dst], dst, 0)

    def deliver(src: bytes, dst: bytes, msg, t: int) -> Ready:
        env = gates[dst].open(sealers[src].seal(dst, msg), 0)
        assert env.msg == msg  # the codec round-trips signatures and certificates
        return nodes[dst].receive(src, env.msg, t)

    t = 0
    while not any(e.role is L for e in nodes.values()):
        t += STEP_MS
        queue = [(k, s) for k in keys for s in nodes[k].tick(t).sends]
        while queue:
            src, send = queue.pop(0)
            queue += [(send.dst, s) for s in deliver(src, send.dst, send.msg, t).sends]
    lead = next(k for k in keys if nodes[k].role is L)
    assert all(e.leader == lead for e in nodes.values())
    byz, honest = [k for k in keys if k != lead]
    forged = (VoteSig(honest, who[byz].sign(vote_statement(nodes[honest].term + 1, byz))),)
    r = deliver(byz, honest, Heartbeat(nodes[honest].term + 1, 0, 0, forged), t)
    assert nodes[honest].leader == lead and not only(r).follows
    with pytest.raises(RemoteProtocolError):  # at most one entry per member fits the schema
        deliver(byz, honest, Heartbeat(1, 0, 0, forged * (MEMBERS_MAX + 1)), t)
    with pytest.raises(RemoteProtocolError):
        deliver(byz, honest, RequestVoteReply(1, True, bytes(65)), t)


# -- commit points ---------------------------------------------------------------------------

def test_set_commit_is_monotone_and_bounded_by_the_term():
    e = make(0, term=3)
    e.set_commit(2, 5)
    e.set_commit(3, 0)
    assert e.commit == Commit(3, 0)
    for term, index in [(2, 9), (3, -1), (4, 0), (-1, 0)]:
        with pytest.raises(ValueError):
            e.set_commit(term, index)


def test_heartbeats_carry_the_leaders_commit():
    c = Cluster(3)
    lead = c.run_until_leader()
    c.e(lead).set_commit(c.e(lead).term, 3)
    c.run_for(CFG.heartbeat_interval_ms + STEP_MS)
    assert all(c.e(i).leader_commit == Commit(c.e(lead).term, 3) for i in range(3))


# -- quorum of the configured federation, crashes --------------------------------------------

@pytest.mark.parametrize(("n", "down", "elects"), [
    (2, 1, False), (3, 1, True), (4, 2, False), (5, 2, True), (5, 3, False), (7, 4, False)])
def test_quorum_counts_configured_members_not_live_ones(n, down, elects):
    c = Cluster(n, seed=n)
    for i in range(down):
        c.crash(i)
    c.run_for(30_000)
    assert (c.stable_leader() is not None) == elects
    if not elects:
        assert not c.leaders and all(c.e(i).term == 0 for i in range(down, n))


def test_restarted_leader_comes_back_as_follower_and_never_leads_its_old_term_again():
    c = Cluster(3, seed=5)
    lead = c.run_until_leader()
    term = c.e(lead).term
    c.crash(lead)
    c.run_for(100)
    c.restart(lead)
    assert c.e(lead).role is F and c.e(lead).hard_state == HardState(term, IDS[lead])
    c.run_for(30_000)
    assert c.stable_leader() is not None and c.e(c.stable_leader()).term > term
    assert c.leaders[term] == lead  # Cluster asserted one leader per term throughout


def test_replay_is_deterministic_for_a_seed():
    def trace(seed: int) -> list:
        c = Cluster(5, seed)
        c.run_until_leader()
        c.crash(c.stable_leader())
        c.run_for(10_000)
        return [(c.e(i).hard_state, c.e(i).role) for i in range(5) if i not in c.down]
    assert trace(4) == trace(4)
