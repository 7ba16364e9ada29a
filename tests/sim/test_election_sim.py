"""Seeded simulations of the Raft election (fedpeer/core/election/raft.py) over fedpeer/testing/simnet.py.

Each node is an `Election` wrapped in a small shell (`ElectionNode`) that does what the
daemon must: store `Ready.persist` before handing the sends to the network, and rebuild a
restarted node from what it stored. The same wrapper is the checker: after EVERY step of
every node (each tick and each delivered message) it checks the invariants below against a
`World` that outlives crashes, and records violations with the time and the node.

Invariants checked at every step:
  * one leader per term over the whole run (term -> leader, across all nodes and restarts);
  * one vote per (voter, term), read off the granted RequestVoteReplys actually sent, so a
    restarted node that votes again in a term is caught;
  * the shell's stored hard state equals the node's after every step (persist reported);
  * a node's term never decreases, not even across a restart;
  * heartbeats are sent only by the leader of the term they carry;
  * a node follows only the node that won its term (issue 11: a leader proves its election
    with a certificate of signed votes; a forged claim must never be followed);
  * a minority side never elects: a node cut off with fewer than a quorum of members never
    becomes leader of a term that began after the cut, and a leader stranded there steps
    down (CheckQuorum) at its first tick election_timeout_min_ms after the cut (or after its
    election, or after it last received a message from across the cut that was queued while
    it was paused, whichever is latest);
  * leader completeness for committed rounds (§5.4): a new leader's commit index is at least
    every round committed in an earlier term (rounds are committed by an oracle standing in
    for the XGBoost layer: the leader and the members that follow it in its term and that it
    can reach, if they are a majority, all store round commit_index + 1 at once).

Scenario bounds (all simulated time): a fresh federation elects within FRESH_BOUND_MS; after
chaos ends and everything heals, a leader every node follows exists within 20 s.

Every scenario runs over many seeds; failures list the failing seeds, and the same seed
replays exactly. FEDPEER_SIM_SCALE multiplies the seed counts (default 1) for soak runs.
"""

from __future__ import annotations

import os
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field

from fedpeer.core.election.raft import (
    TERM_MAX,
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
    VoteSig,
    vote_statement,
)
from fedpeer.core.membership.swim import NodeId
from fedpeer.testing.fakesig import FakeKeyring

from fedpeer.testing.simnet import NodeSpec, SimNet

CFG = ElectionConfig()
TICK_MS = 50
SCALE = float(os.environ.get("FEDPEER_SIM_SCALE", "1"))
COMMIT_EVERY_MS = 250  # how often the oracle tries to commit a round


def seeds(n: int) -> range:
    return range(max(1, int(n * SCALE)))


# -- the shell and the checker ---------------------------------------------------------------

@dataclass
class World:
    """What survives crashes (each node's disk) plus the global record the checks need."""

    n: int
    keyring: FakeKeyring   # every member's vote signatures (fedpeer/testing/fakesig.py)
    forget_votes: bool = False  # a deliberately broken shell, to prove the checks can fail
    trusting: bool = False  # a deliberately broken verify (every signature passes), likewise
    rounds: bool = True  # run the commit oracle (False: every commit point stays equal)
    hard: dict[int, HardState] = field(default_factory=dict)
    commit: dict[int, Commit] = field(default_factory=dict)
    leaders: dict[int, int] = field(default_factory=dict)           # term -> leader index
    votes: dict[tuple[int, int], NodeId] = field(default_factory=dict)  # (voter, term) -> cand
    top_term: dict[int, int] = field(default_factory=dict)          # highest term per node
    leader_since: dict[int, int] = field(default_factory=dict)      # index -> ms
    commits: dict[int, int] = field(default_factory=dict)  # term -> highest round committed in it
    heard_across_ms: dict[int, int] = field(default_factory=dict)  # last delivery across the cut
    groups: list[set[int]] | None = None  # current partition; None: fully connected
    cut_ms: int = 0
    cut_top_term: int = 0  # highest term anywhere when the partition began
    violations: list[str] = field(default_factory=list)
    steps: int = 0

    @property
    def quorum(self) -> int:
        return self.n // 2 + 1

    def in_minority(self, i: int) -> bool:
        return self.groups is not None and sum(
            len(g) for g in self.groups if i in g) < self.quorum

    def committed_before(self, term: int) -> int:
        """Highest round committed in any term before `term` (what its leader must hold)."""
        return max((index for t, index in self.commits.items() if t < term), default=0)

    def fail(self, now_ms: int, i: int, what: str) -> None:
        self.violations.append(f"t={now_ms} node={i}: {what}")


@dataclass(frozen=True)
class SimSend:  # what SimNet routes: dst id, dst address, message
    dst: NodeId
    address: str
    msg: object


class ElectionNode:
    """Persist-then-send shell around one Election, checking invariants after each step."""

    def __init__(self, spec: NodeSpec, world: World, ids: list[NodeId]) -> None:
        self.i = spec.index
        self.world = world
        self.ids = ids
        self.addresses = dict(spec.peers)
        hs = world.hard.get(self.i, HardState())
        if world.forget_votes:
            hs = HardState(hs.term, None)
        verify = (lambda voter, statement, sig: True) if world.trusting else world.keyring.verify
        self.election = Election(spec.node_id, ids, CFG, spec.rng, hs, spec.now_ms,
                                 world.commit.get(self.i, Commit()),
                                 sign=world.keyring.signer(spec.node_id), verify=verify)
        self._was_leader = False

    def tick(self, now_ms: int) -> list[SimSend]:
        return self._shell(self.election.tick(now_ms), now_ms, ticked=True)

    def receive(self, src: NodeId, msg: object, now_ms: int) -> list[SimSend]:
        if not linked(self.world, self.ids.index(src), self.i):
            # Sent before the cut and queued while we were paused: real news from the far side.
            self.world.heard_across_ms[self.i] = now_ms
        return self._shell(self.election.receive(src, msg, now_ms), now_ms, ticked=False)

    def _shell(self, ready: Ready, now_ms: int, *, ticked: bool) -> list[SimSend]:
        w, e, i = self.world, self.election, self.i
        if ready.persist is not None:
            w.hard[i] = ready.persist  # persist first ...
        w.steps += 1
        if w.hard.get(i, HardState()) != e.hard_state:
            w.fail(now_ms, i, f"hard state changed without persist: {e.hard_state}")
        if e.term < w.top_term.get(i, 0):
            w.fail(now_ms, i, f"term went back to {e.term}")
        w.top_term[i] = e.term
        for send in ready.sends:
            if (isinstance(send.msg, RequestVoteReply) and send.msg.granted
                    and w.votes.setdefault((i, send.msg.term), send.dst) != send.dst):
                w.fail(now_ms, i, f"second vote in term {send.msg.term}")
            if isinstance(send.msg, Heartbeat) and not (
                    e.role is Role.LEADER and send.msg.term == e.term):
                w.fail(now_ms, i, "heartbeat from a non-leader")
        self._check_leader(now_ms, ticked)
        return [SimSend(s.dst, self.addresses[s.dst], s.msg) for s in ready.sends]  # ... then send

    def _check_leader(self, now_ms: int, ticked: bool) -> None:
        w, e, i = self.world, self.election, self.i
        is_leader = e.role is Role.LEADER
        if is_leader and not self._was_leader:
            w.leader_since[i] = now_ms
            if w.leaders.setdefault(e.term, i) != i:
                w.fail(now_ms, i, f"second leader in term {e.term} (first: {w.leaders[e.term]})")
            if e.commit.index < w.committed_before(e.term):  # §5.4 leader completeness
                w.fail(now_ms, i, f"leader of term {e.term} lacks committed rounds: {e.commit}"
                                  f" < {w.committed_before(e.term)}")
            if w.in_minority(i) and e.term > w.cut_top_term:
                w.fail(now_ms, i, f"minority side elected a leader in term {e.term}")
        self._was_leader = is_leader
        if e.leader is not None and e.leader != e.me and w.leaders.get(e.term) != self.ids.index(e.leader):
            w.fail(now_ms, i, f"follows node {self.ids.index(e.leader)} in term {e.term}, which it never won")
        if is_leader and ticked and w.in_minority(i):
            heard_ms = max(w.cut_ms, w.leader_since[i], w.heard_across_ms.get(i, 0))
            deadline_ms = heard_ms + CFG.election_timeout_min_ms
            if now_ms >= deadline_ms:
                w.fail(now_ms, i, "leader in a minority did not step down (CheckQuorum)")


class ForgingNode(ElectionNode):
    """A Byzantine member (issue 11): its own election runs as usual (it may vote and lead like
    anyone), and on every tick it also sends a peer an election message of a term far beyond
    anything honest (2**62, TERM_MAX, or just past the receiver's term_ceiling plus up to a
    million). Its forgeries bypass the checker (they are not its honest core's sends)."""

    def __init__(self, spec: NodeSpec, world: World, ids: list[NodeId], net: list[SimNet]) -> None:
        super().__init__(spec, world, ids)
        self.rng = random.Random(spec.rng.random())
        self.net = net

    def tick(self, now_ms: int) -> list[SimSend]:
        sends = super().tick(now_ms)
        j = self.rng.choice([k for k in range(len(self.ids)) if k != self.i])
        target = self.net[0].nodes[j]
        if target is None:
            return sends
        term = self.rng.choice([2**62, TERM_MAX, target.election.term_ceiling(now_ms) + 1 + self.rng.randrange(10**6)])
        msg = self.rng.choice([Heartbeat(term, 0, 0), RequestVote(term, 2**40, 2**40), PreVote(term, 2**40, 2**40),
                               HeartbeatReply(term), PreVoteReply(term, False), RequestVoteReply(term, True)])
        return [*sends, SimSend(self.ids[j], self.addresses[self.ids[j]], msg)]


class ClaimingNode(ElectionNode):
    """A Byzantine member (issue 11) that claims leadership it never won: every tick it sends a
    peer a heartbeat of that peer's term, or the next one or two, with a certificate that is
    missing, made up, signed with its own key in others' names, replayed from honest leaders'
    certificates it received, too short or repeating one voter. Its core votes when asked but
    never campaigns, so it never wins a term: any honest node following it is a violation."""

    FORGERIES = ("none", "made_up", "own_key", "replayed", "too_few", "duplicate")

    def __init__(self, spec: NodeSpec, world: World, ids: list[NodeId], net: list[SimNet]) -> None:
        super().__init__(spec, world, ids)
        self.rng = random.Random(spec.rng.random())
        self.net = net
        self.sign = world.keyring.signer(spec.node_id)
        self.seen: list[VoteSig] = []  # real vote signatures from honest leaders' certificates
        self.sent: Counter[str] = Counter()

    def tick(self, now_ms: int) -> list[SimSend]:
        # Its core is never ticked, so it never campaigns; it still answers (and votes) when asked.
        j = self.rng.choice([k for k in range(len(self.ids)) if k != self.i])
        target = self.net[0].nodes[j]
        if target is None:
            return []
        term = target.election.term + self.rng.choice([0, 1, 1, 2])
        kind = self.rng.choice(self.FORGERIES)
        if kind == "replayed" and not self.seen:
            kind = "none"  # nothing heard yet to replay
        self.sent[kind] += 1
        msg = Heartbeat(term, 2**40, 2**40, self.certificate(kind, term))
        return [SimSend(self.ids[j], self.addresses[self.ids[j]], msg)]

    def receive(self, src: NodeId, msg: object, now_ms: int) -> list[SimSend]:
        if isinstance(msg, Heartbeat):
            self.seen = (self.seen + list(msg.certificate))[-64:]
        return super().receive(src, msg, now_ms)

    def certificate(self, kind: str, term: int) -> tuple[VoteSig, ...]:
        others = [k for k in self.ids if k != self.ids[self.i]]
        voters = self.rng.sample(others, min(len(others), self.world.quorum - 1))
        if kind == "made_up":
            return tuple(VoteSig(v, self.rng.randbytes(64)) for v in voters)
        if kind == "own_key":
            return tuple(VoteSig(v, self.sign(vote_statement(term, self.ids[self.i]))) for v in voters)
        if kind == "replayed":
            return tuple(self.rng.sample(self.seen, min(len(self.seen), len(voters))))
        if kind == "too_few":
            return tuple(VoteSig(v, self.rng.randbytes(64)) for v in voters[:-1])
        if kind == "duplicate" and voters:
            return (VoteSig(voters[0], self.rng.randbytes(64)),) * len(voters)
        return ()


def new_net(seed: int, n: int, *, drop_rate: float = 0.0, dup_rate: float = 0.0,
            delay_ms: tuple[int, int] = (1, 20), forget_votes: bool = False, byzantine: int | None = None,
            claims: bool = False, trusting: bool = False) -> tuple[SimNet, World]:
    """`byzantine`: the index of a ForgingNode (terms far ahead), or with `claims` a ClaimingNode."""
    ids = [bytes([i + 1]) * 32 for i in range(n)]  # SimNet's ids, known before it boots nodes
    world = World(n, FakeKeyring(ids, seed), forget_votes=forget_votes, trusting=trusting)
    box: list[SimNet] = []

    def factory(spec: NodeSpec) -> ElectionNode:
        if spec.index == byzantine:
            return (ClaimingNode if claims else ForgingNode)(spec, world, ids, box)
        return ElectionNode(spec, world, ids)
    net = SimNet(seed, n, drop_rate=drop_rate, dup_rate=dup_rate, delay_ms=delay_ms,
                 tick_ms=TICK_MS, factory=factory)
    box.append(net)
    assert net.ids == ids
    return net, world


def el(net: SimNet, i: int) -> Election:
    return net.node(i).election


def partition(net: SimNet, world: World, groups: list[set[int]]) -> None:
    net.partition(groups)
    world.groups = [set(g) for g in groups]
    world.cut_ms = net.now_ms
    world.cut_top_term = max(world.top_term.values(), default=0)


def heal(net: SimNet, world: World) -> None:
    net.heal()
    world.groups = None


def linked(world: World, a: int, b: int) -> bool:
    return world.groups is None or any(a in g and b in g for g in world.groups)


def commit_round(net: SimNet, world: World) -> None:
    """The XGBoost layer's stand-in: a leader commits a round on a reachable majority."""
    if not world.rounds:
        return
    for i in range(net.n):
        if not net.is_up(i) or el(net, i).role is not Role.LEADER:
            continue
        lead = el(net, i)
        crew = [j for j in range(net.n) if j != i and net.is_up(j) and linked(world, i, j)
                and el(net, j).term == lead.term and el(net, j).leader == lead.me]
        if 1 + len(crew) < world.quorum:
            continue
        new = Commit(lead.term, lead.commit.index + 1)
        for j in [i, *crew]:
            el(net, j).set_commit(new.term, new.index)  # raises if it would go backwards
            world.commit[j] = new
        world.commits[new.term] = new.index


def run(net: SimNet, world: World, until_ms: int) -> None:
    while net.now_ms < until_ms:
        net.run_until(min(until_ms, net.now_ms + COMMIT_EVERY_MS))
        commit_round(net, world)


def stable_leader(net: SimNet) -> int | None:
    """The leader every running node follows, in one term; None if there is no such node."""
    up = [i for i in range(net.n) if net.is_up(i)]
    leaders = [i for i in up if el(net, i).role is Role.LEADER]
    if len(leaders) != 1:
        return None
    lead = el(net, leaders[0])
    if all(el(net, i).term == lead.term and el(net, i).leader == lead.me for i in up):
        return leaders[0]
    return None


def wait_leader(net: SimNet, world: World, within_ms: int) -> int | None:
    """Run (committing rounds) until a stable leader exists; return the time taken."""
    start = net.now_ms
    while net.now_ms < start + within_ms:
        net.run_until(net.now_ms + TICK_MS)
        if net.now_ms % COMMIT_EVERY_MS < TICK_MS:
            commit_round(net, world)
        if stable_leader(net) is not None:
            return net.now_ms - start
    return None


def summary(samples: list[int]) -> str:
    if not samples:
        return "no samples"
    q = statistics.quantiles(samples, n=100) if len(samples) > 1 else samples * 99
    return (f"n={len(samples)} median={statistics.median(samples)} p99={q[98]:.0f} "
            f"max={max(samples)} ms")


def report(name: str, failures: list[str], **facts: object) -> None:
    line = " ".join(f"{k}={v}" for k, v in facts.items())
    print(f"\n[{name}] {line}")
    assert not failures, f"{len(failures)} failing seeds, first: " + "; ".join(failures[:5])


# -- scenarios -------------------------------------------------------------------------------

FRESH_BOUND_MS = 6_000


def test_fresh_federation_elects_one_leader():
    failures, times, terms = [], [], Counter()
    for seed in seeds(400):
        n = 2 + seed % 6
        net, world = new_net(seed, n, drop_rate=0.02 * (seed % 3), delay_ms=(1, 10 + seed % 90))
        t = wait_leader(net, world, FRESH_BOUND_MS)
        run(net, world, net.now_ms + 3_000)
        if t is None or stable_leader(net) is None or world.violations:
            failures.append(f"seed={seed} t={t} {world.violations[:2]}")
            continue
        times.append(t)
        terms[el(net, stable_leader(net)).term] += 1
    report("fresh", failures, time_to_leader=summary(times), terms=dict(sorted(terms.items())))


def test_chaos_invariants_hold_at_every_step_and_a_leader_follows_healing():
    """Loss, delay, duplication, partitions, crashes/restarts and pauses, then healing."""
    failures, heal_times, faults = [], [], Counter()
    steps = leaders = 0
    bound_ms = 20_000
    for seed in seeds(1_200):
        plan = random.Random(f"chaos-{seed}")
        n = 3 + seed % 5
        net, world = new_net(seed, n, drop_rate=plan.choice([0.0, 0.02, 0.1, 0.2]),
                             dup_rate=plan.choice([0.0, 0.05, 0.2]),
                             delay_ms=(1, plan.choice([10, 50, 150, 400])))
        while net.now_ms < 8_000:
            run(net, world, net.now_ms + plan.randrange(100, 1_500))
            faults[chaos_fault(net, world, plan)] += 1
        heal(net, world)
        for i in range(n):
            if net.nodes[i] is None:
                net.restart(i)
            elif not net.is_up(i):
                net.resume(i)
        t = wait_leader(net, world, bound_ms)
        steps += world.steps
        leaders += len(world.leaders)
        if t is None or world.violations:
            failures.append(f"seed={seed} heal->leader={t} {world.violations[:2]}")
        else:
            heal_times.append(t)
    report("chaos", failures, checked_steps=steps, terms_with_a_leader=leaders,
           faults=dict(sorted(faults.items())), heal_to_leader=summary(heal_times))


def chaos_fault(net: SimNet, world: World, plan: random.Random) -> str:
    """Apply one random fault; returns its kind ("none" if it did not apply)."""
    n = net.n
    kind = plan.choice(["split", "split", "three_way", "heal", "crash", "crash", "restart",
                        "pause", "resume"])
    if kind == "split":
        nodes = list(range(n))
        plan.shuffle(nodes)
        k = plan.randrange(1, n)
        partition(net, world, [set(nodes[:k]), set(nodes[k:])])
    elif kind == "three_way":
        nodes = list(range(n))
        plan.shuffle(nodes)
        a, b = sorted(plan.sample(range(1, n), 2))
        partition(net, world, [set(nodes[:a]), set(nodes[a:b]), set(nodes[b:])])
    elif kind == "heal":
        heal(net, world)
    elif kind == "crash":
        up = [i for i in range(n) if net.nodes[i] is not None]
        if not up:
            return "none"
        net.crash(plan.choice(up))
    elif kind == "restart":
        down = [i for i in range(n) if net.nodes[i] is None]
        if not down:
            return "none"
        net.restart(plan.choice(down))
    elif kind == "pause":
        running = [i for i in range(n) if net.is_up(i)]
        if not running:
            return "none"
        net.pause(plan.choice(running))
    elif kind == "resume":
        paused = [i for i in range(n) if net.nodes[i] is not None and not net.is_up(i)]
        if not paused:
            return "none"
        net.resume(plan.choice(paused))
    return kind


def test_minority_never_elects_and_majority_keeps_or_elects_a_leader():
    """Split a healthy federation; the majority side leads; healing changes nothing more."""
    failures = []
    minority_pre_votes = minority_terms_forced = 0
    for seed in seeds(500):
        plan = random.Random(f"split-{seed}")
        n = 3 + seed % 5
        net, world = new_net(seed, n, dup_rate=0.05, delay_ms=(1, 30))
        if wait_leader(net, world, FRESH_BOUND_MS) is None:
            failures.append(f"seed={seed}: no initial leader")
            continue
        lead = stable_leader(net)
        minority_size = plan.randrange(1, n - world.quorum + 1)
        others = [i for i in range(n) if i != lead]
        plan.shuffle(others)
        leader_in_minority = seed % 2 == 0
        minority = set(others[:minority_size - 1] + [lead] if leader_in_minority
                       else others[:minority_size])
        majority = set(range(n)) - minority
        before = {i: el(net, i).stats.pre_votes_started for i in minority}
        partition(net, world, [minority, majority])
        cut_ms = net.now_ms
        old_term = el(net, lead).term
        run(net, world, cut_ms + 5_000)
        side_leaders = [i for i in majority if el(net, i).role is Role.LEADER]
        ok = len(side_leaders) == 1 and not any(el(net, i).role is Role.LEADER for i in minority)
        if ok and not leader_in_minority:
            ok = side_leaders == [lead] and el(net, lead).term == old_term
        if ok:
            majority_term = el(net, side_leaders[0]).term
            minority_pre_votes += sum(el(net, i).stats.pre_votes_started - before[i]
                                      for i in minority)
            heal(net, world)
            run(net, world, net.now_ms + 4_000)
            after = max(el(net, i).term for i in range(n))
            minority_terms_forced += after - majority_term
            ok = stable_leader(net) == side_leaders[0] and after == majority_term
        if not ok or world.violations:
            failures.append(f"seed={seed} leader_in_minority={leader_in_minority} "
                            f"{world.violations[:2]}")
    report("split", failures, minority_pre_vote_campaigns=minority_pre_votes,
           terms_forced_by_rejoining_minority=minority_terms_forced)


def test_rejoining_node_never_forces_a_new_term():
    """A follower is cut off for 2-10 s, campaigns in vain, rejoins: same leader, same term.

    Two ways of being cut off, alternating by seed: fully isolated while the others commit
    rounds; or merely unable to hear the leader (one-way link failure) while every commit
    point stays equal, so that only PreVote's lease check can refuse it: its pre-votes reach
    followers that still hear the leader.
    """
    failures = []
    pre_votes, forced, modes = 0, 0, Counter()
    for seed in seeds(500):
        plan = random.Random(f"rejoin-{seed}")
        n = 3 + seed % 5
        deaf_to_leader = seed % 2 == 1
        net, world = new_net(seed, n, dup_rate=0.1, delay_ms=(1, 40))
        world.rounds = not deaf_to_leader
        if wait_leader(net, world, FRESH_BOUND_MS) is None:
            failures.append(f"seed={seed}: no initial leader")
            continue
        lead = stable_leader(net)
        term = el(net, lead).term
        loner = plan.choice([i for i in range(n) if i != lead])
        if deaf_to_leader:
            net.cut(lead, loner, both_ways=False)
        else:
            partition(net, world, [{loner}, set(range(n)) - {loner}])
        run(net, world, net.now_ms + plan.randrange(2_000, 10_000))
        tried = el(net, loner).stats.pre_votes_started
        heal(net, world)
        run(net, world, net.now_ms + 4_000)
        terms = {el(net, i).term for i in range(n)}
        pre_votes += tried
        forced += max(terms) - term
        modes["deaf_to_leader" if deaf_to_leader else "isolated"] += 1
        if terms != {term} or stable_leader(net) != lead or tried == 0 or world.violations:
            failures.append(f"seed={seed} deaf={deaf_to_leader} terms={terms} tried={tried} "
                            f"{world.violations[:2]}")
    report("rejoin", failures, runs=dict(modes), pre_vote_campaigns_by_cut_off_nodes=pre_votes,
           new_terms_forced=forced)


def test_crash_restart_storm_never_double_votes():
    """Nodes crash mid-election and restart from their stored hard state, over and over."""
    failures, votes = [], 0
    for seed in seeds(300):
        plan = random.Random(f"storm-{seed}")
        net, world = new_net(seed, 3 + seed % 5, drop_rate=0.05, delay_ms=(1, 60))
        storm(net, world, plan)
        votes += len(world.votes)
        if world.violations or wait_leader(net, world, 20_000) is None:
            failures.append(f"seed={seed} {world.violations[:2]}")
    report("storm", failures, votes_cast=votes)


def storm(net: SimNet, world: World, plan: random.Random) -> None:
    while net.now_ms < 10_000:
        run(net, world, net.now_ms + plan.randrange(50, 600))
        victim = plan.randrange(net.n)
        if net.nodes[victim] is None:
            net.restart(victim)
        else:
            net.crash(victim)
    for i in range(net.n):
        if net.nodes[i] is None:
            net.restart(i)


def amnesia_storm(net: SimNet, world: World, until_ms: int = 10_000) -> int:
    """Crash and restart every voter right after each vote it casts; returns the restarts."""
    restarts = 0
    seen = set(world.votes)
    while net.now_ms < until_ms:
        net.run_until(net.now_ms + 10)
        for voter, _ in sorted(set(world.votes) - seen):
            if net.nodes[voter] is not None:
                net.crash(voter)
                net.restart(voter)
                restarts += 1
        seen = set(world.votes)
    return restarts


def test_voter_restarted_right_after_each_vote_never_votes_twice():
    """Slow links keep rival candidates of one term in flight while their voters reboot."""
    failures, restarts = [], 0
    for seed in seeds(300):
        net, world = new_net(seed, 3 + seed % 5, drop_rate=0.05, delay_ms=(1, 400))
        restarts += amnesia_storm(net, world)
        if world.violations:
            failures.append(f"seed={seed} {world.violations[:2]}")
    report("amnesia", failures, restarts_right_after_a_vote=restarts)


def test_the_checker_catches_a_shell_that_loses_votes():
    """Mutation check: the same storm with a shell that restarts nodes WITHOUT their vote."""
    double_votes = double_leaders = 0
    for seed in seeds(100):
        net, world = new_net(seed, 3 + seed % 5, drop_rate=0.05, delay_ms=(1, 400),
                             forget_votes=True)
        amnesia_storm(net, world)
        double_votes += any("second vote" in v for v in world.violations)
        double_leaders += any("second leader" in v for v in world.violations)
    print(f"\n[mutant] of {len(seeds(100))} seeds, caught a second vote in {double_votes}, "
          f"a second leader of one term in {double_leaders}")
    assert double_votes > 0 and double_leaders > 0


def test_a_byzantine_member_cannot_push_terms_far_ahead():
    """issue 11 over 1,000 seeds: one member sends, every tick, election messages with terms of
    2**62, TERM_MAX or just beyond the receiver's ceiling, under loss, duplication, delay and one
    crash/restart. Every honest node's term stays small, every usual invariant holds at every
    step, and a leader every node follows exists within 20 s of the restart."""
    failures, ignored, top = [], 0, 0
    for seed in seeds(1_000):
        plan = random.Random(f"byzantine-{seed}")
        n = 3 + seed % 4
        bad = plan.randrange(n)
        net, world = new_net(seed, n, drop_rate=plan.choice([0.0, 0.05, 0.2]), dup_rate=plan.choice([0.0, 0.1]),
                             delay_ms=(1, plan.choice([10, 50, 150])), byzantine=bad)
        run(net, world, plan.randrange(1_000, 4_000))
        victim = plan.choice([i for i in range(n) if i != bad])
        net.crash(victim)
        run(net, world, net.now_ms + plan.randrange(500, 3_000))
        net.restart(victim)
        t = wait_leader(net, world, 20_000)
        honest = [i for i in range(n) if i != bad]
        terms = [world.top_term.get(i, 0) for i in honest]
        top = max(top, *terms)
        ignored += sum(el(net, i).stats.term_jumps_ignored for i in honest)
        if t is None or world.violations or max(terms) > 10_000:
            failures.append(f"seed={seed} leader_after={t} terms={terms} {world.violations[:2]}")
    assert ignored > 0, "the forgeries never reached anyone: the test proves nothing"
    report("byzantine", failures, forged_terms_ignored=ignored, highest_honest_term=top)


def claims_run(seed: int, *, trusting: bool = False) -> tuple[SimNet, World, int, int | None]:
    """One seed of a ClaimingNode among 3..7 members under loss, duplication, delay and one honest
    crash/restart; returns the net, the world, the Byzantine index and the time to a stable
    leader after the restart (None: none within 20 s)."""
    plan = random.Random(f"claims-{seed}")
    n = 3 + seed % 5
    bad = plan.randrange(n)
    net, world = new_net(seed, n, drop_rate=plan.choice([0.0, 0.05, 0.2]), dup_rate=plan.choice([0.0, 0.1]),
                         delay_ms=(1, plan.choice([10, 50, 150])), byzantine=bad, claims=True, trusting=trusting)
    run(net, world, plan.randrange(1_000, 4_000))
    victim = plan.choice([i for i in range(n) if i != bad])
    net.crash(victim)
    run(net, world, net.now_ms + plan.randrange(500, 3_000))
    net.restart(victim)
    return net, world, bad, wait_leader_among(net, world, [i for i in range(n) if i != bad], 20_000)


def wait_leader_among(net: SimNet, world: World, honest: list[int], within_ms: int) -> int | None:
    """Like wait_leader, over the honest nodes only (the claimer's core never ticks)."""
    start = net.now_ms
    while net.now_ms < start + within_ms:
        net.run_until(net.now_ms + TICK_MS)
        if net.now_ms % COMMIT_EVERY_MS < TICK_MS:
            commit_round(net, world)
        leaders = [i for i in honest if el(net, i).role is Role.LEADER]
        if len(leaders) == 1 and all(el(net, i).leader == el(net, leaders[0]).me
                                     and el(net, i).term == el(net, leaders[0]).term for i in honest):
            return net.now_ms - start
    return None


def test_a_byzantine_member_claiming_leadership_is_never_followed():
    """issue 11 over 1,000 seeds: one member sends, every tick, heartbeats claiming the leadership
    of the receiver's term or the next ones, with missing, made-up, self-signed, replayed, short
    or duplicated certificates. No honest node ever follows it (checked at every step: a node
    follows only the winner of its term), every usual invariant holds, and the honest members
    still elect a leader they all follow within 20 s of an honest crash/restart."""
    failures, times, sent, refused = [], [], Counter(), 0
    for seed in seeds(1_000):
        net, world, bad, t = claims_run(seed)
        honest = [i for i in range(net.n) if i != bad]
        sent += net.node(bad).sent
        refused += sum(el(net, i).stats.uncertified_heartbeats for i in honest)
        if bad in world.leaders.values() or any(el(net, i).leader == net.ids[bad] for i in honest):
            world.fail(net.now_ms, bad, "the claimer leads or is followed")
        if t is None or world.violations:
            failures.append(f"seed={seed} n={net.n} bad={bad} leader_after={t} {world.violations[:2]}")
        else:
            times.append(t)
    assert set(sent) == set(ClaimingNode.FORGERIES) and refused > 0, "the claims never reached anyone"
    report("claims", failures, forged_heartbeats=dict(sent), refused_by_honest_nodes=refused,
           honest_leader_after_restart=summary(times))


def test_the_checker_catches_a_core_that_trusts_any_signature():
    """Mutation check: with a verify that accepts every signature, made-up certificates win."""
    caught = sum(any("never won" in v for v in claims_run(seed, trusting=True)[1].violations)
                 for seed in seeds(50))
    print(f"\n[trusting] a forged leader was followed in {caught} of {len(seeds(50))} seeds")
    assert caught > 0


def test_replay_is_exact_for_a_seed():
    def trace(seed: int) -> tuple:
        plan = random.Random(seed)
        net, world = new_net(seed, 5, drop_rate=0.1, dup_rate=0.1, delay_ms=(1, 100))
        for _ in range(10):
            run(net, world, net.now_ms + 700)
            chaos_fault(net, world, plan)
        return (tuple(sorted(world.leaders.items())), tuple(sorted(world.hard.items())),
                tuple(net.stats.items()))
    assert trace(7) == trace(7)
    assert trace(7) != trace(8)
