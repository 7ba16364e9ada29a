"""A member's key in hostile hands, against real daemons (issue "Hostile members"): frames that
respect every wire limit but would make the decoder build millions of objects, and a
property-based stream of random job, membership and election messages. The daemon keeps serving,
keeps its peers alive, and honest sites end every job alike."""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpeer.app.harness.federation import Harness
from fedpeer.core.election import raft as el
from fedpeer.core.membership import swim as mb
from fedpeer.identity import Identity, load_key_file
from fedpeer.jobs import messages as m
from fedpeer.net.transport import PATH
from fedpeer.protocols import epochs as ep
from fedpeer.protocols.securesum.wire import SumChange, SumListAsk
from fedpeer.testing import frames
from tests.integration.conftest import ml_loaded, rss_kib

pytestmark = pytest.mark.integration


async def _post(s: aiohttp.ClientSession, port: int, body: bytes) -> tuple[int, str]:
    async with s.post(f"http://127.0.0.1:{port}{PATH}", data=body) as resp:
        return resp.status, await resp.text()


async def _federation_with_mallory(make_federation) -> tuple[Harness, Identity, bytes]:
    """site-1 and site-2 run; site-3's key (allow-listed everywhere) is the attacker's."""
    h: Harness = make_federation(3, start=False)
    h.start(0)
    h.start(1)
    await h.wait_all_alive(timeout_s=30, among=[0, 1])
    mallory = load_key_file(h.sites[2].config.node.key_file)
    return h, mallory, load_key_file(h.sites[0].config.node.key_file).public_key


def _breast_cancer_sites(make_federation, tmp_path, started: tuple[int, ...]) -> Harness:
    """Three sites holding stratified thirds of breast cancer; `started` of them running."""
    from fedpeer.app.harness.federation import split_csv
    from tests.integration.test_jobs import _attach_data, breast_cancer_csv

    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=3, out_dir=tmp_path / "parts")
    h: Harness = make_federation(3, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    for i in started:
        h.start(i)
    return h


async def test_amplification_frames_are_refused_without_building_millions_of_objects(make_federation) -> None:
    """24 arrays of 2^20 empty arrays in a 24 MiB frame (every length and depth limit holds): once
    1,877 MiB and 22 s with the GIL held, so peers marked the site dead. Now: refused after
    wire.DECODED_ITEMS_MAX items; 8 such frames at once leave the site alive and small."""
    h, mallory, bob = await _federation_with_mallory(make_federation)
    target = h.sites[0]
    inner = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * (1 << 20)
    plaintext = b"\xdc" + (24).to_bytes(2, "big") + inner * 24
    forger = await frames.connected(mallory, h, [0])
    bombs = [forger.seal_raw(bob, frames.plain(plaintext)) for _ in range(8)]
    ml_loaded(target)
    rss_before = rss_kib(target.process.pid)
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        answers = await asyncio.gather(*(_post(s, target.port, b) for b in bombs))
    elapsed = time.monotonic() - started
    assert answers == [(400, "decode")] * 8, answers
    growth_mib = (rss_kib(target.process.pid) - rss_before) / 1024
    assert growth_mib < 300, f"RSS grew {growth_mib:.0f} MiB"
    assert elapsed < 20, f"{elapsed:.1f} s to refuse 8 frames"
    doc = await h.status(0)
    assert doc["rejected"]["decode"] == 8
    assert next(p for p in (await h.status(1))["peers"] if p["name"] == target.name)["state"] == "alive"


# -- random messages from an authenticated member -------------------------------------------------

KEYS = st.sampled_from(["site-1", "site-2", "mallory", "stranger"])
TERMS = st.one_of(st.integers(0, 50), st.sampled_from([2**62, 2**63 - 1]))
SMALL = st.integers(0, 2**63 - 1)


RECENT_JOBS = 3   # the honest jobs a forged message may name: the last three proposed


FORGED_ROUNDS = 40   # rounds whose reduce-map tags the no-owner test forges

# the honest stats jobs' sums announce re-runs under these tags (securesum/core.py restart_tag)
SUM_RESTART_TAGS = st.sampled_from(["stats/moments/ss-ring/restart", "stats/spread/ss-ring/restart", "x"])


def _strategies(keys: dict[str, bytes], jobs: list[str]) -> st.SearchStrategy:
    """`jobs` grows between examples: a recent one is drawn as an index into it (the same choices
    whatever its length, as Hypothesis requires of a strategy), not sampled from a copy of it."""
    key = KEYS.map(keys.__getitem__)
    recent = st.integers(0, RECENT_JOBS - 1).map(lambda i: jobs[-1 - min(i, len(jobs) - 1)])
    job_id = st.one_of(recent, st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True))
    update = st.builds(mb.Update, node=key, state=st.sampled_from(list(mb.MemberState)), incarnation=SMALL,
                       address=st.sampled_from(["127.0.0.1:9", "127.0.0.1:1", "10.0.0.1:7620"]))
    updates = st.lists(update, max_size=8).map(tuple)
    address = st.just("127.0.0.1:9")
    members = st.lists(key, min_size=1, max_size=4, unique=True).map(sorted)
    params = st.dictionaries(st.sampled_from(["bins", "secure_sum", "rounds", "x"]),
                             st.one_of(st.integers(-5, 10**9), st.text(max_size=8)), max_size=3)
    return st.one_of(
        st.builds(mb.Ping, probe_id=SMALL, incarnation=SMALL, address=address, updates=updates),
        st.builds(mb.Ack, probe_id=SMALL, incarnation=SMALL, address=address, updates=updates),
        st.builds(mb.PingReq, probe_id=SMALL, target=key, updates=updates),
        st.builds(el.PreVote, term=TERMS, commit_term=TERMS, commit_index=TERMS),
        st.builds(el.RequestVote, term=TERMS, commit_term=TERMS, commit_index=TERMS),
        st.builds(el.Heartbeat, term=TERMS, commit_term=TERMS, commit_index=TERMS),
        st.builds(m.JobPropose, job_id=job_id, kind=st.sampled_from(["stats", "sumcheck", "nope"]),
                  params=params, members=members, created_ms=st.integers(0, 2**40)),
        st.builds(m.JobAccept, job_id=job_id, fingerprint=st.binary(max_size=32),
                  features=st.lists(st.text(max_size=5), max_size=3)),
        st.builds(m.JobReject, job_id=job_id, reason=st.text(max_size=20)),
        st.builds(m.JobStart, job_id=job_id, members=members),
        st.builds(m.JobAbort, job_id=job_id, site=key, reason=st.text(max_size=20)),
        # the survivors' views of a lost member, inside a running job (fedpeer/protocols/epochs.py)
        st.builds(ep.EpochView, tag=st.sampled_from(["view", "e0/view", "x"]),
                  lost=st.lists(key, max_size=4).map(tuple)),
        st.builds(ep.EpochDone, tag=st.sampled_from(["e0/end", "e1-ab/end", "x"])),
        # a restarted member's request to rejoin, a refusal, the state so far (epochs.py, "Rejoins")
        st.builds(ep.RejoinAsk, tag=st.sampled_from(["xgbh/rejoin", "x"])),
        st.builds(ep.RejoinRefused, tag=st.sampled_from(["xgbh/rejoin", "x"]), reason=st.text(max_size=20)),
        st.builds(ep.RejoinState, tag=st.sampled_from(["xgbh/e2-ab/state", "x"]), digest=st.binary(min_size=32,
                  max_size=32), state=st.binary(max_size=64)),
        # a compact secure sum's announcement of who is dropped, and a member's ask for the whole list
        st.builds(SumChange, tag=SUM_RESTART_TAGS, attempt=st.integers(-1, 20), base=st.binary(max_size=40),
                  dropped=st.lists(st.integers(-2, 200), max_size=4).map(tuple),
                  order=st.lists(st.integers(-2, 200), max_size=4).map(tuple), reason=st.text(max_size=20)),
        st.builds(SumListAsk, tag=SUM_RESTART_TAGS),
    ).flatmap(lambda msg: st.tuples(st.just(msg), st.one_of(st.just(""), recent), TERMS))


@pytest.mark.timeout(600)
def test_random_member_messages_never_take_a_site_down(make_federation, tmp_path) -> None:
    """Hypothesis drives random membership, election, job-lifecycle, survivors'-view, rejoin and
    sum-announcement messages, sealed with a member's key, at a live daemon while the honest sites
    run stats jobs."""
    h = _breast_cancer_sites(make_federation, tmp_path, (0, 1))
    asyncio.run(h.wait_all_alive(timeout_s=30, among=[0, 1]))
    mallory = load_key_file(h.sites[2].config.node.key_file)
    keys = {"site-1": load_key_file(h.sites[0].config.node.key_file).public_key,
            "site-2": load_key_file(h.sites[1].config.node.key_file).public_key,
            "mallory": mallory.public_key, "stranger": os.urandom(32)}
    sealer = asyncio.run(frames.connected(mallory, h, [0]))
    jobs: list[str] = []

    async def honest_job() -> str:
        await asyncio.sleep(2.0)     # an honest operator's pace (members refill one proposal per 2 s)
        job_id = await h.propose(1, "stats", {"bins": 4})
        jobs.append(job_id)
        return job_id

    async def check_job(job_id: str) -> None:
        records = await h.wait_job(job_id, timeout_s=120, among=[0, 1])
        if records[0] is None:   # refused by site-1 before it kept a record: site-2 must say why
            assert records[1]["state"] == "failed" and "site-1" in records[1]["error"], records
            return
        states = {r["state"] for r in records.values()}
        assert states <= {"done", "failed"}, records
        if states == {"done"}:
            results = [r["result"] for r in records.values()]
            assert results[0] == results[1], "honest sites must hold the same result"
        else:
            assert all(r["error"] for r in records.values() if r["state"] == "failed"), records

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        async def example() -> None:
            job_id = await honest_job()
            batch = data.draw(st.lists(_strategies(keys, jobs), min_size=1, max_size=25))
            async with aiohttp.ClientSession() as s:
                for msg, job, term in batch:
                    frame = sealer.seal(keys["site-1"], msg, job=job, term=min(term, 2**63 - 1))
                    status, _ = await _post(s, h.sites[0].port, frame)
                    assert status in (204, 400), status
            await check_job(job_id)
            started = time.monotonic()
            doc = await h.status(0, timeout_ms=1000)
            assert time.monotonic() - started < 1.0
            assert doc["rejected"].get("internal_error", 0) == 0, doc["rejected"]
            assert next(p for p in doc["peers"] if p["name"] == "site-2")["state"] == "alive"
            assert h.exit_codes()[h.sites[0].name] is None
        asyncio.run(example())

    run()
    assert "Traceback" not in h.sites[0].log_path.read_text()


async def test_a_members_gossip_cannot_evict_a_site(make_federation) -> None:
    """Issue 11 item 2: a member's ping saying `site-2 dead at 2**63-1, address 127.0.0.1:9` once
    evicted site-2 for good. Now, for 8 s of such lies (and suspicions at site-2's real number)
    sent to every site, sites 1 and 3 keep site-2 alive at its real address, site-2's
    incarnation moves by small steps, and no daemon exits."""
    h: Harness = make_federation(4, start=False)
    for i in range(3):
        h.start(i)
    await h.wait_all_alive(timeout_s=30, among=[0, 1, 2])
    keys = [load_key_file(s.config.node.key_file).public_key for s in h.sites]
    sealer = await frames.connected(load_key_file(h.sites[3].config.node.key_file), h, [0, 1, 2])   # site-4: the liar
    victim = h.sites[1]
    seen: set[tuple[str, str]] = set()
    started, probe_id = time.monotonic(), 0
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - started < 8:
            known = next(p["incarnation"] for p in (await h.status(0))["peers"] if p["name"] == victim.name)
            lies = tuple(mb.Update(keys[1], state, inc, "127.0.0.1:9") for state, inc in (
                (mb.MemberState.DEAD, 2**63 - 1), (mb.MemberState.DEAD, known), (mb.MemberState.SUSPECT, known)))
            for i in (0, 2, 1):
                probe_id += 1
                ping = mb.Ping(probe_id=probe_id, incarnation=1, address=h.sites[3].address, updates=lies)
                assert (await _post(s, h.sites[i].port, sealer.seal(keys[i], ping)))[0] == 204
            for i in (0, 2):
                view = next(p for p in (await h.status(i))["peers"] if p["name"] == victim.name)
                seen.add((view["state"], view["address"]))
            await asyncio.sleep(0.05)
    assert seen == {("alive", victim.address)}, seen
    assert (await h.status(1))["node"]["incarnation"] <= 1 + 2 * 9      # refutes at most 2 per second
    assert all(code is None for name, code in h.exit_codes().items() if name != h.sites[3].name)


# -- the reduce-map's messages from a member's key in hostile hands ------------------------------

async def test_forged_reduce_map_messages_leave_a_histogram_job_and_the_site_unharmed(make_federation,
                                                                                      tmp_path) -> None:
    """While site-1 and site-2 run a histogram job (levels by the secure reduce-map), the holder of
    site-3's key, allow-listed but not a member, sends site-1 what the reduce-map carries under the
    job's own tags: results with wrong sizes and refusals, digests that differ, pieces of floats.
    Every frame is refused at the gate or never waited on (the job takes each message from the
    member it expects), the job ends done with one model at both sites, and site-1 keeps serving."""
    import numpy as np

    from fedpeer.protocols.securesum.wire import ArCheck, ArResult, SumChunk

    h = _breast_cancer_sites(make_federation, tmp_path, (0, 1))
    await h.wait_all_alive(timeout_s=30, among=[0, 1])
    mallory = load_key_file(h.sites[2].config.node.key_file)
    site1 = load_key_file(h.sites[0].config.node.key_file).public_key
    forger = await frames.connected(mallory, h, [0])
    rounds = 100     # the forged frames (39 rounds' worth) must all land while the job still runs: a
                     # fresh clone's run ended a 40-round job before the last were posted (unknown_job)
    job_id = await h.propose(1, "xgboost", {"mode": "histogram", "rounds": rounds, "max_depth": 3, "max_bin": 32,
                                            "test_fraction": 0.0, "nthread": 1})     # secure_sum: allreduce
    await h.wait_step(0, job_id, 1, timeout_s=60)     # forge while site-1 grows the trees (tried: at step 5 of 40
                                                      # when the last frame went in)
    forged = []
    for r in range(rounds):
        for d in range(3):
            pre = f"xgbh/e0/r{r}/c0/d{d}/ss-allreduce/a1/"
            forged += [ArResult(f"{pre}r0", np.full(7, 2**63, dtype=np.uint64), ""),
                       ArResult(f"{pre}r1", np.zeros(0, dtype=np.uint64), "x" * 2048),
                       SumChunk(f"{pre}p0/0", np.arange(5, dtype=np.float64))]
        forged.append(ArCheck(f"xgbh/e0/r{r}/c0/check/ss-allreduce/a1/check", [b"\x00" * 32] * 3))
    async with aiohttp.ClientSession() as s:
        for msg in forged:
            status, _ = await _post(s, h.sites[0].port, forger.seal(site1, msg, job=job_id))
            assert status in (204, 400), status
    records = await h.wait_job(job_id, timeout_s=120, among=[0, 1])
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    assert len({r["result"]["model_sha256"] for r in records.values()}) == 1
    doc = await h.status(0, timeout_ms=1000)
    assert doc["rejected"].get("internal_error", 0) == 0, doc["rejected"]
    assert doc["rejected"].get("schema", 0) + doc["rejected"].get("decode", 0) >= 1, doc["rejected"]
    assert next(p for p in doc["peers"] if p["name"] == "site-2")["state"] == "alive"
    assert h.exit_codes()[h.sites[0].name] is None
    assert "Traceback" not in h.sites[0].log_path.read_text()


async def test_a_member_sends_what_no_owner_waits_for_and_the_histogram_job_ends_as_it_would(make_federation,
                                                                                             tmp_path) -> None:
    """All three sites run a histogram job; only one of them owns a block of features in each tree
    (tree_owners: one member in three). A second session under site-3's key, a member's, sends
    site-1 well-formed reduce-map messages no one there waits for: results under the tags of the
    segments site-3 does not own, pieces of the segments site-1 does not own. They are buffered
    within the mailbox's bounds and never taken: the job ends done with one model at all three
    sites and site-1 keeps serving."""
    import numpy as np

    from fedpeer.protocols.securesum.wire import ArResult, SumChunk

    h = _breast_cancer_sites(make_federation, tmp_path, (0, 1, 2))
    await h.wait_all_alive(timeout_s=30)
    ids = [load_key_file(site.config.node.key_file) for site in h.sites]
    order = sorted(i.public_key for i in ids)           # a job's members, in protocol order
    me, them = order.index(ids[0].public_key), order.index(ids[2].public_key)
    forger = await frames.connected(ids[2], h, [0])
    rounds = 100     # the forged frames (39 rounds' worth) must all land while the job still runs: a
                     # fresh clone's run ended a 40-round job before the last were posted (unknown_job)
    job_id = await h.propose(1, "xgboost", {"mode": "histogram", "rounds": rounds, "max_depth": 3, "max_bin": 32,
                                            "test_fraction": 0.0, "nthread": 1})     # secure_sum: allreduce
    await h.wait_step(0, job_id, 1, timeout_s=60)
    forged = []
    for r in range(1, FORGED_ROUNDS):
        for d in range(3):
            pre = f"xgbh/e0/r{r}/c0/d{d}/ss-allreduce/a1/"
            forged += [ArResult(f"{pre}r{k}", np.full(10, 7, dtype=np.uint64), "") for k in range(3) if k != them]
            forged += [SumChunk(f"{pre}p{k}/0", np.arange(5, dtype=np.uint64)) for k in range(3) if k != me]
    async with aiohttp.ClientSession() as s:
        for msg in forged:
            status, _ = await _post(s, h.sites[0].port, forger.seal(ids[0].public_key, msg, job=job_id))
            assert status == 204, status
    during = await h.job(0, job_id)
    assert during is not None and during["state"] == "running", during
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    assert len({r["result"]["model_sha256"] for r in records.values()}) == 1
    doc = await h.status(0, timeout_ms=1000)
    assert doc["rejected"].get("internal_error", 0) == 0, doc["rejected"]
    assert all(p["state"] == "alive" for p in doc["peers"])
    assert all(code is None for code in h.exit_codes().values())
    assert "Traceback" not in h.sites[0].log_path.read_text()


# -- bagging replies to the leader from a member's key in hostile hands --------------------------

async def test_forged_bagging_replies_leave_the_leader_serving_and_the_models_alike(make_federation, tmp_path) -> None:
    """Three sites run a bagging job. A second session under a member's key sends the elected leader
    replies under the very tags it waits on from that member: commit acknowledgements offering
    trees for the next round (not JSON, a stump with leaves of -1000, all for a model the leader
    did not commit) and round replies carrying such trees. The leader keeps offered trees only
    for the commit point it made (lead.py `offers_in`) and checks every trees document it takes;
    the forged frames cost that member its trees of the rounds they were taken in. The job ends done with one
    model at all three sites, and the leader keeps serving with its peers alive."""
    from fedpeer.kinds.xgboost.messages import Reply, _reply_tag
    from tests.sim.test_xgboost_sim import poisoned_doc

    h = _breast_cancer_sites(make_federation, tmp_path, (0, 1, 2))
    await h.wait_all_alive(timeout_s=30)
    ids = [load_key_file(site.config.node.key_file) for site in h.sites]
    doc = await h.status(0)
    while doc["leader"] is None:
        await asyncio.sleep(0.2)
        doc = await h.status(0)
    leader = next(i for i, site in enumerate(h.sites) if site.name == doc["leader"])
    member = (leader + 1) % 3
    forger = await frames.connected(ids[member], h, [leader])
    rounds = 30
    job_id = await h.propose(leader, "xgboost", {"mode": "bagging", "rounds": rounds, "max_depth": 3,
                                                 "nthread": 1, "test_fraction": 0.0})
    await h.wait_step(leader, job_id, 1, timeout_s=60)
    term = (await h.status(leader))["term"]
    forged = []
    for r in range(1, rounds + 1):
        for op, trees in (("commit", b"{not json"), ("commit", poisoned_doc()), ("round", poisoned_doc())):
            forged.append(Reply(tag=_reply_tag(term, op, r), commit_term=term, commit_round=r, commit_sha="0" * 64,
                                trees=trees, model=b"", history=b"", error=""))
    async with aiohttp.ClientSession() as s:
        for msg in forged:
            status, _ = await _post(s, h.sites[leader].port, forger.seal(ids[leader].public_key, msg, job=job_id))
            assert status in (204, 400), status
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    refused = [e for e in records[leader]["result"]["history"] if "trees refused" in str(e.get("excluded"))]
    assert refused, "no forged reply reached the leader's job"      # (taken as that member's trees of a round)
    assert len({r["result"]["model_sha256"] for r in records.values()}) == 1
    doc = await h.status(leader, timeout_ms=1000)
    assert doc["rejected"].get("internal_error", 0) == 0, doc["rejected"]
    assert all(p["state"] == "alive" for p in doc["peers"])
    assert all(code is None for code in h.exit_codes().values())
    assert "Traceback" not in h.sites[leader].log_path.read_text()
