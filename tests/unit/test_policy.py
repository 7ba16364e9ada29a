"""[policy] protects a site: per-kind limits, rows_min, proposers, allowed_jobs checked at load.

Config mistakes are one-line ConfigErrors naming the key; a proposal beyond a limit is refused
(to a peer: one JobReject; to this site's own operator: a JobError) with a reason naming the
limit, so the proposer's job fails saying which site refused and why (issue 12 item 4).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedpeer.config import load as cfg
from fedpeer.errors import ConfigError, JobError
from fedpeer.jobs import messages as m
from fedpeer.jobs.lifecycle.registry import JobRegistry
from fedpeer.kinds.catalog import job_kinds, load_config

KIND_NAMES = tuple(job_kinds())

EXAMPLE = Path(__file__).resolve().parents[2] / "peers.toml"


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# ---------------------------------------------------------------------------------------------
# 1. peers.toml: every mistake is one line naming the key
# ---------------------------------------------------------------------------------------------

def test_a_typo_in_allowed_jobs_names_the_key_and_the_known_kinds(two_sites: tuple[Path, Path]) -> None:
    a, _ = two_sites
    _replace(a, f"allowed_jobs = {json.dumps(list(KIND_NAMES))}", 'allowed_jobs = ["stat", "bofrf"]')
    with pytest.raises(ConfigError) as err:
        load_config(a)
    assert err.value.key == "policy.allowed_jobs"
    assert "'stat'" in err.value.problem and "stats, sumcheck, bofrf, xgboost" in err.value.problem
    assert str(a) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,key,problem", [
    ('proposers = ["site-9"]', "policy.proposers", "'site-9' is not a [[peer]] name; known peers: b"),
    ('proposers = ["*", "b"]', "policy.proposers", "write it alone"),
    ("proposers = \"b\"", "policy.proposers", "list of strings"),
    ("rows_min = -5", "policy.rows_min", "non-negative"),
    ("[policy.xgboost]\nrounds_max = -1", "policy.xgboost.rounds_max", "non-negative"),
    ("[policy.xgboost]\nrounds_max = 0", "policy.xgboost.rounds_max", "leave 'xgboost' out of [policy] allowed_jobs"),
    ("[policy.bofrf]\nleaf_rows_min = 1.5", "policy.bofrf.leaf_rows_min", "integer"),
    ("[policy.xgboost]\nround_max = 10", "policy.xgboost.round_max", "unknown key (known: bins_max, depth_max"),
    ("[policy.xgbost]\nrounds_max = 10", "policy.xgbost", "unknown key"),
    ("[policy]\nstats = 3", "policy.stats", "expected a table"),
])
def test_bad_policy_values_name_the_key(two_sites: tuple[Path, Path], text: str, key: str, problem: str) -> None:
    a, _ = two_sites
    if text.startswith("[policy]"):      # a second [policy] header is invalid TOML: put it in the first
        _replace(a, "[policy]\n", text + "\n")
    elif text.startswith("[policy."):
        _append(a, text)
    else:
        _replace(a, "[policy]\n", "[policy]\n" + text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(a)
    assert err.value.key == key, err.value
    assert problem in err.value.problem, err.value


def test_policy_values_load(two_sites: tuple[Path, Path]) -> None:
    a, _ = two_sites
    _replace(a, "[policy]\n", '[policy]\nproposers = ["b"]\nrows_min = 50\nids_max = 5000\n')
    _append(a, "[policy.xgboost]\nrounds_max = 200\ndepth_max = 8\n\n[policy.stats]\nbins_max = 12")
    policy = load_config(a).policy
    assert policy.proposers == ("b",) and policy.rows_min == 50 and policy.ids_max == 5000
    assert policy.may_propose("b") and not policy.may_propose("c")
    kinds = job_kinds()
    xgb = kinds["xgboost"].policy_limits(policy.limits["xgboost"])   # the others keep their defaults
    assert xgb == {**kinds["xgboost"].policy_limits({}), "rounds_max": 200, "depth_max": 8}
    assert policy.limits["stats"] == {"bins_max": 12} and "bofrf" not in policy.limits
    _replace(a, 'proposers = ["b"]', "proposers = []")
    assert not load_config(a).policy.may_propose("b"), "an empty list: no peer proposes here"


def test_the_example_documents_every_kind_limit_with_its_default() -> None:
    text = EXAMPLE.read_text()
    for kind, job in job_kinds().items():
        assert f"\n[policy.{kind}]\n" in text, f"peers.toml has no [policy.{kind}]"
        section = text.split(f"\n[policy.{kind}]\n", 1)[1].split("\n[", 1)[0]
        for name, limit in job.limits.items():
            assert f"\n{name} = {limit.default} " in "\n" + section, f"[policy.{kind}] {name} not documented"
    policy = load_config(EXAMPLE).policy
    assert all(policy.allows(kind) for kind in KIND_NAMES)
    assert policy.limits == {kind: job.policy_limits({}) for kind, job in job_kinds().items() if job.limits}
    assert dataclasses.replace(policy, allowed_jobs=cfg.Policy().allowed_jobs, limits={}) == cfg.Policy()


# ---------------------------------------------------------------------------------------------
# 2. The names config/load.py checks against are the registry's, and the defaults refuse nothing
# ---------------------------------------------------------------------------------------------

def test_kind_names_and_limits_match_the_job_kinds() -> None:
    for name, kind in job_kinds().items():
        assert kind.name == name
        for limit_name, limit in kind.limits.items():
            param = kind.params[limit.param]
            bound = param.high if limit_name.endswith("_max") else param.low
            assert limit.default == bound, f"[policy.{name}] {limit_name} default is not {limit.param}'s own bound"


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_default_limits_accept_every_parameter_at_its_bound(kind: str) -> None:
    job = job_kinds()[kind]
    for name, limit in job.limits.items():
        p = job.params[limit.param]
        extreme = p.high if name.endswith("_max") else p.low
        job.check_policy(job.check_params({limit.param: extreme}), {})   # raises if refused


# ---------------------------------------------------------------------------------------------
# 3. The registry: every limit refuses, naming itself, a peer's proposal and our own
# ---------------------------------------------------------------------------------------------

def key(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


ME, ALICE, BOB = key("me"), key("alice"), key("bob")
NAMES = {ME: "site-me", ALICE: "alice", BOB: "bob"}


@dataclass
class FakeTransport:
    me: bytes = ME
    sent: list[tuple[bytes, object]] = field(default_factory=list)

    def now_ms(self) -> int:
        return 1_700_000_000_000

    def alive(self, peer: bytes) -> bool:
        return True

    def leadership(self) -> tuple[int, bytes | None]:
        return 1, None

    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes:
        return bytes(32)

    async def send(self, dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None:
        self.sent.append((dst, msg))
        await asyncio.sleep(0)

    def of(self, kind: type) -> list[tuple[bytes, Any]]:
        return [(dst, msg) for dst, msg in self.sent if isinstance(msg, kind)]


def make_config(tmp_path: Path, policy: cfg.Policy, data: cfg.DataSection | None = None) -> cfg.Config:
    node = cfg.NodeSection(name="site-me", listen=cfg.Address("127.0.0.1", 1), advertise=cfg.Address("127.0.0.1", 1),
                           key_file=tmp_path / "key", state_dir=tmp_path / "state", admin="unix:/nonexistent")
    return cfg.Config(path=tmp_path / "peers.toml", node=node, peers=(), policy=policy, data=data)


def with_limit(kind: str, limit: str, value: int) -> cfg.Policy:
    return dataclasses.replace(cfg.Policy(), limits={kind: {limit: value}})


def proposal(src: bytes, job_id: str, kind: str, params: dict) -> m.JobPropose:
    return m.JobPropose(job_id=job_id, kind=kind, params=params, members=sorted({src, ME, BOB}), created_ms=0)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


# kind, limit, its value, the parameters asked for, the reason
REFUSALS = [
    ("stats", "bins_max", 10, {"bins": 20}, "bins 20 > [policy.stats] bins_max 10"),
    ("sumcheck", "entries_max", 1000, {"entries": 1024}, "entries 1024 > [policy.sumcheck] entries_max 1000"),
    ("bofrf", "trees_max", 50, {"n_estimators": 100}, "n_estimators 100 > [policy.bofrf] trees_max 50"),
    ("bofrf", "depth_max", 8, {"max_depth": 9}, "max_depth 9 > [policy.bofrf] depth_max 8"),
    ("bofrf", "depth_max", 8, {"max_depth": 0}, "max_depth 0 (in effect 64) > [policy.bofrf] depth_max 8"),
    ("bofrf", "depth_max", 8, {"max_depth": 4, "grid_search": True},
     "max_depth 4 (in effect 64) > [policy.bofrf] depth_max 8"),
    ("bofrf", "leaf_rows_min", 5, {"min_samples_leaf": 4}, "min_samples_leaf 4 < [policy.bofrf] leaf_rows_min 5"),
    ("bofrf", "leaf_rows_min", 5, {"min_samples_leaf": 10, "grid_search": True},
     "min_samples_leaf 10 (in effect 2) < [policy.bofrf] leaf_rows_min 5"),
    ("bofrf", "boppid_rounds_max", 10, {"baseline": "boppid", "boppid_rounds": 11},
     "boppid_rounds 11 > [policy.bofrf] boppid_rounds_max 10"),
    ("xgboost", "rounds_max", 200, {"rounds": 500}, "rounds 500 > [policy.xgboost] rounds_max 200"),
    ("xgboost", "trees_per_round_max", 2, {"num_local_round": 3},
     "num_local_round 3 > [policy.xgboost] trees_per_round_max 2"),
    ("xgboost", "depth_max", 4, {"max_depth": 5}, "max_depth 5 > [policy.xgboost] depth_max 4"),
    ("xgboost", "bins_max", 64, {"max_bin": 65}, "max_bin 65 > [policy.xgboost] bins_max 64"),
    ("tree", "depth_max", 4, {"max_depth": 5}, "max_depth 5 > [policy.tree] depth_max 4"),
    ("tree", "bins_max", 64, {"max_bin": 65}, "max_bin 65 > [policy.tree] bins_max 64"),
    ("logreg", "iterations_max", 50, {"max_iter": 51}, "max_iter 51 > [policy.logreg] iterations_max 50"),
    ("logreg", "rounds_max", 50, {"rounds": 51}, "rounds 51 > [policy.logreg] rounds_max 50"),
    ("logreg", "local_epochs_max", 5, {"local_epochs": 6}, "local_epochs 6 > [policy.logreg] local_epochs_max 5"),
    ("logreg", "dp_iterations_max", 50, {"dp_iterations": 51},
     "dp_iterations 51 > [policy.logreg] dp_iterations_max 50"),
    ("mlp", "rounds_max", 50, {"rounds": 51}, "rounds 51 > [policy.mlp] rounds_max 50"),
    ("mlp", "local_epochs_max", 5, {"local_epochs": 6}, "local_epochs 6 > [policy.mlp] local_epochs_max 5"),
    ("kmeans", "clusters_max", 4, {"k": 5}, "k 5 > [policy.kmeans] clusters_max 4"),
    ("kmeans", "iterations_max", 50, {"max_iter": 51}, "max_iter 51 > [policy.kmeans] iterations_max 50"),
    ("kmeans", "restarts_max", 2, {"n_init": 3}, "n_init 3 > [policy.kmeans] restarts_max 2"),
    ("kmeans", "cluster_rows_min", 10, {"min_cluster_rows": 9},
     "min_cluster_rows 9 < [policy.kmeans] cluster_rows_min 10"),
    ("gmm", "components_max", 4, {"k": 5}, "k 5 > [policy.gmm] components_max 4"),
    ("gmm", "iterations_max", 50, {"max_iter": 51}, "max_iter 51 > [policy.gmm] iterations_max 50"),
    ("gmm", "restarts_max", 2, {"n_init": 3}, "n_init 3 > [policy.gmm] restarts_max 2"),
    ("gmm", "cluster_rows_min", 10, {"min_cluster_rows": 9}, "min_cluster_rows 9 < [policy.gmm] cluster_rows_min 10"),
    ("dbscan", "components_max", 4, {"components": 5}, "components 5 > [policy.dbscan] components_max 4"),
    ("dbscan", "local_clusters_max", 4, {"local_clusters_max": 5},
     "local_clusters_max 5 > [policy.dbscan] local_clusters_max 4"),
    ("dbscan", "synthetic_rows_max", 1000, {"synthetic_rows_max": 1001},
     "synthetic_rows_max 1001 > [policy.dbscan] synthetic_rows_max 1000"),
    ("dbscan", "cluster_rows_min", 10, {"min_cluster_rows": 9},
     "min_cluster_rows 9 < [policy.dbscan] cluster_rows_min 10"),
]


def test_every_limit_has_a_refusal_case() -> None:
    covered = {(kind, limit) for kind, limit, *_ in REFUSALS}
    assert covered == {(k, name) for k, job in job_kinds().items() for name in job.limits}


@pytest.mark.parametrize("kind,limit,value,params,reason", REFUSALS)
async def test_each_limit_refuses_a_peers_proposal_naming_itself(tmp_path: Path, kind: str, limit: str,
                                                                  value: int, params: dict, reason: str) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, with_limit(kind, limit, value)), transport, NAMES,
                               job_kinds(), tg.create_task)
        registry.on_message(ALICE, "job-1", proposal(ALICE, "job-1", kind, params))
        await settle()
    assert [(dst, msg.reason) for dst, msg in transport.of(m.JobReject)] == [(ALICE, reason)]
    assert transport.of(m.JobAccept) == []
    assert registry.show("job-1")["error"] == f"site-me: {reason}"


@pytest.mark.parametrize("kind,limit,value,params,reason", REFUSALS)
async def test_each_limit_refuses_this_sites_own_proposal(tmp_path: Path, kind: str, limit: str, value: int,
                                                          params: dict, reason: str) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, with_limit(kind, limit, value)), transport, NAMES,
                               job_kinds(), tg.create_task)
        with pytest.raises(JobError) as err:
            registry.propose(kind, params, ["alice", "bob"])
    assert str(err.value) == f"site-me: {reason}"
    assert transport.sent == [] and registry.jobs == {}, "a refused proposal of ours goes nowhere"


@pytest.mark.parametrize("kind,limit,value,params,reason", REFUSALS)
def test_a_value_at_the_limit_passes(kind: str, limit: str, value: int, params: dict, reason: str) -> None:
    job = job_kinds()[kind]
    limits = {limit: value}
    asked = job.check_params(params)
    with pytest.raises(JobError):
        job.check_policy(asked, limits)
    at = {**params}
    param = job.limits[limit].param
    if "grid_search" not in params and params.get(param) != 0:    # the "in effect" cases have no boundary here
        at[param] = value
        job.check_policy(job.check_params(at), limits)


def test_boppid_rounds_do_not_count_without_the_baseline() -> None:
    job = job_kinds()["bofrf"]
    job.check_policy(job.check_params({"boppid_rounds": 500}), {"boppid_rounds_max": 10})


async def test_proposers_refuses_a_peer_not_listed_and_accepts_one_listed(tmp_path: Path) -> None:
    transport = FakeTransport()
    policy = dataclasses.replace(cfg.Policy(), proposers=("bob",))
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, policy), transport, NAMES, job_kinds(), tg.create_task)
        registry.on_message(ALICE, "from-alice", proposal(ALICE, "from-alice", "sumcheck", {}))
        registry.on_message(BOB, "from-bob", proposal(BOB, "from-bob", "sumcheck", {}))
        await settle()
        registry.jobs["from-bob"].task.cancel()      # accepted: it now waits for a start that never comes
    reason = "proposer 'alice' is not in this site's [policy] proposers"
    assert [(dst, msg.reason) for dst, msg in transport.of(m.JobReject)] == [(ALICE, reason)]
    assert [dst for dst, _ in transport.of(m.JobAccept)] == [BOB]


def small_csv(path: Path, rows: int) -> cfg.DataSection:
    lines = ["x,y,label"] + [f"{i},{i * i % 7},{'yes' if i % 2 else 'no'}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return cfg.DataSection(csv=str(path), label="label", positive="yes")


@pytest.mark.parametrize("rows,refused", [(9, True), (10, False)])
async def test_rows_min_refuses_without_telling_the_row_count(tmp_path: Path, rows: int, refused: bool) -> None:
    transport = FakeTransport()
    policy = dataclasses.replace(cfg.Policy(), rows_min=10)
    config = make_config(tmp_path, policy, small_csv(tmp_path / "data.csv", rows))
    reason = "local data has fewer rows than this site's policy allows"   # no number: an upper bound on its rows
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(config, transport, NAMES, job_kinds(), tg.create_task)
        registry.on_message(ALICE, "peer-job", proposal(ALICE, "peer-job", "stats", {}))
        own = registry.propose("stats", {}, ["alice", "bob"])
        for _ in range(500):      # the CSVs are read in worker threads
            answered = transport.of(m.JobReject) or transport.of(m.JobAccept)
            if answered and (registry.jobs[own].state == "failed" or len(transport.of(m.JobPropose)) == 2):
                break
            await asyncio.sleep(0.01)
        for job in (registry.jobs.get("peer-job"), registry.jobs[own]):
            if job is not None and job.task is not None:
                job.task.cancel()    # an accepted job would wait for a start (or answers) that never come
    if refused:
        assert [(dst, msg.reason) for dst, msg in transport.of(m.JobReject)] == [(ALICE, reason)]
        assert registry.show(own)["error"] == f"site-me: {reason}", "our own proposal: our own rows_min"
        assert transport.of(m.JobPropose) == [], "refused before anyone is asked"
    else:
        assert transport.of(m.JobReject) == [] and [dst for dst, _ in transport.of(m.JobAccept)] == [ALICE]
        assert {dst for dst, _ in transport.of(m.JobPropose)} == {ALICE, BOB}


def test_a_star_in_allowed_jobs_means_every_kind_and_stands_alone(two_sites: tuple[Path, Path]) -> None:
    a, _ = two_sites
    _replace(a, f"allowed_jobs = {json.dumps(list(KIND_NAMES))}", 'allowed_jobs = ["*"]')
    assert all(load_config(a).policy.allows(kind) for kind in KIND_NAMES)
    _replace(a, 'allowed_jobs = ["*"]', 'allowed_jobs = ["*", "stats"]')
    with pytest.raises(ConfigError) as err:
        load_config(a)
    assert err.value.key == "policy.allowed_jobs" and "write it alone" in err.value.problem
