"""Raft-style leader election, as a pure state machine (no log replication).

References are to Ongaro and Ousterhout, "In Search of an Understandable
Consensus Algorithm (Extended Version)" (2014): §5.1 terms, §5.2 leader
election, §5.4.1 election restriction (the "up-to-date" rule); and to Ongaro,
"Consensus: Bridging Theory and Practice" (PhD thesis, 2014): §9.6 PreVote and
CheckQuorum ("preventing disruptions when a server rejoins the cluster"). The
shape (a tick-driven core that hands the shell what to persist and what to
send) follows etcd-io/raft's `Ready`.

The federated XGBoost layer runs its rounds under the leader of a term; this
module only decides who leads, in which term.

Layout: this module holds the rules and the state machine (`Election`); its
messages and their well-formedness checks are in election_wire.py, what a
voter signs and the check of a leader's certificate in election_certificate.py.
Their public names are importable from here.

Rules of this module:

* Pure. Nothing here reads a clock, touches a socket, sleeps or draws from the
  global `random` module. Time arrives as `now_ms` (monotonic milliseconds,
  never decreasing) on every call; randomness comes from the `random.Random`
  given to the constructor. Call `tick(now_ms)` every ~50 ms (well under
  heartbeat_interval_ms); timers fire at the first tick at or after their
  deadline.
* Every entry point (`tick`, `receive`) returns a `Ready(persist, sends)`.
  The shell MUST durably store `persist` (when not None) BEFORE performing any
  of `sends`: a vote or a new term that was sent but not stored could be cast
  again differently after a crash, and two leaders could win one term.
  `persist` is None when the hard state is unchanged since the last Ready.
  Construct a restarted node with the last stored `HardState`.
* Membership is fixed: the quorum is a majority of the CONFIGURED members
  (`len(members) // 2 + 1`), never of those currently alive, so a minority
  partition can never elect a leader. Messages from non-members (and from
  myself) are ignored. Only the operator changes the set (`set_members`, on
  a reload of peers.toml; its docstring says what happens to a running term).
* Terms only grow. A message carrying a higher term makes us a follower of
  that term with no vote (§5.1) -- except the three cases that exist to keep
  a rejoining or partitioned node from disrupting a healthy leader (§9.6):
  a PreVote never changes anyone's term; a granted PreVoteReply carries the
  requester's prospective term, not ours; and a RequestVote that reaches a
  node "in lease" (a leader, or a follower that heard its leader within
  election_timeout_min_ms) is ignored entirely. And a Heartbeat moves our
  term only with a certificate proving its sender won that term (below).
* One vote per term, persisted: voted_for is set at most once per term.
  A vote (and a pre-vote) is granted only to a candidate whose commit point
  (commit_term, commit_index) is at least ours, compared as a pair (§5.4.1
  applied to committed rounds: commit_term is the term of the leader that
  committed the round, commit_index the round number).
* PreVote (§9.6): an expired election timer first makes us a pre-candidate,
  which asks "would you vote for me at term+1?" without changing any term.
  Only with a majority of pre-votes do we become a candidate (term + 1,
  vote for self). Nobody grants a pre-vote while in lease.
* CheckQuorum (§9.6): a leader that has not heard a HeartbeatReply of its
  term saying "follows" from a majority (itself included) within
  election_timeout_min_ms steps
  down to follower. This bounds how long a leader cut off in a minority keeps
  believing it leads, and it is what lets followers treat "heard the leader
  recently" as a lease.
* At most one leader per term, ever (§5.2: majority votes, one vote per term,
  persisted). Every leader-originated message carries its term; the XGBoost
  layer fences its own job messages with `is_stale(term)`.
* A heartbeat from a lower term is answered with our (higher) term, so a
  stale leader learns it and steps down; other lower-term messages are
  answered with a rejection (votes) or ignored (replies).
* Terms advance by small steps: a message whose term is more than
  `term_ceiling(now_ms)` = our term + TERM_STEP_MAX + (ms since our term last
  changed) // election_timeout_min_ms is ignored and counted (`term_jumps_ignored`).
  Why: a member's key alone could otherwise push every site to a term near
  TERM_MAX in one message (2**62 was tried), where `term + 1` no longer fits the
  wire and no honest election can follow. With the rule a member gains at most
  TERM_STEP_MAX terms per message it gets accepted: at 1,000 messages per second
  reaching 2**62 takes over 10**7 years.
  Why it cannot block an honest election: every honest term is reached by one
  node's own election, which needs its election timer to expire, and that timer
  restarts whenever the node enters a term; so the highest honest term grows by
  at most 1 per election_timeout_min_ms (split votes included: rivals share one
  term). A node that was within TERM_STEP_MAX of the highest honest term when its
  own term last changed therefore accepts every honest term at any later time:
  the allowance grows exactly as fast as honest terms can. That covers a node cut
  off for many elections: its term did not move while it was cut off (PreVote
  keeps an isolated node's term still), and its allowance grew all that time. A
  node that is far behind at construction (restarted after more than
  TERM_STEP_MAX elections happened without it) catches up as soon as the
  allowance covers the gap: at most (gap - TERM_STEP_MAX) * election_timeout_min_ms
  after its start, sooner if elections are rarer than one per timeout, which is
  the normal case (elections happen only when a leader fails). Until then it
  ignores the leader's heartbeats; it cannot disrupt anyone (PreVote), it only
  sits out.
* A leader proves its election (authority is checked, not assumed):
  a granted vote is signed; a leader sends the votes that elected it, as a
  certificate in its heartbeats, until each follower says it `follows`; a
  follower takes src as leader of term T, and adopts T if higher, only once a
  certificate proves a quorum voted for (T, src). A heartbeat that proves
  nothing makes nobody leader and changes no term (election_certificate.py).
* Leader timing (heartbeats, CheckQuorum) and follower leases run on the same
  clock as everyone else only in the sense of durations: safety (one leader
  per term) never depends on time; liveness and non-disruption do.
* Every limit and timeout is a field of ElectionConfig with its unit in the
  name; the member count is capped at MEMBERS_MAX. State is bounded by the
  member count (one tally slot and one last-heard time per member).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fedpeer.core.election.certificate import VOTE_DOMAIN, Sign, Verify, certificate_proves, vote_statement
from fedpeer.core.election.wire import (
    MEMBERS_MAX,
    MESSAGE_TYPES,
    SIGNATURE_BYTES_MAX,
    TERM_MAX,
    Heartbeat,
    HeartbeatReply,
    Message,
    NodeId,
    PreVote,
    PreVoteReply,
    RequestVote,
    RequestVoteReply,
    Send,
    VoteSig,
    _well_formed,
)

__all__ = ["MEMBERS_MAX", "MESSAGE_TYPES", "SIGNATURE_BYTES_MAX", "TERM_MAX", "TERM_STEP_MAX", "VOTE_DOMAIN",
           "Commit", "Election", "ElectionConfig", "ElectionStats", "HardState", "Heartbeat", "HeartbeatReply",
           "Message", "NodeId", "PreVote", "PreVoteReply", "Ready", "RequestVote", "RequestVoteReply", "Role", "Send",
           "Sign", "Verify", "VoteSig", "vote_statement"]

TERM_STEP_MAX = 16   # terms a message may move us beyond our own, plus one per election timeout


class Role(enum.StrEnum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True)
class HardState:
    """What must survive a crash: persist it before sending anything (see module rules)."""

    term: int = 0
    voted_for: NodeId | None = None  # whom we voted for in `term`; None: no vote yet


@dataclass(frozen=True, order=True)
class Commit:
    """The last committed XGBoost round, ordered as the pair (term, index) (§5.4.1 on logs)."""

    term: int = 0   # term of the leader that committed the round
    index: int = 0  # round number


@dataclass(frozen=True)
class ElectionConfig:
    heartbeat_interval_ms: int = 200     # leader -> every follower
    election_timeout_min_ms: int = 1000  # also the follower lease and the CheckQuorum window
    election_timeout_max_ms: int = 2000  # timeouts are drawn uniformly in [min, max)

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ms < 1:
            raise ValueError("heartbeat_interval_ms must be >= 1")
        # At least two heartbeats per lease: one lost heartbeat must not start an election.
        if 2 * self.heartbeat_interval_ms > self.election_timeout_min_ms:
            raise ValueError("need 2 * heartbeat_interval_ms <= election_timeout_min_ms")
        # A spread is what breaks split votes (§5.2); without one, candidates collide forever.
        if self.election_timeout_max_ms <= self.election_timeout_min_ms:
            raise ValueError("need election_timeout_min_ms < election_timeout_max_ms")


@dataclass(frozen=True)
class Ready:
    """The result of one step: persist `persist` (if not None) durably, THEN perform `sends`."""

    persist: HardState | None
    sends: tuple[Send, ...]


@dataclass(slots=True)
class ElectionStats:  # counters for the status API and for tests; never reset
    pre_votes_started: int = 0
    elections_started: int = 0      # terms this node started (pre-vote won)
    elections_won: int = 0
    check_quorum_step_downs: int = 0
    higher_term_step_downs: int = 0  # left leader/candidate because a higher term appeared
    ignored_messages: int = 0        # malformed, from a non-member, or a conflicting leader
    term_jumps_ignored: int = 0      # also counted in ignored_messages: a term above term_ceiling
    uncertified_heartbeats: int = 0  # heartbeats whose certificate did not prove their sender won
    certificates_verified: int = 0   # (term, leader) pairs proven by signatures (once per pair)
    bad_vote_signatures: int = 0     # granted votes whose signature did not verify (not counted)


class Election:
    """One member's view of who leads. See the module docstring for the rules."""

    def __init__(self, me: NodeId, members: Sequence[NodeId], config: ElectionConfig,
                 rng: random.Random, hard_state: HardState, now_ms: int,
                 commit: Commit = Commit(), *, sign: Sign, verify: Verify) -> None:
        """`sign` signs my votes (the node passes its identity's Ed25519 key); `verify` checks a
        member's vote signature. Both are required: a default could let a deployment forget them."""
        if len(set(members)) != len(members):
            raise ValueError("members must be distinct")
        if me not in members:
            raise ValueError("members must include me")
        if not 1 <= len(members) <= MEMBERS_MAX:
            raise ValueError(f"need 1..{MEMBERS_MAX} members, got {len(members)}")
        if not 0 <= hard_state.term <= TERM_MAX or commit.term < 0 or commit.index < 0:
            raise ValueError("terms and indexes must be non-negative")
        self._me = me
        self._sign, self._verify = sign, verify
        self._members = tuple(sorted(members))
        self._member_set = frozenset(members)
        self._peers = tuple(m for m in self._members if m != me)
        self._quorum = len(self._members) // 2 + 1
        self._cfg = config
        self._rng = rng
        self._now_ms = now_ms
        # A round committed in term T proves we reached T, even if a crash beat the shell to
        # persisting it (an async shell may let the job layer commit while persist is pending).
        # Adopting T without a vote is safe: a vote never stored was never sent.
        self._term = max(hard_state.term, commit.term)
        self._voted_for = hard_state.voted_for if self._term == hard_state.term else None
        self._term_since_ms = now_ms    # when _term last changed (start counts): term_ceiling
        self._reported = hard_state  # the last hard state handed to the shell (or given by it)
        self._commit = commit
        self._role = Role.FOLLOWER
        self._leader: NodeId | None = None
        self._leader_contact_ms = 0     # when we last heard _leader (meaningful if _leader set)
        self._leader_commit: Commit | None = None
        self._granted: set[NodeId] = set()   # this campaign's (pre-)votes, me included
        self._refused: set[NodeId] = set()
        self._peer_heard_ms: dict[NodeId, int] = {}  # leader only: last following reply of my term
        self._vote_sigs: dict[NodeId, bytes] = {}    # candidate: verified vote signatures
        self._certificate: tuple[VoteSig, ...] = ()  # leader: the votes that elected me
        self._peer_follows: set[NodeId] = set()      # leader: peers that no longer need it
        self._proven: tuple[int, NodeId] | None = None  # the last (term, leader) a certificate proved
        self._next_heartbeat_ms = 0
        self._stats = ElectionStats()
        self._election_deadline_ms = 0
        self._reset_election_timer()  # a (re)started node listens for a leader before campaigning

    # -- public API -------------------------------------------------------------------------

    @property
    def me(self) -> NodeId:
        return self._me

    @property
    def members(self) -> tuple[NodeId, ...]:
        return self._members

    @property
    def quorum(self) -> int:
        return self._quorum

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def leader(self) -> NodeId | None:
        """The leader of the current term as far as we know (me if I lead); None if unknown."""
        return self._leader

    @property
    def hard_state(self) -> HardState:
        return HardState(self._term, self._voted_for)

    @property
    def commit(self) -> Commit:
        return self._commit

    @property
    def leader_commit(self) -> Commit | None:
        """The commit point carried by the current leader's latest heartbeat (mine if I lead)."""
        return self._commit if self._role is Role.LEADER else self._leader_commit

    @property
    def stats(self) -> ElectionStats:
        return replace(self._stats)

    def is_stale(self, term: int) -> bool:
        """True if a message of `term` comes from a deposed leader and must be rejected.

        A term above ours is not stale but not yet known either: the election layer will
        learn it from that leader's heartbeat; the job layer should hold or drop the message.
        """
        return term < self._term

    def term_ceiling(self, now_ms: int | None = None) -> int:
        """The highest term a message may carry to be heard at `now_ms` (module rules: terms
        advance by small steps). The job layer uses the same bound for leader-originated messages."""
        now_ms = self._now_ms if now_ms is None else max(now_ms, self._now_ms)
        allowance = (now_ms - self._term_since_ms) // self._cfg.election_timeout_min_ms
        return min(TERM_MAX, self._term + TERM_STEP_MAX + allowance)

    def set_commit(self, term: int, index: int) -> None:
        """Record the last round the XGBoost layer has durably committed (never goes back).

        For §5.4.1's guarantee (every later leader holds every committed round), a round
        counts as committed only once a majority of configured members have stored it, and a
        member stores rounds only from the leader of its current term.
        """
        new = Commit(term, index)
        if term < 0 or index < 0:
            raise ValueError("commit term and index must be non-negative")
        if term > self._term:
            raise ValueError(f"commit term {term} is ahead of the current term {self._term}")
        if new < self._commit:
            raise ValueError(f"commit went backwards: {new} < {self._commit}")
        self._commit = new

    def set_members(self, members: Sequence[NodeId], now_ms: int) -> Ready:
        """The operator changed the member set (peers.toml reloaded); the quorum follows it.

        What happens to a running term: this node keeps the term and the vote it cast in it (one
        vote per term survives any change), but leaves its role: a leader or candidate becomes a
        follower, and a follower forgets its leader and the certificate that proved it. The
        leader of the term is followed again only when its certificate is a quorum of the NEW
        set; otherwise the next election, in a higher term, is held among the new set.
        Sites reload at different moments, so for a while they count different quorums. Two
        majorities, of the old set and of a set one member larger or smaller, always intersect
        (Ongaro's thesis §4.1, single-server changes): change one site at a time and reload
        every site before the next change; for larger steps, only the term fences leaders."""
        self._advance_clock(now_ms)
        new = tuple(sorted(members))
        if len(set(new)) != len(new) or self._me not in new or not 1 <= len(new) <= MEMBERS_MAX:
            raise ValueError(f"members must be distinct, include me, and number 1..{MEMBERS_MAX}")
        if new == self._members:
            return self._ready([])
        self._members = new
        self._member_set = frozenset(new)
        self._peers = tuple(m for m in new if m != self._me)
        self._quorum = len(new) // 2 + 1
        self._become_follower(self._term)
        self._proven = None   # a certificate is re-checked against the new quorum
        return self._ready([])

    def set_config(self, config: ElectionConfig) -> None:
        """New timings (peers.toml reloaded): a running timer keeps its deadline; the next one
        drawn uses the new values. Safety never depends on them (module rules)."""
        self._cfg = config

    def tick(self, now_ms: int) -> Ready:
        self._advance_clock(now_ms)
        return self._ready(self._on_tick(now_ms))

    def receive(self, src: NodeId, msg: Message, now_ms: int) -> Ready:
        """Handle msg from src (its NodeId, authenticated by the transport)."""
        self._advance_clock(now_ms)
        if not isinstance(msg, MESSAGE_TYPES):
            raise TypeError(f"not an election message: {type(msg).__name__}")
        if src == self._me or src not in self._peers or not _well_formed(msg):
            self._stats.ignored_messages += 1
            return self._ready([])
        if msg.term > self.term_ceiling():
            self._stats.ignored_messages += 1
            self._stats.term_jumps_ignored += 1
            return self._ready([])
        return self._ready(self._on_message(src, msg))

    # -- plumbing ---------------------------------------------------------------------------

    def _advance_clock(self, now_ms: int) -> None:
        assert now_ms >= self._now_ms, f"time went backwards: {now_ms} < {self._now_ms}"
        self._now_ms = now_ms

    def _ready(self, sends: list[Send]) -> Ready:
        before, after = self._reported, self.hard_state
        assert after.term >= before.term, "terms only grow"
        assert after.term > before.term or before.voted_for in (None, after.voted_for), \
            "one vote per term"
        self._reported = after
        return Ready(after if after != before else None, tuple(sends))

    def _reset_election_timer(self) -> None:
        timeout_ms = self._rng.randrange(self._cfg.election_timeout_min_ms,
                                         self._cfg.election_timeout_max_ms)
        self._election_deadline_ms = self._now_ms + timeout_ms

    def _in_lease(self) -> bool:
        # §9.6: while a leader is known to be alive, nobody helps a challenger. A leader's own
        # lease is guaranteed by CheckQuorum (it steps down when it loses its majority).
        if self._role is Role.LEADER:
            return True
        return (self._leader is not None
                and self._now_ms - self._leader_contact_ms < self._cfg.election_timeout_min_ms)

    def _up_to_date(self, msg: PreVote | RequestVote) -> bool:
        return Commit(msg.commit_term, msg.commit_index) >= self._commit

    def _broadcast(self, make: type[PreVote | RequestVote], term: int, commit: Commit) -> list[Send]:
        return [Send(p, make(term, commit.term, commit.index)) for p in self._peers]

    def _heartbeats(self) -> list[Send]:
        # The certificate rides along until a peer says it follows: then heartbeats are small.
        return [Send(p, Heartbeat(self._term, self._commit.term, self._commit.index,
                                  () if p in self._peer_follows else self._certificate))
                for p in self._peers]

    # -- timers -----------------------------------------------------------------------------

    def _on_tick(self, now_ms: int) -> list[Send]:
        if self._role is Role.LEADER:
            if not self._has_quorum_contact(now_ms):  # CheckQuorum (§9.6)
                self._stats.check_quorum_step_downs += 1
                self._become_follower(self._term)
                return []
            if now_ms >= self._next_heartbeat_ms:
                self._next_heartbeat_ms = now_ms + self._cfg.heartbeat_interval_ms
                return self._heartbeats()
            return []
        if now_ms >= self._election_deadline_ms:
            return self._start_pre_vote()
        return []

    def _has_quorum_contact(self, now_ms: int) -> bool:
        window_ms = self._cfg.election_timeout_min_ms
        recent = sum(1 for heard_ms in self._peer_heard_ms.values()
                     if now_ms - heard_ms < window_ms)
        return 1 + recent >= self._quorum

    # -- role changes -----------------------------------------------------------------------

    def _become_follower(self, term: int) -> None:
        assert term >= self._term
        if term > self._term:
            if self._role in (Role.LEADER, Role.CANDIDATE):
                self._stats.higher_term_step_downs += 1
            self._term = term
            self._term_since_ms = self._now_ms
            self._voted_for = None  # a new term: no vote cast in it yet
        self._role = Role.FOLLOWER
        self._leader = None
        self._leader_commit = None
        self._granted.clear()
        self._refused.clear()
        self._vote_sigs.clear()
        self._peer_heard_ms.clear()
        self._certificate = ()
        self._peer_follows.clear()
        self._reset_election_timer()

    def _start_pre_vote(self) -> list[Send]:
        # §9.6: ask first, at term + 1, changing nothing durable: a node that cannot win (cut off,
        # or behind on commits, or facing a live leader) never bumps anyone's term.
        self._stats.pre_votes_started += 1
        self._role = Role.PRE_CANDIDATE
        self._leader = None
        self._leader_commit = None
        self._granted = {self._me}
        self._refused = set()
        self._reset_election_timer()
        if len(self._granted) >= self._quorum:  # a federation of one
            return self._start_election()
        return self._broadcast(PreVote, self._term + 1, self._commit)

    def _start_election(self) -> list[Send]:
        self._stats.elections_started += 1
        self._term += 1
        self._term_since_ms = self._now_ms
        self._voted_for = self._me  # persisted (Ready.persist) before the RequestVotes go out
        self._role = Role.CANDIDATE
        self._granted = {self._me}
        self._refused = set()
        self._vote_sigs = {}
        self._reset_election_timer()
        if len(self._granted) >= self._quorum:
            return self._become_leader()
        return self._broadcast(RequestVote, self._term, self._commit)

    def _become_leader(self) -> list[Send]:
        self._stats.elections_won += 1
        self._role = Role.LEADER
        self._leader = self._me
        self._certificate = tuple(VoteSig(v, sig) for v, sig in sorted(self._vote_sigs.items()))
        self._peer_follows = set()
        self._granted.clear()
        self._refused.clear()
        self._vote_sigs.clear()
        # CheckQuorum grace: every peer counts as heard now, so a new leader gets one full
        # window to collect replies before it can step down.
        self._peer_heard_ms = dict.fromkeys(self._peers, self._now_ms)
        self._next_heartbeat_ms = self._now_ms + self._cfg.heartbeat_interval_ms
        return self._heartbeats()  # announce at once

    def _tally(self) -> list[Send]:
        if len(self._granted) >= self._quorum:
            if self._role is Role.PRE_CANDIDATE:
                return self._start_election()
            return self._become_leader()
        if len(self._refused) > len(self._members) - self._quorum:  # the majority is out of reach
            self._become_follower(self._term)
        return []

    # -- messages ---------------------------------------------------------------------------

    def _on_message(self, src: NodeId, msg: Message) -> list[Send]:
        if isinstance(msg, PreVote):
            return self._on_pre_vote(src, msg)  # never changes our term (§9.6)
        if isinstance(msg, Heartbeat):
            return self._on_heartbeat(src, msg)  # a higher term only with its certificate
        if msg.term > self._term:
            if isinstance(msg, RequestVote) and self._in_lease():
                return []  # a live leader exists: do not even learn the challenger's term
            if not (isinstance(msg, PreVoteReply) and msg.granted):
                self._become_follower(msg.term)  # §5.1
        match msg:
            case PreVoteReply():
                return self._on_pre_vote_reply(src, msg)
            case RequestVote():
                return self._on_request_vote(src, msg)
            case RequestVoteReply():
                return self._on_request_vote_reply(src, msg)
            case HeartbeatReply():
                return self._on_heartbeat_reply(src, msg)
        raise AssertionError("unreachable")

    def _on_pre_vote(self, src: NodeId, msg: PreVote) -> list[Send]:
        if msg.term > self._term and not self._in_lease() and self._up_to_date(msg):
            return [Send(src, PreVoteReply(msg.term, True))]
        return [Send(src, PreVoteReply(self._term, False))]  # our term lets a laggard catch up

    def _on_pre_vote_reply(self, src: NodeId, msg: PreVoteReply) -> list[Send]:
        if self._role is not Role.PRE_CANDIDATE:
            return []
        if msg.granted and msg.term == self._term + 1:
            self._granted.add(src)
        elif not msg.granted:
            self._refused.add(src)
        return self._tally()

    def _on_request_vote(self, src: NodeId, msg: RequestVote) -> list[Send]:
        if msg.term < self._term:
            return [Send(src, RequestVoteReply(self._term, False))]
        if not (self._voted_for in (None, src) and self._up_to_date(msg)):
            return [Send(src, RequestVoteReply(self._term, False))]
        self._voted_for = src
        self._reset_election_timer()  # §5.2: a granted vote counts as hearing a candidate
        return [Send(src, RequestVoteReply(self._term, True, self._sign(vote_statement(self._term, src))))]

    def _on_request_vote_reply(self, src: NodeId, msg: RequestVoteReply) -> list[Send]:
        if self._role is not Role.CANDIDATE or msg.term != self._term:
            return []  # late reply from an earlier campaign
        if not msg.granted:
            self._refused.add(src)
        elif self._verify(src, vote_statement(self._term, self._me), msg.sig):
            self._granted.add(src)
            self._vote_sigs[src] = msg.sig
        else:  # not a vote: counting it would put a signature in my certificate that fails everywhere
            self._stats.bad_vote_signatures += 1
            return []
        return self._tally()

    def _on_heartbeat(self, src: NodeId, msg: Heartbeat) -> list[Send]:
        if msg.term < self._term:
            return [Send(src, HeartbeatReply(self._term))]  # tell the deposed leader
        if msg.term == self._term and (self._role is Role.LEADER or self._leader not in (None, src)):
            # Two leaders in one term: impossible with honest members. Refuse to follow either.
            self._stats.ignored_messages += 1
            return []
        if not self._proves_leader(src, msg.term, msg.certificate):
            # Nobody becomes leader, no term moves; our term and "not following" tell an honest
            # leader to send its certificate again (a restarted follower forgot it).
            self._stats.uncertified_heartbeats += 1
            return [Send(src, HeartbeatReply(self._term, follows=False))]
        if msg.term > self._term or self._role is not Role.FOLLOWER:
            self._become_follower(msg.term)  # §5.1, or someone else won this term (§5.2)
        self._leader = src
        self._leader_contact_ms = self._now_ms
        self._leader_commit = Commit(msg.commit_term, msg.commit_index)
        self._reset_election_timer()
        return [Send(src, HeartbeatReply(self._term, follows=True))]

    def _proves_leader(self, leader: NodeId, term: int, certificate: tuple[VoteSig, ...]) -> bool:
        """True if a quorum of distinct members voted for `leader` in `term`: its own vote is
        implied by its authenticated heartbeat, ours is known if we cast it, every other needs a
        valid signature (election_certificate.py). Verified once per (term, leader); remembered
        after that."""
        if self._proven == (term, leader):
            return True
        known = {leader}
        if term == self._term and self._voted_for == leader:
            known.add(self._me)
        if not certificate_proves(leader, term, certificate, self._member_set, self._quorum, known, self._verify):
            return False
        self._proven = (term, leader)
        self._stats.certificates_verified += 1
        return True

    def _on_heartbeat_reply(self, src: NodeId, msg: HeartbeatReply) -> list[Send]:
        if self._role is not Role.LEADER or msg.term != self._term:
            return []
        if msg.follows:  # only a follower counts for CheckQuorum: it obeys this term's leader
            self._peer_heard_ms[src] = self._now_ms
            self._peer_follows.add(src)
        else:            # it does not (or no longer) know me: the next heartbeat proves it again
            self._peer_follows.discard(src)
        return []
