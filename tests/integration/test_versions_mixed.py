"""Release 0.1.0 (commit be4d39c, built from this repository's history) beside this build, as real
daemons: one federation, each site's version known where it can be, and every kind either done at
every member or refused within 1 s in one line naming the site, both versions and the capability."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness, split_csv
from fedpeer.jobs import capabilities
from fedpeer.kinds import releases
from fedpeer.kinds.catalog import job_kinds
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
OLD_COMMIT = "be4d39c"
OLD = 2                       # the site that runs 0.1.0
REFUSAL_S_MAX = 1.0
# kind -> small parameters (the defaults train for seconds: this checks that they run, not how well)
JOBS = {
    "stats": {"bins": 4},
    "sumcheck": {"entries": 1000},
    "bofrf": {"n_estimators": 4, "max_depth": 3},
    "xgboost": {"rounds": 2, "max_depth": 2},
    "tree": {"max_depth": 2},
    "logreg": {"max_iter": 5},
    "mlp": {"rounds": 2},
    "kmeans": {"k": 2, "n_init": 1, "max_iter": 5},
    "gmm": {"k": 2, "n_init": 1, "max_iter": 5},
    "dbscan": {},
}


def old_release(into: Path) -> Path:
    """`git archive` of 0.1.0's package into `into` (skip when this clone lacks that history)."""
    try:
        found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no git to build release 0.1.0 from: {exc}")
    if found.returncode != 0:
        pytest.skip(f"this clone has no commit {OLD_COMMIT} (shallow?): cannot build release 0.1.0 from it")
    archive = into / "old.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), OLD_COMMIT, "fedpeer"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "release-0.1.0", filter="data")
    return into / "release-0.1.0"


def _versions_known(docs: dict) -> bool:
    new = [i for i in docs if i != OLD]
    return all(docs[i] is not None for i in docs) and all(
        {p["name"]: p["version"]["known"] for p in docs[i]["peers"]}
        == {n: ("refused" if n == f"site-{OLD + 1}" else "told") for n in (p["name"] for p in docs[i]["peers"])}
        for i in new)


async def _propose(h: Harness, at: int, kind: str, params: dict, members: list[str]) -> tuple[str | None, str]:
    """Propose; (job id, "") or (None, the refusal) and how long the refusal took."""
    from fedpeer.daemon import admin
    from fedpeer.errors import FedpeerError
    try:
        doc = await admin.request(h.sites[at].config, "POST", "/v1/jobs",
                                  {"kind": kind, "params": params, "members": members}, timeout_ms=5_000)
        return doc["id"], ""
    except FedpeerError as exc:
        return None, str(exc)


async def test_release_0_1_0_beside_this_build(make_federation, tmp_path: Path) -> None:
    started = time.monotonic()
    old_tree = old_release(tmp_path)
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=3, out_dir=tmp_path / "parts")
    h: Harness = make_federation(3, {"policy": {"allowed_jobs": ["*"]}}, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    h.sites[OLD].env = {**os.environ, "PYTHONPATH": str(old_tree)}
    h.start()
    await h.wait_all_alive(timeout_s=30)
    old_version = subprocess.run([sys.executable, "-m", "fedpeer", "--version"], capture_output=True, text=True,
                                 env=h.sites[OLD].env, cwd=h.sites[OLD].dir).stdout
    # 0.1.0 printed the installed distribution's version (this venv's, 0.2.0 once reinstalled) and no
    # commit; this build prints its own version and commit
    assert old_version.startswith("fedpeer ") and "commit" not in old_version, old_version

    # each new site learns the old one refused SiteInfo (0.1.0) and the other told its version
    await h.wait_until(_versions_known, 15, "each new site knows what every peer runs")
    docs = await h.statuses()
    peer = next(p for p in docs[0]["peers"] if p["name"] == f"site-{OLD + 1}")
    assert peer["version"]["software"] == "0.1.0" and peer["version"]["protocol"] == [2, 2]
    assert peer["version"]["speaks"] == 2 and peer["version"]["missing"] == sorted(
        capabilities.provided(job_kinds().values()) - releases.BASELINE_CAPABILITIES)
    assert "version" not in docs[OLD]["node"], "the old build is what it was"

    names = [s.name for s in h.sites]
    baseline = releases.BASELINE_CAPABILITIES
    for n, (kind, params) in enumerate(JOBS.items()):
        at = (0, OLD, 1)[n % 3]              # proposed by new and old sites in turn
        checked = job_kinds()[kind].check_params(params)      # optional parameters settled as the proposer does
        needs = capabilities.needed(job_kinds()[kind], capabilities.settled(job_kinds()[kind], checked, [baseline]))
        asked = time.monotonic()
        job_id, refusal = await _propose(h, at, kind, params, names)
        if at != OLD and not set(needs) <= baseline:
            assert job_id is None and time.monotonic() - asked < REFUSAL_S_MAX, (kind, job_id)
            assert f"site-{OLD + 1} runs fedpeer 0.1.0 (protocol 2–2)" in refusal and "\n" not in refusal
            continue
        assert job_id is not None, f"{kind} refused: {refusal}"
        records = await h.wait_job(job_id, timeout_s=60)
        states = {h.sites[i].name: (r or {}).get("state") for i, r in records.items()}
        assert set(states.values()) == {"done"}, (kind, states, [(r or {}).get("error") for r in records.values()])

    # still one federation: every site sees every other alive
    await h.wait_all_alive(timeout_s=10)
    assert all(code is None for code in h.exit_codes().values())

    # the old site is upgraded in place (a rolling upgrade's step): the others learn it at its restart
    h.stop(OLD)
    h.sites[OLD].env = None
    h.start(OLD)
    await h.wait_all_alive(timeout_s=30)
    await h.wait_until(lambda docs: all(d is not None and {p["version"]["known"] for p in d["peers"]} == {"told"}
                                        for d in docs.values()), 15, "every site knows every peer runs 0.2.0")
    print(f"mixed-version test took {time.monotonic() - started:.1f} s")
