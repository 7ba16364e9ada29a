"""The privacy ledger (fedpeer/jobs/privacy.py): refuses an over-budget job with one line, survives a
restart and a kill between writes, charges a failed job, fails closed on a file that lies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from fedpeer.errors import StateError
from fedpeer.jobs.privacy import PrivacyLedger, show

FP = "ab" * 16


def test_an_over_budget_job_is_refused_with_what_is_left(tmp_path):
    ledger = PrivacyLedger(tmp_path, 8.0, 1e-5)
    for i in range(3):
        assert ledger.refusal("site-b", FP, 2.0, 1e-7, f"j{i}") is None
        ledger.reserve(FP, f"j{i}", "stats", 2.0 if i < 2 else 2.7, 1e-7, at_ms=i)
    assert ledger.refusal("site-b", FP, 2.0, 1e-7, "j9") == "site-b: this job needs ε 2; its budget has 1.3 left of 8"
    assert ledger.refusal("site-b", FP, 1.3, 1e-7, "j9") is None
    assert ledger.refusal("site-b", "cd" * 16, 2.0, 1e-7, "j9") is None     # another dataset, its own budget
    assert "δ" in ledger.refusal("site-b", FP, 0.1, 1e-4, "j9")


def test_charges_survive_a_restart_and_a_job_is_never_charged_twice(tmp_path):
    ledger = PrivacyLedger(tmp_path, 8.0, 1e-5)
    ledger.reserve(FP, "j1", "kmeans", 3.0, 1e-6, at_ms=0)
    ledger.settle(FP, "j1", 3.4, 1e-6)     # a retried sum's second release
    ledger.settle(FP, "j1", 1.0, 1e-6)     # never lower
    again = PrivacyLedger(tmp_path, 8.0, 1e-5)
    assert again.spent(FP).epsilon == pytest.approx(3.4)
    assert again.refusal("a", FP, 8.0, 1e-6, "j1") is None      # the same job after a restart
    again.reserve(FP, "j1", "kmeans", 3.0, 1e-6, at_ms=1)
    assert again.spent(FP).jobs == 1
    assert "3.4" in show(again.rows())


def test_a_job_that_fails_stays_charged(tmp_path):
    ledger = PrivacyLedger(tmp_path, 2.0, 1e-5)
    ledger.reserve(FP, "j1", "stats", 1.5, 1e-6, at_ms=0)
    # the job fails after its first sum: nothing settles, nothing refunds
    assert PrivacyLedger(tmp_path, 2.0, 1e-5).refusal("a", FP, 1.0, 1e-6, "j2") is not None


def test_a_kill_9_between_charges_leaves_every_completed_charge(tmp_path):
    script = ("import sys; from fedpeer.jobs.privacy import PrivacyLedger\n"
              "l = PrivacyLedger(sys.argv[1], 1e9, 0.5)\n"
              "for i in range(10**6):\n"
              "    l.reserve('ab', f'j{i}', 'stats', 1.0, 0.0, 0); print(i, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    done = [proc.stdout.readline() for _ in range(20)]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert int(done[-1]) == 19
    assert PrivacyLedger(tmp_path, 1e9, 0.5).spent("ab").jobs >= 20      # every acknowledged charge


def test_a_ledger_that_lies_fails_closed(tmp_path):
    (tmp_path / "privacy.json").write_text(json.dumps({"version": 1, "datasets": {FP: {"j": {"epsilon": -1}}}}))
    with pytest.raises(StateError, match="privacy ledger"):
        PrivacyLedger(tmp_path, 8.0, 1e-5)
    (tmp_path / "privacy.json").write_text("{not json")
    with pytest.raises(StateError, match="unreadable"):
        PrivacyLedger(tmp_path, 8.0, 1e-5)


# ---------------------------------------------------------------------------------------------
# The ledger in the job lifecycle: a member refuses a DP job beyond its budget before any sum, and
# so does the proposing site for its own proposal (every member computes the same cost).

DP_PARAMS = {"dp_epsilon": 2.0, "dp_clip": 10.0}


async def _answer(tmp_path, spent: float, params: dict) -> tuple[list, str]:
    import asyncio
    import dataclasses

    from fedpeer.config import load as cfg
    from fedpeer.jobs import messages as m
    from fedpeer.jobs.lifecycle.registry import JobRegistry
    from fedpeer.kinds.catalog import job_kinds
    from tests.unit.test_policy import ALICE, NAMES, FakeTransport, make_config, proposal, small_csv

    config = make_config(tmp_path, cfg.Policy(), small_csv(tmp_path / "data.csv", 20))
    config = dataclasses.replace(config, privacy=cfg.Privacy(epsilon_budget=8.0, delta_budget=1e-5))
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(config, transport, NAMES, job_kinds(), tg.create_task)
        fp = None
        if spent:
            from fedpeer.data.dataset import DataSpec, load_csv
            fp = load_csv(DataSpec(csv=tmp_path / "data.csv", label="label", positive="yes")).fingerprint.hex()
            registry.privacy.reserve(fp, "earlier", "stats", spent, 1e-7, at_ms=0)
        registry.on_message(ALICE, "peer-job", proposal(ALICE, "peer-job", "stats", params))
        own = registry.propose("stats", params, ["alice", "bob"])
        for _ in range(500):
            if (transport.of(m.JobReject) or transport.of(m.JobAccept)) and (
                    registry.jobs[own].state == "failed" or len(transport.of(m.JobPropose)) == 2):
                break
            await asyncio.sleep(0.01)
        for job in (registry.jobs.get("peer-job"), registry.jobs[own]):
            if job is not None and job.task is not None:
                job.task.cancel()
    return [msg.reason for _, msg in transport.of(m.JobReject)], registry.show(own).get("error") or ""


async def test_a_member_refuses_a_dp_job_beyond_its_budget_and_so_does_its_own_proposal(tmp_path):
    rejects, own_error = await _answer(tmp_path, 6.7, DP_PARAMS)
    line = "site-me: this job needs ε 2; its budget has 1.3 left of 8"
    assert rejects == [line]
    assert own_error == f"site-me: {line}"


async def test_a_dp_job_within_the_budget_is_accepted(tmp_path):
    rejects, own_error = await _answer(tmp_path, 5.0, DP_PARAMS)
    assert rejects == [] and "budget" not in own_error     # (cancelled while it waits for the members)


def _runner(tmp_path, budget: float):
    from types import SimpleNamespace

    from fedpeer.jobs.lifecycle.runner import JobRunner

    ledger = PrivacyLedger(tmp_path, budget, 1e-5)
    registry = SimpleNamespace(privacy=ledger, transport=SimpleNamespace(me=b"me", now_ms=lambda: 5),
                               config=SimpleNamespace(node=SimpleNamespace(name="site-me"),
                                                      privacy=SimpleNamespace(epsilon_budget=budget,
                                                                              delta_budget=1e-5)))
    runner = JobRunner(registry)
    from fedpeer.jobs.lifecycle.admission import Admission
    registry.admission = Admission(registry)
    return runner, ledger


def _record(job_id: str, eps: float):
    from fedpeer.jobs.records import JobRecord

    return JobRecord(id=job_id, kind="stats", params={"dp_epsilon": eps, "dp_clip": 1.0}, proposer=b"p",
                     members=(b"me", b"p"), created_ms=0, data_fingerprint=FP)


def test_a_job_is_charged_when_it_starts_so_its_failure_refunds_nothing(tmp_path):
    runner, _ = _runner(tmp_path, 8.0)
    runner._charge(_record("j1", 3.0))          # the job starts; then it fails: nothing settles
    assert PrivacyLedger(tmp_path, 8.0, 1e-5).spent(FP).epsilon == 3.0   # as a restart finds it
    runner._settle(_record("j1", 3.0), {"privacy": {"epsilon": 3.2, "delta": 1e-12}})
    assert PrivacyLedger(tmp_path, 8.0, 1e-5).spent(FP).epsilon == pytest.approx(3.2)


def test_a_job_accepted_before_another_spent_the_budget_is_refused_at_its_start(tmp_path):
    from fedpeer.jobs.lifecycle.runner import SiteFailure

    runner, ledger = _runner(tmp_path, 4.0)
    runner._charge(_record("j1", 3.0))
    with pytest.raises(SiteFailure, match="this job needs ε 2; its budget has 1 left of 4"):
        runner._charge(_record("j2", 2.0))
    assert ledger.spent(FP).jobs == 1
