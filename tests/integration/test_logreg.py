"""The `logreg` job between real daemons, run as an operator runs it (issue 17):
`fedpeer harness --job logreg --site-data ... --param C=1.0 --param mode=exact --json` gives every
site the coefficients scikit-learn's LogisticRegression gives on the pooled rows (1e-5 relative),
`fedpeer predict` scores new rows with the stored model and `fedpeer export` writes coefficients a
scikit-learn LogisticRegression predicts the same with."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedpeer.app.harness.federation import split_csv
from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.kinds.linear import logreg
from tests.integration.conftest import predict_scores
from tests.integration.test_jobs import breast_cancer_csv

pytestmark = pytest.mark.integration


def _rows(path: Path):
    return load_csv(DataSpec(csv=path, label="diagnosis", positive="malignant"))


def test_harness_fits_the_pooled_rows_model_and_predict_and_export_use_it(tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    full = breast_cancer_csv(tmp_path / "bc.csv")
    train, test = split_csv(full, "diagnosis", 2, "0.8,0.2", seed=3, out_dir=tmp_path / "holdout")
    parts = split_csv(train, "diagnosis", 3, "0.6,0.3,0.1", seed=3, out_dir=tmp_path / "parts")
    r = subprocess.run([sys.executable, "-m", "fedpeer", "harness", "--sites", "3", "--job", "logreg",
                        "--site-data", *map(str, parts), "--label", "diagnosis", "--positive", "malignant",
                        "--test-data", str(test), "--param", "C=1.0", "--param", "mode=exact",
                        "--param", "test_fraction=0",   # the pooled rows' model: every row trains
                        "--param", "tol=1e-10", "--workdir", str(tmp_path / "fed"), "--json", "--timeout-s", "120"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["job"]["state"] == "done"
    results = [s["result"] for s in report["sites"]]
    assert len({json.dumps([res["coef"], res["intercept"]]) for res in results}) == 1

    sites = [_rows(p) for p in parts]
    X, y = np.vstack([s.X for s in sites]), np.concatenate([s.y for s in sites])
    scaler = StandardScaler().fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-14, max_iter=10_000)
        ref.fit(scaler.transform(X), y)
    res = results[0]
    coef = ref.coef_ / scaler.scale_
    want = np.hstack([coef, (ref.intercept_ - coef @ scaler.mean_)[:, None]])
    got = np.hstack([np.asarray(res["coef"]), np.asarray(res["intercept"])[:, None]])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    assert res["status"] == "converged" and res["auc_source"] == "[data] test_csv" and res["auc"] > 0.97
    assert res["federated_eval"]["auc"] > 0.98 and res["rows"] == len(y)

    # the stored model: predict scores the held-out rows, export gives scikit-learn's coefficients
    config = tmp_path / "fed" / report["sites"][1]["name"] / "peers.toml"
    held_out = _rows(test)
    scores = predict_scores(config, report["job"]["id"], test, tmp_path / "scores.csv")
    pipeline_proba = ref.predict_proba(scaler.transform(held_out.X))[:, 1]
    assert np.allclose(scores, pipeline_proba, rtol=0, atol=1e-6)
    out = subprocess.run([sys.executable, "-m", "fedpeer", "export", "--config", str(config),
                          "--job", report["job"]["id"]], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    exported = logreg.to_sklearn(json.loads(out.stdout))
    assert np.allclose(exported.predict_proba(held_out.X)[:, 1], scores, rtol=0, atol=1e-12)


async def test_an_mlp_member_killed_mid_job_leaves_the_survivors_done_with_one_model(make_federation,
                                                                                  tmp_path: Path) -> None:
    """FedAvg rounds go on over the survivors (fedpeer/kinds/linear/fedavg.py): groups "ring 1st, ring 2nd;
    ring 3rd", the ring's second member (its group mate sees it lost at once, the third site at the
    next federation-wide round) killed -9 after a few rounds."""
    from fedpeer.identity import load_key_file
    from tests.integration.test_jobs import _attach_data

    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=5, out_dir=tmp_path / "parts")
    # a chunk lost with the killed member costs the sum's initiator (members + 1) hops: 2 s hops
    # instead of the default 20 s keep this test short
    h = make_federation(3, {"jobs": {"hop_timeout_ms": 2_000}}, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    keys = [load_key_file(s.config.node.key_file).public_key for s in h.sites]
    ring = sorted(range(3), key=lambda i: keys[i])
    names = [h.sites[i].name for i in ring]
    victim, proposer = ring[1], ring[0]
    job_id = await h.propose(proposer, "mlp", {"rounds": 150, "hidden_layer_sizes": "4", "learning_rate": 0.01,
                                               "groups": f"{names[0]},{names[1]};{names[2]}", "global_every": 5,
                                               "secure_sum": "ring", "test_fraction": 0.0})   # rows: training
    await h.wait_step(proposer, job_id, 3, timeout_s=30)
    h.kill9(victim)
    survivors = [i for i in range(3) if i != victim]
    records = await h.wait_job(job_id, timeout_s=60, among=survivors)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    results = [r["result"] for r in records.values()]
    assert all(r["lost"] == [names[1]] and r["members"] == [names[0], names[2]] for r in results), results
    assert len({json.dumps([r["coefs"], r["intercepts"]]) for r in results}) == 1
    first_seen = {r["fedavg"]["lost_at_round"][names[1]] for r in results}
    assert len(results[0]["history"]) == 151 and results[0]["history"][-1]["rows"] == 569 - _rows_in(parts[ring[1]])
    assert max(first_seen) < 150, first_seen
    assert len({Path(r["model_file"]).read_bytes() for r in results}) == 1


def _rows_in(path: Path) -> int:
    return sum(1 for _ in open(path)) - 1
