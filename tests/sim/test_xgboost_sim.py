"""The leader-run `xgboost` job (fedpeer/kinds/xgboost/kind.py) under seeded chaos, in virtual time.

Every member runs the real job coroutine over a `MemoryNetwork`; every member also runs the real
election core (fedpeer/core/election/raft.py), ticked every TICK_MS, its messages delayed and dropped
by the seed, and the job asks it who leads (`net.leadership`). Faults, drawn per seed: kill the
leader in the middle of a round (once or twice), cut the leader off in a minority and heal later
(it keeps leading its old term for a while: its directives must be fenced), kill a follower.

Checked for every seed:
* at most one leader per term, across all members, at every tick;
* every member that was never killed or cut off ends the job with the requested number of rounds and the
  same model bytes (SHA-256) as every other survivor, and its history has one entry per round
  whose added trees sum to the model's trees (histories travel with synced models);
* the rounds a member committed came from non-decreasing terms (no stale leader overwrote a
  newer round);
* a member that was cut off either ends like the others or fails (the job finished without it);
  it never ends with another model.

Training here is a cheap stand-in (`fake_train`: one valid stump per class and local round,
derived from the seed, taking simulated time); the real xgboost path runs in
test_real_training_survives_a_leader_kill and in tests/integration. A failing seed is printed
and replays exactly (looptime's noop_cycles=1 is safe here: no threads; it makes a seed ~3x
faster). FEDPEER_SIM_SCALE multiplies the seed counts (default 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
from collections.abc import Sequence
from typing import Any

import looptime
import numpy as np
import pytest

from fedpeer.core.election.raft import Election, ElectionConfig, HardState, Role
from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext
from fedpeer.kinds.xgboost import kind as xj
from fedpeer.ml.xgb import boosting
from fedpeer.runtime.channel import RecvTimeout
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.fakesig import FakeKeyring

from .test_securesum import SteadyChannel

SCALE = float(os.environ.get("FEDPEER_SIM_SCALE", "1"))
CFG = ElectionConfig(heartbeat_interval_ms=100, election_timeout_min_ms=500, election_timeout_max_ms=1000)
TICK_MS = 25
HOP_MS = 2_000
TRAIN_MS = (20, 200)          # simulated training time per member and round
RUN_LIMIT_S = 600             # virtual seconds: a run that has not ended by then is a failure


def seeds(n: int, start: int = 0) -> range:
    return range(start, start + max(1, int(n * SCALE)))


# ---------------------------------------------------------------------------------------------
# Cheap training: valid, deterministic trees documents
# ---------------------------------------------------------------------------------------------

def fake_train(model: bytes | None, X: np.ndarray, y: np.ndarray, params: dict, n: int, eta: float,
               seed: int, cache: Any = None) -> bytes:
    groups = params.get("num_class", 1) if params["objective"] == "multi:softprob" else 1
    rng = random.Random(seed * 1_000_003 + (0 if model is None else boosting.model_info(model).n_trees))
    trees = []
    for _ in range(n * groups):
        f = rng.randrange(X.shape[1])
        cut = float(np.float32(np.median(X[:, f])))
        leaves = [float(np.float32(eta * rng.uniform(-1, 1))) for _ in range(2)]
        trees.append(boosting._Tree(
            left=np.array([1, -1, -1]), right=np.array([2, -1, -1]), feature=np.array([f, 0, 0]),
            value=np.array([cut, *leaves]), default_left=np.array([1, 0, 0]),
            gain=np.array([float(np.float32(rng.uniform(0, 5))), 0.0, 0.0]),
            cover=np.array([float(len(y)), float(np.float32(len(y) / 2)), float(np.float32(len(y) / 2))]),
            depth=1))
    return boosting._trees_doc(trees, groups)


def fake_predict(model: bytes, X: np.ndarray, nthread: Any = None, cache: Any = None) -> np.ndarray:
    """A score that depends on the model and the rows (what the evaluation needs to sum)."""
    salt = int(boosting.model_sha256(model)[:8], 16) % 997 / 997
    return 1 / (1 + np.exp(-(X[:, 0] - X[:, 0].mean() + salt)))


# ---------------------------------------------------------------------------------------------
# The world: members, their elections, the job
# ---------------------------------------------------------------------------------------------

def make_data(n: int, seed: int) -> list[Dataset]:
    rng = np.random.default_rng(seed)
    features = ("a", "b", "c")
    out = []
    for _ in range(n):
        X = rng.normal(size=(40, 3))
        y = (X[:, 0] + rng.normal(scale=0.5, size=40) > 0).astype(np.int8)
        y[:2] = (0, 1)
        X.setflags(write=False)
        y.setflags(write=False)
        out.append(Dataset(features, X, y, np.where(y == 1, "pos", "neg"), 0,
                           schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * 3)))
    return out


class World:
    def __init__(self, seed: int, n: int) -> None:
        self.seed, self.rng = seed, random.Random(seed)
        self.keys = sorted(hashlib.sha256(f"xgb-sim-{seed}-{i}".encode()).digest() for i in range(n))
        self.net = MemoryNetwork(self.keys, seed=seed, delay_ms=(0.5, 5.0), unreachable_ms=100.0, detect_ms=400.0)
        keyring = FakeKeyring(self.keys, seed)   # vote signatures; the forger holds none of the others'
        self.elections = {k: Election(k, self.keys, CFG, random.Random(self.rng.random()), HardState(), 0,
                                      sign=keyring.signer(k), verify=keyring.verify)
                          for k in self.keys}
        self.net.leadership = lambda me: (self.elections[me].term, self.elections[me].leader)
        self.leaders: dict[int, bytes] = {}
        self.violations: list[str] = []
        self.killed: set[bytes] = set()
        self.isolated: set[bytes] = set()     # cut off for a while: may be left behind (then it fails)
        self.tasks: dict[bytes, asyncio.Task] = {}
        self.ticks: dict[bytes, asyncio.Task] = {}
        self.commits: dict[bytes, list[tuple[int, int]]] = {k: [] for k in self.keys}
        self.drop_rate = self.rng.choice((0.0, 0.05, 0.2))
        self.byzantine: bytes | None = None   # a member whose key forges (see `byzantine` below)
        self.byz_task: asyncio.Task | None = None
        self.adopted: dict[bytes, list[str]] = {k: [] for k in self.keys}   # SHA-256 of every model adopted
        self.leader_built: set[str] = set()   # models an honest leader built and committed
        self.forged: set[str] = set()         # models the Byzantine member sent

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    def leader(self) -> bytes | None:
        for k, e in self.elections.items():
            if k not in self.killed and e.role is Role.LEADER:
                return k
        return None

    def deliver(self, src: bytes, sends: Sequence[Any]) -> None:
        loop = asyncio.get_running_loop()
        for s in sends:
            if self.rng.random() < self.drop_rate:
                continue
            loop.call_later(self.rng.uniform(0.5, 5.0) / 1000, self.receive, src, s.dst, s.msg)

    def receive(self, src: bytes, dst: bytes, msg: Any) -> None:
        if dst in self.killed or dst == self.byzantine or not self.net.reachable(src, dst):
            return
        self.deliver(dst, self.elections[dst].receive(src, msg, self.now_ms()).sends)
        self.check(dst)

    def check(self, k: bytes) -> None:
        e = self.elections[k]
        if e.role is Role.LEADER and self.leaders.setdefault(e.term, k) != k:
            self.violations.append(f"two leaders in term {e.term}")

    async def tick(self, k: bytes) -> None:
        await asyncio.sleep(self.rng.uniform(0, TICK_MS) / 1000)
        while True:
            self.deliver(k, self.elections[k].tick(self.now_ms()).sends)
            self.check(k)
            await asyncio.sleep(TICK_MS / 1000)

    def kill(self, k: bytes) -> None:
        self.killed.add(k)
        self.net.crash(k)
        self.tasks[k].cancel()
        self.ticks[k].cancel()

    async def offload(self, fn: Any, *args: Any) -> Any:
        if fn is fake_train:
            await asyncio.sleep(self.rng.uniform(*TRAIN_MS) / 1000)
        return fn(*args)


def tools_for(world: World, k: bytes) -> xj.Tools:
    return xj.Tools(train=fake_train, predict=fake_predict, offload=world.offload)


async def run_world(seed: int, n: int, rounds: int, faults: str, tools: Any = tools_for,
                    data: Sequence[Dataset] | None = None, byzantine: bool = False, drop: bool = True,
                    **params: Any) -> World:
    w = World(seed, n)
    if not drop:
        w.drop_rate = 0.0
    data = data or make_data(n, seed)
    if byzantine:
        w.byzantine = w.rng.choice(w.keys)
    names = {k: f"site-{i + 1}" for i, k in enumerate(w.keys)}
    p = xj.KIND.check_params({"mode": "bagging", "rounds": rounds, "secure_sum": "ring", "member_timeout_ms": 20_000,
                              "max_depth": 3, "nthread": 1} | params)
    original_adopt = xj.Site.adopt

    for k, d in zip(w.keys, data):
        if k == w.byzantine:
            w.byz_task = asyncio.create_task(forger(w, k, p, d))
            continue
        ctx = JobContext(names[k], names, HOP_MS, data=d)
        w.ticks[k] = asyncio.create_task(w.tick(k))
        w.tasks[k] = asyncio.create_task(xj.run_job(SteadyChannel(w.net.channel(k)), p, ctx, tools(w, k)))

    def adopt(site: xj.Site, term: int, rnd: int, model: bytes | None, expect: str | None = None) -> None:
        original_adopt(site, term, rnd, model, expect)
        w.commits[site.me].append((term, rnd))
        w.adopted[site.me].append(site.commit[2])
        if model is not None and expect is None and site.leading(term):
            w.leader_built.add(site.commit[2])

    xj.Site.adopt = adopt  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(chaos(w, faults, rounds), RUN_LIMIT_S)
    finally:
        xj.Site.adopt = original_adopt  # type: ignore[method-assign]
        extra = [w.byz_task] if w.byz_task is not None else []
        for t in (*w.tasks.values(), *w.ticks.values(), *extra):
            t.cancel()
        await asyncio.gather(*w.tasks.values(), *w.ticks.values(), *extra, return_exceptions=True)
    return w


async def round_reached(w: World, k: bytes, rnd: int) -> None:
    while (not w.commits[k] or w.commits[k][-1][1] < rnd) and not w.tasks[k].done():
        await asyncio.sleep(0.01)


async def chaos(w: World, faults: str, rounds: int) -> None:
    rng = w.rng
    if faults in ("leader", "leader_twice", "partition", "follower"):
        while w.leader() is None and not all(t.done() for t in w.tasks.values()):
            await asyncio.sleep(0.01)
        victim = w.leader()
        await round_reached(w, victim, rng.randrange(rounds))
        await asyncio.sleep(rng.uniform(0, 0.25))      # somewhere inside the next round
        if faults == "follower":
            victim = rng.choice([k for k in w.keys if k != w.leader()])
        if faults == "partition":
            others = {k for k in w.keys if k != victim}
            w.isolated.add(victim)
            w.net.partition({victim}, others)
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            w.net.heal()
        else:
            w.kill(victim)
        if faults == "leader_twice":
            while w.leader() in (None, victim) and not all(t.done() for t in w.tasks.values()):
                await asyncio.sleep(0.01)
            second = w.leader()
            await asyncio.sleep(rng.uniform(0, 1.0))
            if second is not None:
                w.kill(second)
    await asyncio.gather(*(t for k, t in w.tasks.items() if k not in w.isolated), return_exceptions=True)
    # A member cut off while the others finished waits out its silence limit, then fails; a few
    # seconds show whether it is still being led, and it can never finish on its own after that.
    cut_off = [t for k, t in w.tasks.items() if k in w.isolated]
    if cut_off:
        await asyncio.wait(cut_off, timeout=10)


def outcome(w: World, rounds: int) -> list[str]:
    problems = list(w.violations)
    shas = {}
    for k, task in w.tasks.items():
        if k in w.killed:
            continue
        if k in w.isolated and (task.cancelled() or isinstance(task.exception(), JobError)):
            # still waiting for a leader when we stopped, or the job ended while it was cut off
            # and it failed: either way it never keeps another model
            continue
        if task.cancelled() or task.exception() is not None:
            why = "cancelled" if task.cancelled() else task.exception()
            problems.append(f"survivor {w.keys.index(k)} failed: {why}")
            continue
        r = task.result()
        shas[k] = r["model_sha256"]
        if r["rounds"] != rounds:
            problems.append(f"survivor {w.keys.index(k)} ended at round {r['rounds']}")
        info = boosting.model_info(r["_model"])
        if boosting.model_sha256(r["_model"]) != r["model_sha256"]:
            problems.append("model bytes and reported SHA-256 differ")
        if [h["round"] for h in r["history"]] != list(range(1, rounds + 1)):
            problems.append(f"history rounds {[h['round'] for h in r['history']]}")
        elif sum(h["trees_added"] for h in r["history"]) != info.n_trees:
            problems.append(f"history says {sum(h['trees_added'] for h in r['history'])} trees, "
                            f"the model has {info.n_trees}")
        elif r["history"][-1]["model_sha256"] != r["model_sha256"]:
            problems.append("the last history entry names another model")
        terms = [t for t, rnd in w.commits[k] if rnd > 0]
        if terms != sorted(terms):
            problems.append(f"survivor {w.keys.index(k)} committed rounds of terms {terms}")
    if len(set(shas.values())) > 1:
        problems.append(f"survivors hold different models: {sorted(set(s[:12] for s in shas.values()))}")
    return problems


def run_seeds(seed_range: range, n: int, rounds: int, faults: str) -> None:
    failures = []
    for seed in seed_range:
        loop = looptime.new_event_loop(start=0, noop_cycles=1)
        try:
            w = loop.run_until_complete(run_world(seed, n, rounds, faults))
        finally:
            loop.close()
        problems = outcome(w, rounds)
        if problems:
            failures.append(f"seed {seed} ({faults}, n={n}): {problems}")
    assert not failures, f"{len(failures)} of {len(seed_range)} seeds failed:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

def test_no_fault_every_member_ends_with_the_same_model():
    run_seeds(seeds(30), n=3, rounds=4, faults="none")


def _asked_ops(seed: int, n: int, rounds: int, offers: bool, **params: Any) -> tuple[list[str], set[str]]:
    """One fault-free run: the ops of every directive the leader(s) sent, and the survivors' models."""
    from fedpeer.kinds.xgboost.lead import Leading
    from fedpeer.kinds.xgboost.training import Training

    ops: list[str] = []
    ask, ack = Leading.ask, Training.ack_commit

    async def counted(self: Any, term: int, peer: bytes, directive: Any, *a: Any, **kw: Any) -> Any:
        ops.append(directive.op)
        return await ask(self, term, peer, directive, *a, **kw)
    Leading.ask = counted  # type: ignore[method-assign]
    if not offers:
        Training.ack_commit = lambda self, leader, msg: self.reply(leader, msg)  # type: ignore[method-assign]
    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        w = loop.run_until_complete(run_world(seed, n, rounds, "none", **params))
    finally:
        loop.close()
        Leading.ask, Training.ack_commit = ask, ack  # type: ignore[method-assign]
    assert outcome(w, rounds) == []
    return ops, {t.result()["model_sha256"] for t in w.tasks.values()}


@pytest.mark.parametrize("seed", [3, 4])
def test_a_members_next_trees_ride_on_its_commit_ack_and_the_model_is_the_same(seed: int) -> None:
    """A member acknowledges a commit with its head start's trees of the next round (training.py):
    the leader asks "round" in round 1 only, and the model is the one the directives would give."""
    n, rounds = 3, 5
    ops, models = _asked_ops(seed, n, rounds, offers=True, drop=False)
    plain_ops, plain_models = _asked_ops(seed, n, rounds, offers=False, drop=False)
    assert plain_ops.count("round") == rounds * (n - 1) and plain_ops.count("commit") == rounds * (n - 1)
    assert ops.count("round") == n - 1 and ops.count("commit") == rounds * (n - 1)
    assert len(models) == 1 and models == plain_models


def test_under_gain_normalisation_each_round_is_asked_for():
    """normalize = "gain": a member's rate comes with the directive, so it has no head start to offer."""
    n, rounds = 3, 4
    ops, models = _asked_ops(5, n, rounds, offers=True, drop=False, normalize="gain")
    assert ops.count("round") == rounds * (n - 1) and len(models) == 1


# Seed counts keep the whole suite near its 10-minute budget on 2 cores (these sims were its
# longest items: ~140 s of CPU at the counts before these, 9 min 44 s - 11 min 18 s for the suite);
# FEDPEER_SIM_SCALE=3 runs 990 failover and 1,050 byzantine seeds (issue 11 ran about 1,000 of each).
@pytest.mark.parametrize("faults,n,count", [("leader", 5, 80), ("leader", 3, 70), ("leader_twice", 5, 70),
                                            ("partition", 5, 70), ("follower", 5, 40)])
def test_failover_ends_with_identical_models_on_survivors(faults, n, count):
    run_seeds(seeds(count, start=1000), n=n, rounds=5, faults=faults)


def test_a_stale_leaders_directives_are_refused():
    """A deposed leader's directive is answered "stale_term" and changes nothing."""
    async def go() -> None:
        keys = sorted(hashlib.sha256(f"stale-{i}".encode()).digest() for i in range(3))
        net = MemoryNetwork(keys, seed=1)
        view = {k: (5, keys[1]) for k in keys}
        net.leadership = lambda me: view[me]
        ch = SteadyChannel(net.channel(keys[0]))
        data = make_data(1, 0)[0]
        site = xj.Site(ch=ch, params=xj.KIND.check_params({"rounds": 2}), ctx=JobContext("a", {}, HOP_MS, data=data),
                       tools=xj.Tools(train=fake_train, predict=fake_predict))
        xj.prepare(site)
        site.base, site.total_rows = 0.5, 40
        site.adopt(0, 0, None)
        site.seen_term = 5
        stale = xj._directive(4, "round", 1, prev_sha="")
        await site.follow(keys[2], stale)
        _, reply = await SteadyChannel(net.channel(keys[2])).recv(xj.Reply, "xgb/reply/4/round/1", timeout_ms=1000)
        assert reply.error == "stale_term" and reply.trees == b"" and site.commit == (0, 0, "")
        fresh = xj._directive(5, "round", 1, prev_sha="")
        await site.follow(keys[1], fresh)
        _, reply = await SteadyChannel(net.channel(keys[1])).recv(xj.Reply, "xgb/reply/5/round/1", timeout_ms=1000)
        assert reply.error == "" and boosting.validate_trees(
            reply.trees, num_feature=3, num_class=0, num_local_round=1, max_depth=3, max_nodes=15, leaf_abs_max=10)
        await site.close()

    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        loop.run_until_complete(go())
    finally:
        loop.close()


def test_real_training_survives_a_leader_kill():
    """The same chaos with real xgboost training (few seeds: each trains dozens of boosters)."""
    from .test_bofrf_jobs import make_sites

    def real(world: World, k: bytes) -> xj.Tools:
        async def inline(fn: Any, *args: Any) -> Any:
            if fn is boosting.train_local_round:
                await asyncio.sleep(world.rng.uniform(*TRAIN_MS) / 1000)
            return fn(*args)
        return xj.Tools(offload=inline)

    failures = []
    for seed in range(3):
        loop = looptime.new_event_loop(start=0, noop_cycles=1)
        try:
            w = loop.run_until_complete(run_world(seed, 5, 4, "leader", tools=real, data=make_sites(5, seed)))
        finally:
            loop.close()
        problems = outcome(w, 4)
        if problems:
            failures.append(f"seed {seed}: {problems}")
        survivors = [t.result() for k, t in w.tasks.items() if k not in w.killed]
        assert all(r["auc"] is not None and r["auc"] > 0.9 for r in survivors), [r["auc"] for r in survivors]
    assert not failures, failures


def test_a_job_member_that_is_not_led_fails_cleanly():
    """No leader ever (a lone member of a five-member election): the job fails with the reason."""
    async def go() -> None:
        keys = sorted(hashlib.sha256(f"alone-{i}".encode()).digest() for i in range(2))
        net = MemoryNetwork(keys, seed=2)
        net.leadership = lambda me: (3, None)
        data = make_data(2, 1)
        names = {k: f"site-{i + 1}" for i, k in enumerate(keys)}
        p = xj.KIND.check_params({"mode": "bagging", "rounds": 2, "member_timeout_ms": 1000, "secure_sum": "ring"})
        tools = xj.Tools(train=fake_train, predict=fake_predict, offload=lambda fn, *a: asyncio.sleep(0, fn(*a)))
        results = await asyncio.gather(*(xj.run_job(SteadyChannel(net.channel(k)), p,
                                                    JobContext(names[k], names, HOP_MS, data=d), tools)
                                         for k, d in zip(keys, data)), return_exceptions=True)
        assert all(isinstance(r, JobError) and "no directive from a leader" in str(r) for r in results), results

    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        loop.run_until_complete(go())
    finally:
        loop.close()


# ---------------------------------------------------------------------------------------------
# Authority is checked, not assumed (issue 11): one member's key cannot steer a follower
# ---------------------------------------------------------------------------------------------

def poisoned_doc(leaf: float = -1000.0, feature: int = 0) -> bytes:
    """One stump whose leaves are `leaf`: the attacker's tree (every row pushed negative)."""
    tree = boosting._Tree(left=np.array([1, -1, -1]), right=np.array([2, -1, -1]), feature=np.array([feature, 0, 0]),
                          value=np.array([0.0, leaf, leaf]), default_left=np.array([1, 0, 0]),
                          gain=np.array([1.0, 0.0, 0.0]), cover=np.array([40.0, 20.0, 20.0]), depth=1)
    return boosting._trees_doc([tree], 1)


def poisoned_model(leaf: float = -1000.0, base: float = 0.5) -> bytes:
    return boosting.append_round(None, [poisoned_doc(leaf)], base, 3, 0, "binary:logistic")


def follower(view: dict, seed: int = 1) -> tuple[list[bytes], MemoryNetwork, xj.Site]:
    """A follower site (keys[0]) whose election view is view[keys[0]] (mutable by the test)."""
    keys = sorted(hashlib.sha256(f"authority-{seed}-{i}".encode()).digest() for i in range(3))
    net = MemoryNetwork(keys, seed=seed)
    net.leadership = lambda me: view[0]
    site = xj.Site(ch=SteadyChannel(net.channel(keys[0])), params=xj.KIND.check_params({"rounds": 3}),
                   ctx=JobContext("a", {}, HOP_MS, data=make_data(1, 0)[0]),
                   tools=xj.Tools(train=fake_train, predict=fake_predict))
    xj.prepare(site)
    site.base, site.total_rows = 0.5, 40
    site.adopt(0, 0, None)
    return keys, net, site


async def reply_to(net: MemoryNetwork, key: bytes, term: int, op: str, rnd: int) -> xj.Reply:
    _, reply = await SteadyChannel(net.channel(key)).recv(xj.Reply, xj._reply_tag(term, op, rnd), timeout_ms=1000)
    return reply


def run_virtual(coro: Any) -> None:
    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


def test_a_forged_commit_with_a_high_term_from_a_non_leader_changes_nothing():
    """The attack of issue 11: a member's commit of term 2**62 with a poisoned model, then finish.
    It is parked (never obeyed), refused once PARK_MS passed, and the real leader is not stale."""
    async def go() -> None:
        view = [(5, None)]
        keys, net, site = follower(view)
        view[0] = (5, keys[1])                       # keys[1] won term 5; keys[2] is the attacker
        model = poisoned_model()
        sha = boosting.model_sha256(model)
        high = 2**62
        await site.follow(keys[2], xj._directive(high, "commit", 1, sha=sha, model=model, commit_term=high))
        await site.follow(keys[2], xj._directive(high, "finish", 2, sha=sha))
        assert site.commit == (0, 0, "") and site.seen_term < high and site.finished_ms is None
        await site.follow(keys[1], xj._directive(5, "round", 1, prev_sha=""))
        reply = await reply_to(net, keys[1], 5, "round", 1)
        assert reply.error == "" and reply.trees            # the real leader is obeyed, not "stale_term"
        await asyncio.sleep(xj.PARK_MS / 1000)
        await site.unpark()
        assert (await reply_to(net, keys[2], high, "finish", 2)).error == "unconfirmed_leader"
        # The same forgery at the current term: the election knows term 5's leader, and it is not keys[2].
        await site.follow(keys[2], xj._directive(5, "commit", 1, sha=sha, model=model, commit_term=5))
        assert (await reply_to(net, keys[2], 5, "commit", 1)).error == "not_leader"
        assert site.commit == (0, 0, "") and site.refused == {keys[2]: {"unconfirmed_leader": 1, "not_leader": 1}}
        assert site.result()["directives_refused"] == {keys[2].hex()[:16]: {"unconfirmed_leader": 1,
                                                                            "not_leader": 1}}
        await site.close()

    run_virtual(go())


def test_a_directive_of_a_term_not_yet_confirmed_waits_for_the_election():
    """A new leader's first directive may overtake its heartbeat: parked, then obeyed."""
    async def go() -> None:
        view = [(5, None)]
        keys, net, site = follower(view)
        await site.follow(keys[1], xj._directive(6, "state"))
        with pytest.raises(RecvTimeout):
            await reply_to(net, keys[1], 6, "state", 0)       # not obeyed (nor answered) yet
        assert site.seen_term == 0
        view[0] = (6, keys[1])                                   # the heartbeat arrives
        await site.unpark()
        reply = await reply_to(net, keys[1], 6, "state", 0)
        assert reply.error == "" and site.seen_term == 6 and not site.parked
        await site.close()

    run_virtual(go())


def test_the_real_leaders_model_and_trees_pass_the_members_checks():
    """No leaf_abs_max = inf for the leader: its synced model and its commit's trees are checked
    like a member's trees, even when the election says it leads."""
    async def go() -> None:
        view = [(5, None)]
        keys, net, site = follower(view)
        view[0] = (5, keys[1])
        model = poisoned_model()
        sha = boosting.model_sha256(model)
        await site.follow(keys[1], xj._directive(5, "commit", 2, sha=sha, model=model, commit_term=5))
        assert "leaf_abs_max" in (await reply_to(net, keys[1], 5, "commit", 2)).error
        doc = poisoned_doc()
        await site.follow(keys[1], xj._directive(5, "commit", 1, prev_sha="", sha=sha, trees=[doc],
                                                 participants=[keys[1]]))
        assert "leaf_abs_max" in (await reply_to(net, keys[1], 5, "commit", 1)).error
        future = poisoned_model(leaf=-1.0)
        await site.follow(keys[1], xj._directive(5, "commit", 3, sha=boosting.model_sha256(future), model=future,
                                                 commit_term=6))
        assert "committed in term 6" in (await reply_to(net, keys[1], 5, "commit", 3)).error
        assert site.commit == (0, 0, "")
        await site.close()

    run_virtual(go())


# ---------------------------------------------------------------------------------------------
# A Byzantine member in the seeded simulation
# ---------------------------------------------------------------------------------------------

FORGE_GAP_MS = (2, 40)        # the forger's pause between two forgeries


async def forger(w: World, k: bytes, p: dict, data: Dataset) -> None:
    """A member whose key is used against the others. It takes part in the label-count sum (or the
    job would never start; so it also knows the federation's base score and can forge models that
    pass every shape check), then until the end answers the real leader with lies (a commit point
    of term 2**62 and round 10**6, a poisoned model on fetch, trees with leaves of -1000) and, all
    the while, forges directives to honest members (commit and finish of term 2**62; commits and
    rounds of their current term and of the next one, with poisoned and with plausible models) and
    election messages of term 2**62 or heartbeats claiming the next term (issue 11: without a
    certificate of signed votes they make nobody leader). It never runs an election core, so it
    never leads."""
    from fedpeer.protocols.securesum.api import secure_sum

    ch = SteadyChannel(w.net.channel(k))
    out = await secure_sum(ch, "xgb/labels", xj.label_vector(np.asarray(data.y, dtype=np.int64), p, len(ch.members)),
                           mode=p["secure_sum"], hop_timeout_ms=HOP_MS)
    base, _ = xj.base_from_total(out.total, p)
    poison, plausible = poisoned_model(base=base), poisoned_model(base=base, leaf=-0.5)
    w.forged |= {boosting.model_sha256(poison), boosting.model_sha256(plausible)}
    forging = asyncio.create_task(forge(w, k, ch, p, poison, plausible))
    try:
        while True:
            src, msg = await ch.recv(xj.Directive, xj.DIRECTIVE_TAG, timeout_ms=60_000)
            with contextlib.suppress(JobError):
                await ch.send(src, lie(msg, poison))
    finally:
        forging.cancel()


async def forge(w: World, k: bytes, ch: Any, p: dict, poison: bytes, plausible: bytes) -> None:
    from fedpeer.core.election.raft import Heartbeat, PreVote, RequestVote, VoteSig

    rng = random.Random(w.seed * 7 + 1)
    honest = [m for m in w.keys if m != k]
    while True:
        await asyncio.sleep(rng.uniform(*FORGE_GAP_MS) / 1000)
        target = rng.choice(honest)
        if target in w.killed:
            continue
        term, choice = w.elections[target].term, rng.randrange(7)
        if choice == 6:   # terms far ahead, or the leadership of the next term (no proof, or a made-up one)
            made_up = tuple(VoteSig(m, rng.randbytes(64)) for m in honest)
            w.receive(k, target, rng.choice([Heartbeat(2**62, 0, 0), RequestVote(2**62, 9, 9), PreVote(2**62, 9, 9),
                                             Heartbeat(term + 1, 0, 0), Heartbeat(term + 1, 0, 0, made_up)]))
            continue
        forged = forged_directive(choice, term, rng.randint(1, p["rounds"]), poison, plausible, honest)
        with contextlib.suppress(JobError):
            await ch.send(target, forged)


def forged_directive(choice: int, term: int, rnd: int, poison: bytes, plausible: bytes,
                     honest: list[bytes]) -> xj.Directive:
    high = 2**62
    model = poison if choice % 2 == 0 else plausible
    sha = boosting.model_sha256(model)
    if choice == 0:
        return xj._directive(high, "commit", rnd, sha=sha, model=model, commit_term=high)
    if choice == 1:
        return xj._directive(high, "finish", rnd, sha=sha)
    if choice in (2, 3):      # the member's current term, whose leader its election knows (or will)
        return xj._directive(term, "commit", rnd, sha=sha, model=model, commit_term=term)
    if choice == 4:           # the next term: no election has confirmed anyone for it
        return xj._directive(term + 1, "commit", rnd, sha=sha, model=model, commit_term=term + 1,
                             trees=[poisoned_doc()], participants=honest[:1])
    return xj._directive(term, "round", rnd, prev_sha="", model=plausible, commit_term=term)


def lie(msg: xj.Directive, poison: bytes) -> xj.Reply:
    """The forger's answer to the real leader: the most damaging well-formed reply to each op (a
    commit's acknowledgement offers trees for the next round: training.py)."""
    sha = boosting.model_sha256(poison)
    base = dict(tag=xj._reply_tag(msg.term, msg.op, msg.round), commit_term=0, commit_round=0, commit_sha="",
                trees=b"", model=b"", history=b"", error="")
    if msg.op == "state":
        base.update(commit_term=2**62, commit_round=10**6, commit_sha=sha)
    elif msg.op == "fetch":
        base.update(commit_term=2**62, commit_round=10**6, commit_sha=sha, model=poison)
    elif msg.op == "round":
        base.update(trees=poisoned_doc())
    elif msg.op == "commit":     # the commit point asked about, with poisoned "next round" trees on it
        base.update(commit_term=msg.term, commit_round=msg.round, commit_sha=msg.sha, trees=poisoned_doc())
    return xj.Reply(**base)


def byzantine_outcome(w: World, rounds: int) -> list[str]:
    problems = outcome(w, rounds)
    for k, shas in w.adopted.items():
        bad = [s for s in shas if s and (s in w.forged or s not in w.leader_built)]
        if bad:
            problems.append(f"member {w.keys.index(k)} adopted {len(bad)} model(s) no honest leader committed")
    if not w.leader_built:
        problems.append("no honest leader committed anything")
    return problems


def run_byzantine_seeds(seed_range: range, n: int, rounds: int, faults: str) -> None:
    failures = []
    for seed in seed_range:
        loop = looptime.new_event_loop(start=0, noop_cycles=1)
        try:
            w = loop.run_until_complete(run_world(seed, n, rounds, faults, byzantine=True))
        finally:
            loop.close()
        problems = byzantine_outcome(w, rounds)
        if problems:
            failures.append(f"seed {seed} ({faults}, n={n}, byzantine {w.keys.index(w.byzantine)}): {problems}")
    assert not failures, f"{len(failures)} of {len(seed_range)} seeds failed:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("faults,n,count", [("none", 3, 250), ("leader", 5, 100)])
def test_a_byzantine_member_never_gets_its_model_adopted(faults, n, count):
    """issue 11 over 350 seeds (FEDPEER_SIM_SCALE=3: 1,050): one member forges terms, commits,
    finishes and election messages and lies to the real leader; every honest survivor still ends
    with the same model, and no honest site ever adopts a model no honest leader built."""
    run_byzantine_seeds(seeds(count, start=5000), n=n, rounds=2, faults=faults)
