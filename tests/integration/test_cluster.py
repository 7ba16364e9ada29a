"""The `kmeans` and `gmm` jobs between real daemons, over CSVs without a label column: `fedpeer
harness --job kmeans ... --json` reports scikit-learn's KMeans centres (started from the same
centres, on the pooled rows) and `fedpeer predict` assigns new rows to them; the gmm job's mixture
is the one the same pure functions give on the pooled rows, and `fedpeer predict` gives its
component probabilities."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpeer.ml.cluster import kmeans as cl
from fedpeer.ml.cluster import mixture as mx
from tests.integration.test_jobs import _attach_data

pytestmark = pytest.mark.integration


def write_sites(tmp_path: Path, seed: int) -> tuple[np.ndarray, list[Path]]:
    """3 sites of make_blobs rows, non-IID (site i holds 80 % of blob i), with an Id column."""
    from sklearn.datasets import make_blobs
    X, y = make_blobs(n_samples=900, centers=3, n_features=2, random_state=seed, cluster_std=[1.0, 1.5, 0.7])
    rng = np.random.default_rng(seed)
    owner = np.where(rng.random(len(X)) < 0.8, y, (y + rng.integers(1, 3, len(X))) % 3)
    paths, pooled = [], []
    for i in range(3):
        rows = X[owner == i]
        pooled.append(rows)
        path = tmp_path / f"site-{i + 1}.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["Id", "a", "b"])
            w.writerows([[f"r{i}-{j}", repr(float(r[0])), repr(float(r[1]))] for j, r in enumerate(rows)])
        paths.append(path)
    return np.vstack(pooled), paths


def test_harness_kmeans_equals_sklearn_from_the_same_centres_and_predict_assigns(tmp_path: Path) -> None:
    from sklearn.cluster import KMeans

    X, paths = write_sites(tmp_path, seed=11)
    init = X[[0, 350, 700]]
    text = ";".join(",".join(repr(float(v)) for v in row) for row in init)
    work = tmp_path / "fed"
    r = subprocess.run([sys.executable, "-m", "fedpeer", "harness", "--sites", "3", "--job", "kmeans", "--site-data",
                        *map(str, paths), "--ignore", "Id", "--param", "k=3", "--param", f"init={text}",
                        "--param", "standardize=false",
                        "--param", "secure_sum=ring", "--workdir", str(work), "--json", "--timeout-s", "120"],
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    report = json.loads(r.stdout)
    assert report["job"]["state"] == "done", (report["job"], r.stderr[-2000:])
    sk = KMeans(3, init=init, n_init=1, tol=1e-4).fit(X)
    order = cl.canonical_order(sk.cluster_centers_)
    results = [s["result"] for s in report["sites"]]
    for res in results:
        np.testing.assert_allclose(res["centers"], sk.cluster_centers_[order], rtol=1e-9)
        np.testing.assert_allclose(res["inertia"], sk.inertia_, rtol=1e-9)
        assert res["features"] == ["a", "b"] and res["rows"] == len(X)
        assert res["cluster_sizes"] == list(np.bincount(sk.labels_)[order])

    config = work / report["sites"][1]["name"] / "peers.toml"
    out = tmp_path / "assigned.csv"
    p = subprocess.run([sys.executable, "-m", "fedpeer", "predict", "--config", str(config), "--job",
                        report["job"]["id"], "--data", str(paths[2]), "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        got = [int(row["cluster"]) for row in csv.DictReader(f)]
    rank = np.argsort(order)                       # sklearn's label -> canonical index
    assert got == list(rank[sk.predict(np.loadtxt(paths[2], delimiter=",", skiprows=1, usecols=(1, 2)))])


async def test_gmm_between_daemons_equals_the_pooled_reference(make_federation, tmp_path: Path) -> None:
    X, paths = write_sites(tmp_path, seed=12)
    h = make_federation(3, start=False)
    _attach_data(h, paths, ignore=["Id"])               # no label
    h.start()
    await h.wait_all_alive(timeout_s=30)
    params = {"k": 3, "covariance": "diag", "seed": 4, "n_init": 2, "tol": 1e-6, "standardize": False}
    job_id = await h.propose(0, "gmm", params)
    records = await h.wait_job(job_id, timeout_s=90)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    results = [r["result"] for r in records.values()]

    from fedpeer.kinds.cluster import gmm
    p = gmm.KIND.check_params(params)
    space, lloyd, _ = cl.reference_kmeans(X, **gmm._kmeans_params(p) | {"init": None})
    C = lloyd.restarts[lloyd.best()].centers
    model, history, _ = mx.em_reference(X, C, cl.nearest(X, C)[0], covariance="diag", reg_covar=p["reg_covar"],
                                        tol=p["tol"], max_iter=p["max_iter"])
    ref = model.reordered(cl.canonical_order(model.means))
    for res in results:
        np.testing.assert_allclose(res["means"], ref.means, rtol=1e-9)
        np.testing.assert_allclose(res["covariances"], ref.covariances, rtol=1e-9)
        np.testing.assert_allclose(res["log_likelihood"], history[-1] * len(X), rtol=1e-9)
        assert len(res["history"]) == len(history) and res["model_file_sha256"]

    out = tmp_path / "probabilities.csv"
    r = subprocess.run([sys.executable, "-m", "fedpeer", "predict", "--config", str(h.sites[2].config_path), "--job",
                        job_id, "--data", str(paths[0]), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    proba = np.array([[float(row[f"p_{c}"]) for c in range(3)] for row in rows])
    resp, _ = mx.estep(np.loadtxt(paths[0], delimiter=",", skiprows=1, usecols=(1, 2)), ref, ref.cholesky())
    np.testing.assert_allclose(proba, resp, rtol=1e-6, atol=1e-9)
    assert [int(row["cluster"]) for row in rows] == list(resp.argmax(axis=1))
