"""The `tree` job in mode icdta between real daemons: every member stores the same global tree
(ICDTA4FL without a server), reports its AUC, `job show` prints the aggregated rules, `fedpeer
predict` scores with it; `fedpeer harness --job tree --param mode=icdta` runs it end to end."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.ml.tree.model import load_model, predict_value
from tests.integration.test_tree import _fedpeer, run_tree

pytestmark = pytest.mark.integration
PARAMS = {"mode": "icdta", "max_depth": 3, "min_leaf_rows": 5, "test_fraction": 0.2, "secure_sum": "ring"}


async def test_every_member_stores_the_same_global_tree_and_reports_its_auc(make_federation, tmp_path: Path) -> None:
    h, parts, job_id, results = await run_tree(make_federation, tmp_path, PARAMS)
    full = tmp_path / "bc.csv"        # the pooled rows run_tree split
    assert len({r["model_sha256"] for r in results}) == 1 and {r["mode"] for r in results} == {"icdta"}
    assert 0.8 < results[0]["auc"] <= 1.0 and results[0]["score_source"] == "federated, on the sites' test parts"
    assert results[0]["icdta"]["trees_kept"] and results[0]["secure_sums"] == 3

    shown = _fedpeer("job", "show", job_id, "--config", str(h.sites[1].config_path))
    assert "tree (icdta): 3 local trees" in shown and shown.count("    if ") == len(results[0]["rules"])
    scores = tmp_path / "scores.csv"
    _fedpeer("predict", "--config", str(h.sites[2].config_path), "--job", job_id, "--data", str(full),
             "--out", str(scores))
    with open(scores) as f:
        got = np.array([float(row["score"]) for row in csv.DictReader(f)])
    cart, _, _ = load_model(Path(results[0]["model_file"]).read_bytes())
    pooled = load_csv(DataSpec(csv=full, label="diagnosis", positive="malignant"))
    np.testing.assert_array_equal(got, predict_value(cart, pooled.X)[:, 1])


def test_the_harness_runs_it_and_reports_the_auc_of_every_site() -> None:
    r = subprocess.run([sys.executable, "-m", "fedpeer", "harness", "--sites", "3", "--job", "tree", "--data",
                        "builtin:breast_cancer", "--holdout", "0.2", "--param", "mode=icdta", "--param",
                        "max_depth=3", "--json"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["job"]["state"] == "done" and {s["state"] for s in report["sites"]} == {"done"}
    results = [s["result"] for s in report["sites"]]
    assert len({x["model_sha256"] for x in results}) == 1
    assert all(x["score_source"] == "[data] test_csv" and 0.8 < x["auc"] <= 1.0 for x in results)
