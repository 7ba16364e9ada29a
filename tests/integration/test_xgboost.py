"""Federated XGBoost between real daemons: the elected leader runs the rounds; kill -9 it in the
middle of a round and the survivors elect another, resume from the last committed round and end
with byte-identical models, which xgboost loads and `fedpeer predict` scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpeer.app.harness.federation import kill_leader_at_round, split_csv
from fedpeer.ml.xgb import boosting
from fedpeer.testing import frames
from tests.integration.conftest import predict_scores
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration
PARAMS = {"mode": "bagging", "rounds": 6, "max_depth": 3, "nthread": 1, "eta": 0.3, "secure_sum": "ring"}


async def test_leader_killed_mid_round_survivors_finish_with_identical_models(make_federation, tmp_path: Path):
    full = breast_cancer_csv(tmp_path / "bc.csv")
    train, test = split_csv(full, "diagnosis", 2, "0.8,0.2", seed=3, out_dir=tmp_path / "holdout")
    parts = split_csv(train, "diagnosis", 4, "stratified", seed=3, out_dir=tmp_path / "parts")
    h = make_federation(4, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant", test_csv=str(test))
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "xgboost", PARAMS)
    failover = await kill_leader_at_round(h, job_id, 3, timeout_s=120)
    killed = next(i for i, s in enumerate(h.sites) if s.name == failover["killed"])
    survivors = [i for i in range(4) if i != killed]
    records = await h.wait_job(job_id, timeout_s=180, among=survivors)

    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    results = [r["result"] for r in records.values()]
    shas = {r["model_sha256"] for r in results}
    assert len(shas) == 1 and all(r["rounds"] == 6 for r in results), (shas, [r["rounds"] for r in results])
    # the kill lands in round 3 (4 if round 3 committed between the harness's polls: rounds are fast)
    assert failover["at_round"] in (3, 4) and failover["new_leader"] != failover["killed"]
    first = results[0]
    # history: every round once; the rounds from the kill on were led by the new leader
    assert [h_["round"] for h_ in first["history"]] == list(range(1, 7))
    assert {h_["leader"] for h_ in first["history"][failover["at_round"] - 1:]} == {failover["new_leader"]}
    assert all(entry["auc"] > 0.9 for entry in first["history"] if "auc" in entry)
    assert first["auc_source"] == "[data] test_csv" and first["auc"] > 0.95

    # the stored model is a normal xgboost model; its bytes are what the SHA-256 names
    model_path = Path(first["model_file"])
    model = model_path.read_bytes()
    assert boosting.model_sha256(model) == first["model_sha256"]
    import xgboost as xgb
    booster = xgb.Booster()
    booster.load_model(str(model_path))
    from fedpeer.data.dataset import DataSpec, load_csv
    rows = load_csv(DataSpec(csv=test, label="diagnosis", positive="malignant"))
    want = booster.predict(xgb.DMatrix(rows.X))

    # fedpeer predict on a survivor gives xgboost's probabilities
    i = survivors[0]
    got = predict_scores(h.sites[i].config_path, job_id, test, tmp_path / "scores.csv")
    assert np.allclose(got, want, rtol=0, atol=1e-6) and len(got) == len(rows.y)

    # `fedpeer job show` names the model's SHA-256; the killed leader, restarted, says why it stopped
    r = subprocess.run([sys.executable, "-m", "fedpeer", "job", "show", job_id, "--config",
                        str(h.sites[i].config_path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["result"]["model_sha256"] == first["model_sha256"], r.stderr
    h.start(killed)
    await h.wait_all_alive(timeout_s=30)
    record = await h.job(killed, job_id)
    assert record["state"] == "failed" and "the daemon restarted at phase" in record["error"], record["error"]


def test_harness_runs_xgboost_and_reports_per_site_results(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "fedpeer", "harness", "--sites", "3", "--job", "xgboost",
                        "--data", "builtin:breast_cancer", "--holdout", "0.2", "--rounds", "4",
                        "--num-local-round", "2", "--param", "mode=bagging", "--param", "nthread=1",
                        "--param", "max_depth=3", "--json",
                        "--timeout-s", "180"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["job"]["state"] == "done"
    results = [s["result"] for s in report["sites"]]
    assert len({res["model_sha256"] for res in results}) == 1
    for res in results:
        assert res["rounds"] == 4 and res["trees"] == 4 * 3 * 2 and 0.9 < res["auc"] <= 1.0
        assert len(res["history"]) == 4 and res["auc_source"] == "[data] test_csv"


async def test_when_no_site_can_contribute_every_member_fails_with_the_reason(make_federation, tmp_path: Path):
    """Members of an xgboost job may fail alone; but if no site delivers valid trees (here: a leaf
    bound nothing meets), the leader ends the job everywhere, naming each site's problem."""
    from tests.integration.test_jobs import breast_cancer_federation

    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "stratified", seed=2)
    job_id = await h.propose(1, "xgboost", {**PARAMS, "rounds": 2, "leaf_abs_max": 1e-6})
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"failed"}, [r["state"] for r in records.values()]
    for r in records.values():
        assert "no site delivered valid trees" in r["error"] and "trees refused" in r["error"], r["error"]


async def test_a_members_forged_commit_with_a_high_term_is_refused(make_federation, tmp_path: Path):
    """issue 11, item 3, against real daemons: with a follower's (allow-listed) key, send the others
    `xgb_directive{op: commit, term: 2**62, model: <the real model + one tree with leaf -1000>}`, then
    `finish`, and the same at their current term. Before the fix a follower finished with that model
    and the real leader's directives became stale_term. Now: all members end with one model, free of
    the forged tree, the real leader is not held up, and the followers name the forger."""
    import time

    import aiohttp

    from fedpeer.identity import load_key_file
    from fedpeer.kinds.xgboost import kind as xj
    from fedpeer.net.transport import PATH
    from tests.integration.test_jobs import breast_cancer_federation
    from tests.sim.test_xgboost_sim import poisoned_doc

    h, full, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "stratified", seed=4)
    rounds = 8
    job_id = await h.propose(0, "xgboost", {**PARAMS, "rounds": rounds})
    real = await _committed_model(h, 0, job_id, at_least=1)     # (later rounds: stored at most once a second)
    info = boosting.model_info(real)
    forged = boosting.append_round(real, [poisoned_doc()], info.base_score[0], info.num_feature, 0,
                                   "binary:logistic")
    sha = boosting.model_sha256(forged)
    leader = (await h.status(0))["leader"]
    forger = next(i for i in (2, 1, 0) if h.sites[i].name != leader)     # a member's key, not the leader's
    targets = [i for i in range(3) if i != forger]
    mallory = await frames.connected(load_key_file(h.sites[forger].config.node.key_file), h, targets)
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        for i in targets:
            status = await h.status(i)
            dst = load_key_file(h.sites[i].config.node.key_file).public_key
            for term in (2**62, status["term"]):
                for msg in (xj._directive(term, "commit", rounds, sha=sha, model=forged, commit_term=term),
                            xj._directive(term, "finish", rounds, sha=sha)):
                    frame = mallory.seal(dst, msg, job=job_id, term=term)
                    async with session.post(f"http://127.0.0.1:{h.sites[i].port}{PATH}", data=frame) as resp:
                        assert resp.status == 204, (resp.status, await resp.text())   # delivered to the job

    records = await h.wait_job(job_id, timeout_s=120)
    assert time.monotonic() - started < 60, "the real leader was held up"
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    results = [r["result"] for r in records.values()]
    assert len({r["model_sha256"] for r in results}) == 1 and sha not in {r["model_sha256"] for r in results}
    assert all(r["rounds"] == rounds for r in results)
    model = Path(results[0]["model_file"]).read_bytes()
    leaves = [abs(v) for t in boosting.model_info(model).trees for v in t.value[t.left < 0]]
    assert max(leaves) < 1000, "the forged tree is in the model"
    refused = [records[i]["result"]["directives_refused"].get(h.sites[forger].name, {}) for i in targets]
    assert sum(r.get("not_leader", 0) for r in refused) >= 1, refused
    scores = predict_scores(h.sites[targets[0]].config_path, job_id, full, tmp_path / "scores.csv")
    assert 0.2 < float(np.mean(scores > 0.5)) < 0.6       # not "every row negative"


async def _committed_model(h, i: int, job_id: str, at_least: int) -> bytes:
    """The model site i committed last, once it has committed round `at_least` (its commit record
    names the round file; the file of an older round is removed when the next one lands: retry)."""
    import asyncio

    from fedpeer.base.store import read_json

    workdir = h.sites[i].config.node.state_dir / "jobs" / job_id
    for _ in range(600):
        commit = read_json(workdir / "xgb-commit.json", None)
        if commit and commit["round"] >= at_least:
            try:
                model = (workdir / commit["model_file"]).read_bytes()
            except FileNotFoundError:
                continue
            if boosting.model_sha256(model) == commit["model_sha256"]:
                return model
        await asyncio.sleep(0.05)
    raise AssertionError(f"site {i} never committed round {at_least} of {job_id}")
