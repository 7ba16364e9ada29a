"""Versions as ranges, features as capabilities: which build this is, the capability registry,
the SiteInfo message and its limits, the protocol a pair speaks, the book of peers' versions, and
the proposer's refusal line (tests/integration/test_versions_mixed.py runs 0.1.0 beside this build)."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import pytest

from fedpeer.base import build
from fedpeer.errors import JobError, RemoteProtocolError
from fedpeer.jobs import capabilities as caps
from fedpeer.jobs import messages as m
from fedpeer.jobs.kind import JobKind, Param
from fedpeer.jobs.lifecycle.registry import JobRegistry
from fedpeer.jobs.records import JobRecord
from fedpeer.jobs.params import SECURE_SUM
from fedpeer.jobs.versions import (ASSUMED, CAPS_MAX, KIND, REFUSED, TOLD, PeerInfo, PeerVersions, SiteInfo,
                                   negotiate, refusal_line)
from fedpeer.kinds import releases
from fedpeer.kinds.catalog import job_kinds
from fedpeer.wire import frame as wire
from tests.unit.test_job_registry import ALICE, BOB, ME, NAMES, FakeTransport, make_config, sent_of, settle

ROOT = Path(__file__).resolve().parents[2]


# -- which build ---------------------------------------------------------------------------------

def test_the_version_is_pyprojects_and_the_commit_is_this_checkouts() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["version"] == build.SOFTWARE_VERSION == "0.2.0"
    assert build.commit() == build.COMMIT_UNKNOWN or len(build.commit()) == build.COMMIT_SHOWN_CHARS
    assert build.describe() == f"0.2.0 (commit {build.commit()})"


def test_the_commit_is_read_from_gits_files(tmp_path: Path) -> None:
    sha, other = "a" * 40, "b" * 40
    repo = tmp_path / "repo"
    (repo / ".git" / "refs" / "heads").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".git" / "refs" / "heads" / "main").write_text(sha + "\n")
    assert build._commit_of(repo) == sha
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/packed\n")
    (repo / ".git" / "packed-refs").write_text(f"# pack-refs\n{other} refs/heads/packed\n")
    assert build._commit_of(repo) == other
    # a worktree: .git is a file naming its git dir, whose refs live in the common dir
    wt_git = repo / ".git" / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text("ref: refs/heads/main\n")
    (wt_git / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {wt_git}\n")
    assert build._commit_of(tmp_path / "wt") == sha
    (wt_git / "HEAD").write_text(other + "\n")     # detached
    assert build._commit_of(tmp_path / "wt") == other
    assert build._commit_of(tmp_path / "nothing") is None       # git archive, sdist: no commit to tell


# -- the capability registry ---------------------------------------------------------------------

def test_this_build_runs_exactly_the_baseline_plus_its_own_formats() -> None:
    provided = caps.provided(job_kinds().values())
    assert releases.BASELINE_CAPABILITIES <= provided
    added = {p.capability for kind in job_kinds().values() for p in kind.params.values() if p.capability}
    added |= {cap for kind in job_kinds().values() for name, p in kind.params.items()    # choices added since
              for value, cap in p.value_capabilities
              if value not in (releases.PARAMS_0_1_0.get(kind.name, {}).get(name) or ())}
    assert provided - caps.BUILD_FORMATS - added == releases.BASELINE_CAPABILITIES, "a capability 0.1.0 lacks?"


def test_every_parameter_or_choice_added_since_0_1_0_declares_a_capability() -> None:
    """0.1.0 refuses a proposal with a parameter it does not know (exact keys), or a choice it
    does not have: each must be a capability, so it is never sent to a member without it."""
    kinds = job_kinds()
    assert set(releases.PARAMS_0_1_0) <= set(kinds), "a kind 0.1.0 ran is gone"
    for name, kind in kinds.items():
        old = releases.PARAMS_0_1_0.get(name)
        if old is None:
            assert caps.of_kind(kind) not in releases.BASELINE_CAPABILITIES
            continue
        for pname, param in kind.params.items():
            if pname not in old:
                assert param.capability, f"{name}.{pname} is new since 0.1.0: declare its capability"
                continue
            with_caps = {v for v, _ in param.value_capabilities}
            for choice in param.choices or ():
                assert choice in (old[pname] or ()) or choice in with_caps, f"{name}.{pname}={choice!r}"


async def _run(ch: object, params: object, ctx: object) -> dict:
    return {}


NEW = JobKind(name="newkind", help="", params={"secure_sum": SECURE_SUM}, run=_run, needs_data=False)
OLD = JobKind(name="oldkind", help="", run=_run, needs_data=False, params={
    "secure_sum": SECURE_SUM,
    "fast": Param(bool, False, "a format only 0.2.0 speaks", capability="fmt-fast"),
    "depth": Param(int, 3, "", low=1, high=9)})


def test_what_a_job_needs_and_what_its_proposal_carries() -> None:
    assert caps.needed(OLD, {"secure_sum": "ring", "fast": False, "depth": 3}) == ["kind-oldkind", "secsum-ring"]
    assert caps.needed(OLD, {"secure_sum": "ring", "fast": True, "depth": 3}) == [
        "kind-oldkind", "secsum-ring", "fmt-fast"]
    old_site = frozenset({"kind-oldkind", "secsum-ring"})
    new_site = old_site | {"fmt-fast"}
    assert caps.lacking(OLD, {"secure_sum": "pairwise", "fast": False, "depth": 3}, old_site) == ["secsum-pairwise"]
    params = {"secure_sum": "ring", "fast": False, "depth": 3}
    # at its default, a parameter some member does not know is left out (it fills in the default)
    assert caps.for_members(OLD, params, [old_site, new_site]) == {"secure_sum": "ring", "depth": 3}
    assert caps.for_members(OLD, params, [new_site]) == params
    assert "kind-newkind" in caps.provided([NEW, OLD]) and "fmt-fast" in caps.provided([OLD])


# -- SiteInfo, its limits, negotiation ------------------------------------------------------------

def _body(**changes: object) -> dict:
    return {"proto_min": 2, "proto_max": 3, "software": "0.2.0", "commit": "be4d39cf3944",
            "caps": ["kind-stats", "secsum-ring"], "reply": True, **changes}


def _open(body: dict) -> SiteInfo:
    """What the gate does with a site_info body: its field validators, then the message's own checks."""
    spec = wire._BY_KIND[KIND]
    checked = spec.schema(body, KIND)
    try:
        return spec.from_body(checked)
    except ValueError as exc:
        raise RemoteProtocolError("schema", str(exc)) from None


def test_site_info_round_trips_through_the_wire() -> None:
    msg = _open(_body())
    assert msg == SiteInfo(2, 3, "0.2.0", "be4d39cf3944", ["kind-stats", "secsum-ring"], True)
    assert wire.pack(msg)   # registered: the daemon can send it


@pytest.mark.parametrize("body", [
    _body(caps=[f"cap-{i}" for i in range(CAPS_MAX + 1)]),
    _body(caps=["x" * 65]),
    _body(caps=["Upper"]),
    _body(caps=["a", "a"]),
    _body(software="0.2.0" + "x" * 40),
    _body(software="0.2.0; rm -rf /"),
    _body(commit="not hex"),
    _body(proto_min=4, proto_max=3),
    _body(proto_max=2**40),
    _body(extra=1),
    {k: v for k, v in _body().items() if k != "reply"},
    _body(caps="kind-stats"),
])
def test_a_malformed_site_info_is_refused_as_schema(body: dict) -> None:
    with pytest.raises(RemoteProtocolError) as refused:
        _open(body)
    assert refused.value.reason == "schema"


def test_the_envelope_accepts_the_range_and_sends_two() -> None:
    assert wire.PROTOCOL_MIN <= wire.PROTOCOL_VERSION == 2 <= wire.PROTOCOL_MAX
    env = {"v": 2, "kind": "ping", "job": "", "term": 0, "body": {}}
    assert wire._ENVELOPE(env, "envelope")["v"] == 2
    with pytest.raises(RemoteProtocolError):
        wire._ENVELOPE({**env, "v": wire.PROTOCOL_MAX + 1}, "envelope")


def test_a_pair_speaks_the_highest_version_both_accept() -> None:
    assert negotiate((2, 2), (2, 2)) == 2
    assert negotiate((2, 4), (2, 3)) == 3
    assert negotiate((3, 5), (2, 4)) == 4
    assert negotiate((2, 2), (3, 4)) is None


# -- the book and the refusal line -----------------------------------------------------------------

OWN = PeerInfo("0.2.0", "0123456789ab", (2, 2), frozenset({"kind-oldkind", "kind-newkind", "secsum-ring",
                                                               "secsum-pairwise", "secsum-allreduce", "fmt-fast"}))
BASE = PeerInfo("0.1.0", "be4d39cf3944", (2, 2), frozenset({"kind-oldkind", "secsum-ring", "secsum-pairwise",
                                                                "secsum-allreduce"}))


def test_the_refusal_line_names_the_site_both_versions_and_the_capability() -> None:
    line = refusal_line("site-c", BASE, "secsum-allreduce-3leg", "site-a", OWN)
    assert line == ("site-c runs fedpeer 0.1.0 (protocol 2–2) without 'secsum-allreduce-3leg' "
                    "(site-a runs fedpeer 0.2.0 (protocol 2–2)); upgrade site-c or leave it out")
    assumed = refusal_line("site-c", PeerInfo("0.1.0", "be4d39cf3944", (2, 2), BASE.caps, ASSUMED), "x",
                           "site-a", OWN)
    assert "it has not said what it runs" in assumed and "\n" not in assumed


async def test_the_book_knows_told_refused_and_assumed_peers_and_waits_bounded() -> None:
    book = PeerVersions(OWN, BASE)
    asked: list[bytes] = []
    book.ask = asked.append
    assert book.info(ALICE).how == ASSUMED and book.info(ALICE).software == "0.1.0"
    loop = asyncio.get_running_loop()
    started = loop.time()
    await book.wait_known([ALICE], timeout_ms=50)            # nobody answers: bounded
    assert 0.04 <= loop.time() - started < 1 and asked == [ALICE]
    waiting = asyncio.create_task(book.wait_known([ALICE, BOB], timeout_ms=5_000))
    await asyncio.sleep(0)
    assert book.told(ALICE, OWN.message(reply=False), incarnation=3)
    assert book.refused(BOB, incarnation=1)
    await asyncio.wait_for(waiting, 1)                        # both known: the wait ends at once
    assert book.info(ALICE) == PeerInfo("0.2.0", "0123456789ab", (2, 2), OWN.caps, TOLD)
    assert book.info(BOB).how == REFUSED and book.info(BOB).caps == BASE.caps and book.learnt_at(BOB) == 1
    assert not book.told(ALICE, OWN.message(reply=True), incarnation=3), "nothing new"
    assert book.status_of(BOB) == {"software": "0.1.0", "commit": "be4d39cf3944", "protocol": [2, 2], "speaks": 2,
                                   "known": REFUSED, "capabilities": 4, "missing": ["fmt-fast", "kind-newkind"]}
    book.forget(BOB)
    assert book.known(BOB) is None and book._waiting == {}


# -- the proposer ---------------------------------------------------------------------------------

KINDS = {k.name: k for k in (NEW, OLD)}


def _registry(tmp_path: Path, tg: asyncio.TaskGroup, transport: FakeTransport) -> JobRegistry:
    from dataclasses import replace
    config = make_config(tmp_path)
    config = replace(config, policy=replace(config.policy, allowed_jobs=tuple(KINDS)))
    registry = JobRegistry(config, transport, NAMES, KINDS, tg.create_task)
    registry.versions = PeerVersions(OWN, BASE)
    registry.versions.told(ALICE, OWN.message(reply=False), 1)      # alice runs 0.2.0; bob never said
    return registry


async def test_a_named_member_without_the_capability_is_refused_at_once_before_any_send(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = _registry(tmp_path, tg, transport)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(JobError) as refused:
            await registry.propose_when_known("newkind", {"secure_sum": "ring"}, ["alice", "bob"])
        assert loop.time() - started < 1.0
        await settle()
    assert str(refused.value) == (
        "bob runs fedpeer 0.1.0 (protocol 2–2) (taken as such: it has not said what it runs) without "
        "'kind-newkind' (site-me runs fedpeer 0.2.0 (protocol 2–2)); upgrade bob or leave it out")
    assert transport.sent == [] and registry.jobs == {}, "no member contacted, no record kept"


async def test_unnamed_members_without_it_are_left_out_and_unknown_parameters_not_sent(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = _registry(tmp_path, tg, transport)
        job = registry.propose("newkind", {"secure_sum": "ring"})          # bob (0.1.0) lacks the kind
        await settle()
        assert registry.jobs[job].members == tuple(sorted((ME, ALICE)))
        registry.jobs[job].task.cancel()
        other = registry.propose("oldkind", {"secure_sum": "ring"}, ["alice", "bob"])   # fast at its default
        await settle()
        registry.jobs[other].task.cancel()
        with pytest.raises(JobError, match="bob runs fedpeer 0.1.0 .* without 'fmt-fast'"):
            registry.propose("oldkind", {"secure_sum": "ring", "fast": True}, ["alice", "bob"])
    proposals = {dst: msg.params for dst, msg in sent_of(transport, m.JobPropose) if msg.job_id == other}
    assert proposals == {ALICE: {"secure_sum": "ring", "depth": 3}, BOB: {"secure_sum": "ring", "depth": 3}}
    assert registry.jobs[other].params["fast"] is False, "this site's record keeps every parameter"


def test_status_shows_each_peers_build_and_what_it_lacks() -> None:
    from fedpeer.app.statustext import format_status

    book = PeerVersions(OWN, BASE)
    book.refused(BOB, 1)
    book.told(ALICE, OWN.message(reply=False), 1)
    peer = {"state": "alive", "address": "127.0.0.1:1", "last_seen_s": 0.5, "rtt_ms": 1.0}
    doc = {"node": {"name": "site-me", "address": "127.0.0.1:2", "fingerprint": "ab", "uptime_s": 3,
                    "incarnation": 1, "version": {"software": "0.2.0", "commit": "0123456789ab", "protocol": [2, 2],
                                                  "capabilities": sorted(OWN.caps)}},
           "peers": [{**peer, "name": "alice", "version": book.status_of(ALICE)},
                     {**peer, "name": "bob", "version": book.status_of(BOB)}]}
    text = format_status(doc)
    assert "fedpeer 0.2.0 (0123456789ab, protocol 2-2, 6 capabilities)" in text
    assert "0.2.0 0123456789ab p2-2 6 caps" in text
    assert "0.1.0 be4d39cf3944 p2-2 4 caps (refused SiteInfo)" in text
    assert "  bob lacks: fmt-fast, kind-newkind" in text


def test_new_cluster_defaults_never_reach_a_0_1_0_member_as_its_own_old_default() -> None:
    """kmeans' and gmm's `standardize` default changed (0.1.0: False): 0.1.0 knows the parameter, so
    the proposal always carries it. dbscan's `standardize` and `eps_auto` are new, on by default, and
    0.1.0 acts as if both were off: at the default a 0.1.0 member lacks them and is left out by name;
    at off it takes part and the parameters are left out of what it receives."""
    kinds = job_kinds()
    old = releases.BASELINE_CAPABILITIES
    for name in ("kmeans", "gmm"):    # optional parameters (secure_sum_compact) settled first, as the proposer does
        params = caps.settled(kinds[name], kinds[name].check_params({}), [old])
        assert params["standardize"] is True and kinds[name].params["standardize"].capability is None
        assert caps.for_members(kinds[name], params, [old])["standardize"] is True
        assert caps.lacking(kinds[name], params, old) == []
    dbscan = kinds["dbscan"]
    params = caps.settled(dbscan, dbscan.check_params({}), [old])
    assert caps.lacking(dbscan, params, old) == ["dbscan-standardize", "dbscan-eps-auto"]
    legacy = caps.settled(dbscan, dbscan.check_params({"standardize": False, "eps_auto": False}), [old])
    assert caps.lacking(dbscan, legacy, old) == []
    assert set(caps.for_members(dbscan, legacy, [old])) == set(legacy) - {"standardize", "eps_auto",
                                                                          "secure_sum_compact"}
    new = old | {"dbscan-standardize", "dbscan-eps-auto", "secsum-compact-1"}
    assert caps.for_members(dbscan, params, [new]) == params
    for name in ("kmeans", "gmm"):    # choosing k is new: at 0 (k as given) 0.1.0 members take part
        chosen = caps.settled(kinds[name], kinds[name].check_params({"k_max": 6}), [old])
        assert caps.lacking(kinds[name], chosen, old) == [f"{name}-k-auto"]
        assert "k_max" not in caps.for_members(kinds[name], kinds[name].check_params({}), [old])


def test_a_member_reads_a_left_out_parameter_as_the_proposer_meant_it() -> None:
    """A proposal leaves a parameter with a capability out only at the value a member without it
    acts on: every receiving member fills that value in (dbscan's `standardize` left out is off,
    not this build's default on), so the members of one job run one computation."""
    dbscan = job_kinds()["dbscan"]
    legacy = dbscan.check_params({"standardize": False, "eps_auto": False})
    sent = caps.for_members(dbscan, legacy, [releases.BASELINE_CAPABILITIES])
    assert dbscan.check_params(caps.filled(dbscan, sent)) == legacy
    kmeans = job_kinds()["kmeans"]
    default = kmeans.check_params({})
    assert kmeans.check_params(caps.filled(kmeans, caps.for_members(kmeans, default, [releases.BASELINE_CAPABILITIES]))
                               ) == default


async def test_an_optional_parameter_is_settled_off_with_a_member_without_it_never_leaving_it_out(
        tmp_path: Path) -> None:
    """xgboost's `train_loss` changes the evaluation sum's layout: a member without its capability
    still takes part, and the whole job runs without it (its record says so, no proposal carries
    it, and each member fills in off); with every member able, it stays on and is sent."""
    xgb = job_kinds()["xgboost"]
    assert xgb.params["train_loss"].optional and xgb.check_params({})["train_loss"] is True
    settled = caps.settled(xgb, xgb.check_params({}), [OWN.caps, releases.BASELINE_CAPABILITIES])
    assert settled["train_loss"] is False and caps.lacking(xgb, settled, releases.BASELINE_CAPABILITIES) == []
    assert settled["rejoin"] is False       # likewise rejoins: the job runs, a member lost stays out
    assert caps.lacking(xgb, xgb.check_params({}), releases.BASELINE_CAPABILITIES) == ["xgb-train-loss-1",
                                                                                       "epoch-views-1",
                                                                                       "secsum-compact-1",
                                                                                       "job-rejoin-1"]
    this_build = caps.provided(job_kinds().values())
    assert "job-rejoin-1" in this_build and caps.settled(xgb, xgb.check_params({}), [this_build])["rejoin"] is True
    opt = JobKind(name="oldkind", help="", run=_run, needs_data=False, params={
        "secure_sum": SECURE_SUM, "loss": Param(bool, True, "", capability="fmt-fast", before=False, optional=True)})
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        from dataclasses import replace
        config = make_config(tmp_path)
        registry = JobRegistry(replace(config, policy=replace(config.policy, allowed_jobs=("oldkind",))), transport,
                               NAMES, {"oldkind": opt}, tg.create_task)
        registry.versions = PeerVersions(OWN, BASE)
        registry.versions.told(ALICE, OWN.message(reply=False), 1)      # alice runs 0.2.0; bob never said
        with_bob = registry.propose("oldkind", {"secure_sum": "ring", "loss": True}, ["alice", "bob"])
        without = registry.propose("oldkind", {"secure_sum": "ring"}, ["alice"])
        await settle()
        received = JobRecord(id="oldkind-x", kind="oldkind", params={"secure_sum": "ring"}, proposer=ALICE,
                             members=(ME, ALICE, BOB), created_ms=0)
        assert registry.admission.policy_refusal(received) is None
        assert received.params["loss"] is False, "left out means what a member without it does"
        for job in (with_bob, without):
            registry.jobs[job].task.cancel()
    assert registry.jobs[with_bob].members == tuple(sorted((ME, ALICE, BOB))), "bob is not left out"
    assert registry.jobs[with_bob].params["loss"] is False and registry.jobs[without].params["loss"] is True
    sent = {(msg.job_id, dst): msg.params for dst, msg in sent_of(transport, m.JobPropose)}
    assert sent[(with_bob, ALICE)] == sent[(with_bob, BOB)] == {"secure_sum": "ring"}
    assert caps.filled(opt, sent[(with_bob, ALICE)])["loss"] is False
    assert sent[(without, ALICE)] == {"secure_sum": "ring", "loss": True}


def test_compact_secure_sums_are_settled_off_with_a_member_of_an_older_release() -> None:
    """The secure sum's compact messages (secsum-compact-1) are new shapes: a job with a member
    without them runs the old ones, and nobody is left out for it."""
    this = caps.provided(job_kinds().values())
    for name in ("stats", "sumcheck"):
        kind = job_kinds()[name]
        params = kind.check_params({})
        assert params["secure_sum_compact"] is True
        assert caps.lacking(kind, params, releases.BASELINE_CAPABILITIES) == ["secsum-compact-1"]
        settled = caps.settled(kind, params, [this, releases.BASELINE_CAPABILITIES])
        assert settled["secure_sum_compact"] is False
        assert caps.lacking(kind, settled, releases.BASELINE_CAPABILITIES) == []
        assert caps.settled(kind, params, [this, this])["secure_sum_compact"] is True


def test_sumcheck_runs_the_sparse_ring_only_with_members_that_have_it() -> None:
    sumcheck = job_kinds()["sumcheck"]
    sparse = sumcheck.check_params({"secure_sum": "sparse"})
    assert caps.lacking(sumcheck, sparse, releases.BASELINE_CAPABILITIES) == ["secsum-sparse", "secsum-compact-1"]
    assert "secsum-sparse" in caps.provided(job_kinds().values())
    assert "secsum-sparse" not in caps.needed(sumcheck, sumcheck.check_params({}))
