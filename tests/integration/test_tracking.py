"""[tracking] mlflow_uri on real daemons (fedpeer/daemon/tracking.py): every site that took part in
a job logs it as one MLflow run — the job's params, its history with the round (iteration) as the
step, the result's numbers, tags naming kind, job and site — into a local store (SQLite, set up
beforehand as an operator's store is); and `start` refuses a set URI without the extra."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness
from tests.integration.test_jobs import breast_cancer_federation
from tests.unit.test_tracking import need_mlflow

pytestmark = pytest.mark.integration
RUNS_TIMEOUT_S = 90        # each daemon imports MLflow in its worker thread at the first run (seconds)


async def test_each_site_logs_its_run_of_a_job(make_federation, tmp_path: Path) -> None:
    need_mlflow()
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()          # the store exists, as an operator's does
    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "stratified", seed=2,
                                             settings={"tracking": {"mlflow_uri": uri}})
    job_id = await h.propose(0, "logreg", {"C": 1.0, "secure_sum": "ring", "seed": 5})
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    client = MlflowClient(uri)
    deadline = time.monotonic() + RUNS_TIMEOUT_S
    while True:
        found = [e for e in client.search_experiments() if e.name == "fedpeer"]
        runs = client.search_runs([e.experiment_id for e in found], f"tags.`fedpeer.job` = '{job_id}'")
        if (len(runs) == 3 and all(r.info.status != "RUNNING" for r in runs)) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert len(found) == 1 and len(runs) == 3, [r.data.tags for r in runs]
    by_site = {r.data.tags["fedpeer.site"]: r for r in runs}
    assert set(by_site) == {s.name for s in h.sites}
    for i, site in enumerate(h.sites):
        run, record = by_site[site.name], records[i]
        result = record["result"]
        assert run.info.status == "FINISHED" and run.data.tags["fedpeer.kind"] == "logreg"
        assert run.data.params["C"] == "1.0" and run.data.params["test_fraction"] == "0.2"
        loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
        assert loss == [(h["iteration"], pytest.approx(h["loss"])) for h in record["history"]]
        assert run.data.metrics["federated_eval.auc"] == pytest.approx(result["federated_eval"]["auc"])
        assert run.data.metrics["federated_eval.rows"] == result["test_rows"] > 0
        assert run.data.metrics["rows"] == result["rows"]


def test_start_refuses_a_tracking_uri_without_mlflow(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fed", 1, {"tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'm.db'}"}})
    h.create()
    hide = "import sys; sys.modules['mlflow'] = None; from fedpeer.app.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", hide, "start", "--config", str(h.sites[0].config_path)],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "tracking.mlflow_uri" in lines[0] and "pip install 'fedpeer[mlflow]'" in lines[0], lines
