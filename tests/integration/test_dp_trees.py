"""Histogram XGBoost with DP between real daemons: the proposal carries the proposer's [data]
bounds, both members end with the same model and the same charge in their ledgers; after one site
changes its bounds (reload), the next DP job is refused at that site before anything is charged,
naming the site and the column, and every member says so."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import split_csv
from fedpeer.daemon.admin import request
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration
PARAMS = {"mode": "histogram", "rounds": 2, "max_depth": 2, "max_bin": 8, "test_fraction": 0.0, "nthread": 1,
          "dp_epsilon": 4.0, "dp_rows_max": 10_000}


def _spent(site) -> dict:
    path = site.dir / "state" / "privacy.json"
    return json.loads(path.read_text())["datasets"] if path.exists() else {}


async def test_dp_xgboost_takes_the_proposers_bounds_and_a_member_with_other_bounds_refuses(make_federation,
                                                                                           tmp_path: Path):
    full = breast_cancer_csv(tmp_path / "bc.csv")
    with open(full) as f:
        features = [c for c in next(csv.reader(f)) if c != "diagnosis"]
    bounds = {c: [0, 5000] for c in features}
    parts = split_csv(full, "diagnosis", 2, "stratified", seed=5, out_dir=tmp_path / "parts")
    h = make_federation(2, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant", bounds=bounds)
    h.start()
    await h.wait_all_alive(timeout_s=30)

    job_id = await h.propose(0, "xgboost", PARAMS)
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    results = [r["result"] for r in records.values()]
    assert len({r["model_sha256"] for r in results}) == 1
    assert json.loads(records[0]["params"]["dp_bounds"]) == bounds         # the proposer's [data] bounds
    p = results[0]["privacy"]
    assert p["epsilon"] <= 4.0 and p["bits_per_value"] == 20 and "noised G, H" in p["split_rule"]
    charges = [_spent(s) for s in h.sites]
    assert all(len(c) == 1 and next(iter(c.values()))[job_id]["epsilon"] == 4.0 for c in charges), charges

    text = h.sites[1].config_path.read_text().replace(f"{features[3]} = [0, 5000]", f"{features[3]} = [0, 4000]")
    assert text != h.sites[1].config_path.read_text()
    h.sites[1].config_path.write_text(text)
    await request(h.sites[1].config, "POST", "/v1/reload")          # as `fedpeer reload` asks it
    refused = await h.propose(0, "xgboost", PARAMS)
    records = await h.wait_job(refused, timeout_s=60)
    errors = [r["error"] for r in records.values()]
    assert {r["state"] for r in records.values()} == {"failed"}, errors
    line = (f"{h.sites[1].name}: its [data] bounds for column {features[3]!r} differ from the job's dp_bounds; "
            "public bounds must be the same at every site")
    assert all(line in e for e in errors), errors
    assert [_spent(s) for s in h.sites] == charges            # refused before any charge
