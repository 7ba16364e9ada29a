"""Vertically partitioned sites between real daemons: `fedpeer harness --partition vertical
--id-column ID --site-data ...` runs `kmeans` over three column blocks of shuffled, partly
overlapping patients and reports scikit-learn's KMeans centres on the joined rows (from the same
initial centres, given in the joined column order); a job mixing vertical and horizontal sites,
and a kind that cannot run over vertical sites, are refused naming the site and the fix."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from fedpeer.ml.cluster import kmeans as cl

pytestmark = pytest.mark.integration


def attach(sites: list, paths: list[Path], **data: object) -> None:
    """[data] of some of a federation's sites (as tests/integration/test_jobs.py `_attach_data`)."""
    for site, path in zip(sites, paths):
        shutil.copyfile(path, site.dir / "data.csv")
        add_peers(site.config_path, [], {"data": {"csv": "data.csv", **data}})
        site.config = cfg.load(site.config_path)


def write_blocks(tmp_path: Path, seed: int = 0) -> tuple[np.ndarray, list[Path]]:
    """Breast cancer's 30 columns as three CSVs of 10 columns and ID, each site's patients shuffled
    and missing a different ~10 %; and the joined rows of the patients all three hold."""
    from sklearn.datasets import load_breast_cancer
    X = load_breast_cancer().data
    rng = np.random.default_rng(seed)
    paths, held = [], []
    for m in range(3):
        keep = rng.permutation(np.flatnonzero(rng.random(len(X)) >= 0.1))
        held.append(set(keep.tolist()))
        path = tmp_path / f"block-{m + 1}.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ID", *(f"c{j}" for j in range(10 * m, 10 * m + 10))])
            w.writerows([[f"P{i:04d}", *(repr(float(v)) for v in X[i, 10 * m:10 * m + 10])] for i in keep])
        paths.append(path)
    return X[sorted(set.intersection(*held))], paths


def test_harness_vertical_kmeans_equals_scikit_learn_on_the_joined_rows(tmp_path: Path) -> None:
    from sklearn.cluster import KMeans

    joined, paths = write_blocks(tmp_path)
    init = joined[[3, 120, 260]]
    text = ";".join(",".join(repr(float(v)) for v in row) for row in init)
    r = subprocess.run([sys.executable, "-m", "fedpeer", "harness", "--sites", "3", "--job", "kmeans",
                        "--partition", "vertical", "--id-column", "ID", "--site-data", *map(str, paths),
                        "--param", "k=3", "--param", "tol=0", "--param", f"init={text}",
                        "--param", "standardize=false", "--json",
                        "--timeout-s", "120"], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    report = json.loads(r.stdout)
    assert report["job"]["state"] == "done", (report["job"], r.stderr[-2000:])
    sk = KMeans(3, init=init, n_init=1, tol=0.0, algorithm="lloyd").fit(joined)
    order = cl.canonical_order(sk.cluster_centers_)
    for site in report["sites"]:
        res = site["result"]
        np.testing.assert_allclose(res["centers"], sk.cluster_centers_[order], rtol=1e-9)
        np.testing.assert_allclose(res["inertia"], sk.inertia_, rtol=1e-9)
        assert res["features"] == [f"c{j}" for j in range(30)] and res["aligned_rows"] == len(joined)
        assert res["cluster_sizes"] == list(np.bincount(sk.labels_)[order])


async def test_mixed_partitions_and_a_kind_without_vertical_support_are_refused(make_federation,
                                                                                 tmp_path: Path) -> None:
    _, paths = write_blocks(tmp_path, seed=1)
    h = make_federation(3, start=False)
    attach(h.sites[:2], paths[:2], partition="vertical", id_column="ID")
    attach(h.sites[2:], paths[2:], ignore=["ID"])          # horizontal: the ID column is just ignored
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "kmeans", {"k": 2})
    records = await h.wait_job(job_id, timeout_s=30)
    error = records[0]["error"]
    assert records[0]["state"] == "failed" and error.startswith(f"{h.sites[2].name}: its data is horizontal"), error
    assert f'set [data] partition = "vertical" at {h.sites[2].name} with its id_column' in error

    job_id = await h.propose(1, "gmm", {"k": 2})
    records = await h.wait_job(job_id, timeout_s=30)
    error = records[1]["error"]
    assert records[1]["state"] == "failed" and '[data] partition = "vertical": a gmm job' in error, error
    assert "vertical sites run" in error and "kmeans" in error
