"""The `tree` job (fedpeer/kinds/tree/job.py) between real daemons: every member stores the tree the
same pure functions grow on the pooled rows — scikit-learn's on them, max_bin being above the
rows — which `job show` prints as rules, `fedpeer predict` scores and `fedpeer export` writes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedpeer.app.harness.federation import split_csv
from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.ml.tree.model import load_model, model_bytes, predict_value, to_sklearn
from fedpeer.kinds.tree.site import train_reference
from fedpeer.ml.tree.cart import TreeParams
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration
PARAMS = {"max_depth": 3, "max_bin": 1024, "min_leaf_rows": 5, "test_fraction": 0.0, "secure_sum": "ring"}


def _fedpeer(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "fedpeer", *args], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


async def run_tree(make_federation: Any, tmp_path: Path, params: dict) -> tuple[Any, list[Path], str, list[dict]]:
    """Breast cancer over 3 real daemons (stratified thirds), one tree job of `params` to its end:
    (harness, the sites' files, job id, every member's result)."""
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=5, out_dir=tmp_path / "parts")
    h = make_federation(3, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "tree", params)
    records = await h.wait_job(job_id, timeout_s=60)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    return h, parts, job_id, [r["result"] for r in records.values()]


async def test_every_member_stores_the_pooled_tree_which_reads_predicts_and_exports(make_federation,
                                                                                    tmp_path: Path) -> None:
    h, parts, job_id, results = await run_tree(make_federation, tmp_path, PARAMS)
    full = tmp_path / "bc.csv"        # the pooled rows run_tree split
    assert len({r["model_sha256"] for r in results}) == 1 and results[0]["exact_features"] == 30

    sites = [load_csv(DataSpec(csv=p, label="diagnosis", positive="malignant")) for p in parts]
    want = train_reference([s.X for s in sites], [s.y for s in sites],
                           TreeParams(max_depth=3, min_leaf_rows=5, max_bin=1024))
    stored = Path(results[0]["model_file"]).read_bytes()
    assert stored == model_bytes(want, list(sites[0].features), ["negative", "positive"])
    pooled = load_csv(DataSpec(csv=full, label="diagnosis", positive="malignant"))
    from sklearn.tree import DecisionTreeClassifier
    fitted = DecisionTreeClassifier(max_depth=3, min_samples_leaf=5, random_state=0).fit(pooled.X, pooled.y)
    assert fitted.tree_.node_count == want.n_nodes      # its one tie sends the same rows left (test_tree_core.py)
    np.testing.assert_array_equal(fitted.predict_proba(pooled.X), to_sklearn(want).predict_proba(pooled.X))

    shown = _fedpeer("job", "show", job_id, "--config", str(h.sites[1].config_path))
    assert "scikit-learn's midpoints on 30 of 30 features" in shown and shown.count("    if ") == want.n_leaves
    scores = tmp_path / "scores.csv"
    _fedpeer("predict", "--config", str(h.sites[2].config_path), "--job", job_id, "--data", str(full),
             "--out", str(scores))
    with open(scores) as f:
        got = np.array([float(row["score"]) for row in csv.DictReader(f)])
    np.testing.assert_array_equal(got, predict_value(want, pooled.X)[:, 1])
    exported = json.loads(_fedpeer("export", "--config", str(h.sites[0].config_path), "--job", job_id))
    assert exported["left"] == want.left.tolist() and exported["features"] == list(sites[0].features)
    assert load_model(json.dumps(exported).encode())[0].n_nodes == want.n_nodes
