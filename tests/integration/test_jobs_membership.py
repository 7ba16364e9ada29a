"""Jobs between real daemons react to membership (issue 12 item 3): a member killed with kill -9
ends the survivors' waits once membership declares it dead, not four hop timeouts later; a
cancel is `cancelled` on every member; `job show` says what a running job waits for."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fedpeer.daemon import admin
from fedpeer.identity import parse_public_key
from tests.integration.test_jobs import breast_cancer_federation

pytestmark = pytest.mark.integration
HOP_TIMEOUT_MS = 20_000            # the default: four of them were the 80 s the issue measured


async def wait_running(h, i: int, job_id: str, timeout_s: float = 60) -> dict:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        record = await h.job(i, job_id)
        if record is not None and record["state"] == "running":
            return record
        assert record is None or record["state"] not in ("done", "failed", "cancelled"), record
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} not running at site {i} within {timeout_s} s")


async def test_bofrf_member_killed_ends_within_membership_dead_time(make_federation, tmp_path: Path) -> None:
    """The member killed is the secure sums' initiator (the smallest key), killed while it trains
    its forest: the survivors stop waiting for its forest when membership declares it dead, the
    next in ring order runs the sums, and the job is done without it within the dead time plus a
    few seconds (the issue: ~80 s, four hop timeouts)."""
    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "0.34,0.33,0.33", seed=4,
                                             settings={"jobs": {"hop_timeout_ms": HOP_TIMEOUT_MS}})
    keys = [parse_public_key(s.public_key) for s in h.sites]
    victim = min(range(3), key=lambda i: keys[i])
    proposer = (victim + 1) % 3
    survivors = [i for i in range(3) if i != victim]
    job_id = await h.propose(proposer, "bofrf", {"n_estimators": 600, "seed": 2})
    await wait_running(h, victim, job_id)
    while (await h.job(victim, job_id))["phase"] == "starting":   # killed while it trains, not before:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)   # (job records are written by a worker thread: let the phase land on disk)
    h.kill9(victim)
    killed = time.monotonic()
    dead_after_s = await h.wait_peer_state(victim, "dead", timeout_s=60)
    records = await h.wait_job(job_id, timeout_s=120, among=survivors)
    took_s = time.monotonic() - killed
    assert {records[i]["state"] for i in survivors} == {"done"}, [records[i]["error"] for i in survivors]
    assert took_s < dead_after_s + 12, (
        f"survivors ended {took_s:.1f} s after the kill (dead after {dead_after_s:.1f} s)")
    assert took_s < 2 * HOP_TIMEOUT_MS / 1000, took_s
    for i in survivors:
        result = records[i]["result"]
        assert h.sites[victim].name not in result["participants"], result["participants"]
        assert sorted(result["participants"]) == sorted(h.sites[j].name for j in survivors)
    print(f"kill -9 of the initiator: dead after {dead_after_s:.1f} s, survivors done {took_s:.1f} s after the kill")
    # the killed site, restarted, says which phase its interrupted job was in (issue 12: always `starting`)
    h.start(victim)
    await h.wait_all_alive(timeout_s=30)
    record = await h.job(victim, job_id)
    assert record["state"] == "failed" and record["phase"] not in ("starting", "failed"), record["phase"]
    assert f"at phase '{record['phase']}'" in record["error"], record["error"]


async def test_a_cancel_is_cancelled_on_every_member_and_show_says_what_it_waits_for(
        make_federation, tmp_path: Path) -> None:
    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "0.34,0.33,0.33", seed=8)
    job_id = await h.propose(0, "xgboost", {"mode": "bagging", "rounds": 10_000, "max_depth": 2, "test_fraction": 0.0})
    for i in range(3):
        await wait_running(h, i, job_id)
    shown = None
    for _ in range(100):     # a member waits for the leader's directive most of the time
        shown = await h.job(1, job_id)
        if shown.get("waiting_for"):
            break
        await asyncio.sleep(0.1)
    assert shown is not None and shown.get("waiting_for"), shown
    assert all(" since " in w and w.endswith(" s") for w in shown["waiting_for"]), shown["waiting_for"]
    await admin.request(h.sites[2].config, "POST", f"/v1/jobs/{job_id}/cancel")
    records = await h.wait_job(job_id, timeout_s=60)
    assert {r["state"] for r in records.values()} == {"cancelled"}, (
        {i: (r["state"], r["error"]) for i, r in records.items()})
    for i, record in records.items():
        assert record["error"] == f"{h.sites[2].name}: cancelled by the operator", (i, record["error"])


async def test_xgboost_member_cut_off_when_the_job_ended_gets_the_final_model_after(
        make_federation, tmp_path: Path) -> None:
    """Issue 12: members cut off at round 3 sat at "round 4 of 20" for minutes after the heal,
    reachable and knowing the leader. Here a member is frozen (SIGSTOP: cut off from everyone)
    in the middle of the rounds; the leader finishes with the majority; once the member runs
    again it asks the leader, takes the final model and ends `done` with the same model."""
    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "0.34,0.33,0.33", seed=9)
    job_id = await h.propose(0, "xgboost", {"mode": "bagging", "rounds": 12, "max_depth": 2, "nthread": 1,
                                             "test_fraction": 0.0})
    leader_name = None
    while leader_name is None:
        leader_name = (await h.status(0))["leader"]
        await asyncio.sleep(0.1)
    cut = next(i for i, s in enumerate(h.sites) if s.name != leader_name)
    others = [i for i in range(3) if i != cut]
    while True:
        record = await h.job(cut, job_id)
        if record is not None and record["progress"]["step"] >= 2:
            break
        assert record is None or record["state"] in ("proposed", "accepted", "running"), record
        await asyncio.sleep(0.05)
    h.pause(cut)
    records = await h.wait_job(job_id, timeout_s=180, among=others)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    sha = {r["result"]["model_sha256"] for r in records.values()}
    assert len(sha) == 1
    h.resume(cut)
    resumed = time.monotonic()
    late = await h.wait_job(job_id, timeout_s=60, among=[cut])
    took_s = time.monotonic() - resumed
    assert late[cut]["state"] == "done", late[cut]["error"]
    assert late[cut]["result"]["model_sha256"] in sha and late[cut]["result"]["rounds"] == 12
    assert len(late[cut]["result"]["history"]) == 12, late[cut]["result"]["history"]
    assert took_s < 30, f"the cut-off member ended {took_s:.1f} s after it could reach the others"
    print(f"cut-off member: done {took_s:.1f} s after the heal")
