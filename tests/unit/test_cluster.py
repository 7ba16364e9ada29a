"""The pure clustering steps (fedpeer/ml/cluster/kmeans.py, mixture.py) and the kmeans / gmm jobs' stored
models: parameters that cannot work fail with the parameter to change, the empty-cluster rule is
deterministic, a stored model that is not a valid one is refused, and `job show` describes them."""

from __future__ import annotations

import argparse
import threading

import numpy as np
import pytest

from fedpeer.errors import DataError, JobError
from fedpeer.kinds.cluster import gmm as gj
from fedpeer.kinds.cluster import kmeans as kj
from fedpeer.ml.cluster import kmeans as cl
from fedpeer.ml.cluster import mixture as mx


@pytest.mark.parametrize("text, words", [
    ("1,2;3", "2 centre(s) of unequal lengths"),
    ("1,2;3,4", "2 centre(s) of 2 values; this job needs k = 3 centres of 2 values"),
    ("1,a;3,4;5,6", "is not centres like"),
    ("1,inf;3,4;5,6", "every value must be finite"),
])
def test_explicit_centres_are_checked_naming_the_parameter(text: str, words: str) -> None:
    with pytest.raises(JobError, match="parameter init") as caught:
        cl.parse_centers(text, 3, 2)
    assert words in str(caught.value)


def test_an_empty_cluster_is_reseeded_from_the_federated_normal_the_same_way_everywhere() -> None:
    X = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 10.0], [10.1, 10.0]])
    far = np.array([[0.0, 0.0], [10.0, 10.0], [500.0, 500.0]])          # the third gets no row
    runs = []
    for _ in range(2):
        lloyd = cl.Lloyd([far], 1.0, 0.0, 1, seed=9, mean=X.mean(axis=0), std=X.std(axis=0))
        floats, counts = lloyd.local(X, {})
        lloyd.advance(floats, counts, len(X))
        runs.append(lloyd.restarts[0])
    assert runs[0].reseeded == 1 and np.array_equal(runs[0].centers, runs[1].centers)
    rng = np.random.default_rng([9, 0, 1, 1])
    want = X.mean(axis=0) + X.std(axis=0) * rng.standard_normal((3, 2))
    assert np.array_equal(runs[0].centers[2], want[2])
    assert np.allclose(runs[0].centers[:2], [[0.05, 0.0], [10.05, 10.0]])


@pytest.mark.parametrize("fuzziness", [1.0, 2.0], ids=["hard", "fuzzy"])
def test_restarts_computed_together_equal_each_restart_alone_and_the_plain_formulas(monkeypatch,
                                                                                    fuzziness: float) -> None:
    """All restarts' blocks come from one pass (one matmul for every restart's distances); each
    restart's block is what it would be alone, and what the textbook formulas give, over several chunks
    of rows; hard k-means far from the origin (its inertia is Σ (x - c)², not the expanded distances
    that fuzzy c-means weighs)."""
    rng = np.random.default_rng(3)
    offset = 1e3 if fuzziness == 1.0 else 0.0
    X = rng.standard_normal((500, 4)) + offset
    centers = rng.standard_normal((5, 3, 4)) + offset
    previous = [None, rng.integers(0, 3, 500), None, rng.integers(0, 3, 500), None]
    monkeypatch.setattr(cl, "ROWS_PER_CHUNK_CELLS", 97)                  # chunks of a few rows
    floats, counts, labels = cl.local_blocks(X, centers, fuzziness, previous)
    nf, nc = cl.block_sizes(3, 4)
    for r in range(5):
        f, c, alone = cl.local_blocks(X, centers[r:r + 1], fuzziness, previous[r:r + 1])
        np.testing.assert_allclose(floats[r * nf:(r + 1) * nf], f, rtol=1e-12)
        assert counts[r * nc:(r + 1) * nc].tolist() == c.tolist() and (labels[:, r] == alone[:, 0]).all()
        d2 = ((X[:, None, :] - centers[r][None, :, :]) ** 2).sum(axis=2)
        nearest = d2.argmin(axis=1)
        w = np.eye(3)[nearest] if fuzziness == 1.0 else cl.memberships(d2, fuzziness) ** fuzziness
        want = np.concatenate([(w.T @ X).ravel(), w.sum(axis=0), [(w * d2).sum()]])
        np.testing.assert_allclose(floats[r * nf:(r + 1) * nf], want, rtol=1e-12)
        changed = 500 if previous[r] is None else int((nearest != previous[r]).sum())
        assert (labels[:, r] == nearest).all() and counts[r * nc:(r + 1) * nc].tolist() == [
            *np.bincount(nearest, minlength=3).tolist(), changed]


def test_a_restart_ending_in_the_same_clustering_never_replaces_the_first_on_rounding() -> None:
    """As scikit-learn keeps its best run: a lower objective replaces the kept restart unless it is
    the same clustering (same sizes, objectives equal to 1e-9), so the rounding of the sums cannot
    make the federation and the pooled reference keep different restarts."""
    lloyd = cl.Lloyd([np.zeros((2, 1))] * 4, 1.0, 0.0, 1, seed=0, mean=np.zeros(1), std=np.ones(1))
    for r, (inertia, sizes) in zip(lloyd.restarts, [(10.0, [3, 7]), (5.0, [4, 6]), (5.0 - 5e-13, [6, 4]),
                                                    (4.0, [4, 6])]):
        r.state, r.inertia, r.counts = "done", inertia, np.array(sizes)
    assert lloyd.best() == 3                                             # clearly lower: kept
    lloyd.restarts[3].inertia = 5.0 - 1e-12
    assert lloyd.best() == 1                                             # restart 2 and 3: restart 1 again
    lloyd.restarts[3].counts = np.array([5, 5])
    assert lloyd.best() == 3                                             # another clustering, lower


def test_cluster_steps_run_with_one_blas_thread_from_any_thread_and_put_the_setting_back() -> None:
    """numpy's BLAS runs on one thread inside a step, whichever thread runs it: steps run one after
    the other in threads that stay alive (as an executor's do), and threadpoolctl ignores limits from
    a thread other than the one holding them, so no step may keep the limit. The setting is back after
    every step, also when the step fails."""
    from threadpoolctl import threadpool_info

    def blas() -> list[int]:
        return [p["num_threads"] for p in threadpool_info()
                if p["user_api"] == "blas" and "numpy" in p["filepath"]]

    before = blas()
    assert before
    seen: list[list[int]] = []
    stepped, release = threading.Semaphore(0), threading.Event()

    def step_then_stay_alive() -> None:
        seen.append(kj.one_blas_thread(blas))
        stepped.release()
        release.wait()

    threads = [threading.Thread(target=step_then_stay_alive) for _ in range(3)]
    for thread in threads:
        thread.start()
        stepped.acquire()
        assert blas() == before
    release.set()
    for thread in threads:
        thread.join()
    assert seen == [[1] * len(before)] * 3
    assert kj.one_blas_thread(lambda: kj.one_blas_thread(blas)) == [1] * len(before)    # nested
    assert blas() == before

    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        kj.one_blas_thread(fails)
    assert blas() == before


def test_fuzzy_memberships_survive_a_row_on_a_centre_and_large_exponents() -> None:
    d2 = np.array([[0.0, 4.0, 9.0], [1.0, 1.0, 1e6]])
    for m in (1.01, 2.0, 10.0):
        u = cl.memberships(d2, m)
        assert np.isfinite(u).all() and np.allclose(u.sum(axis=1), 1.0)
        assert u[0, 0] > 0.99 and abs(u[1, 0] - u[1, 1]) < 1e-12


def test_distances_that_overflow_name_standardize() -> None:
    with pytest.raises(JobError, match="standardize=true"):
        cl.sq_distances(np.array([[1e200, 0.0]]), np.array([[0.0, 0.0]]))


def test_a_round_too_large_for_the_secure_sum_names_what_to_lower() -> None:
    with pytest.raises(JobError, match="use covariance=diag or fewer components"):
        kj.check_size("gmm", *mx.stat_sizes(1000, 1000, "full"), "use covariance=diag or fewer components")


def test_stored_models_round_trip_and_a_bad_file_is_refused(tmp_path) -> None:
    model = {"kind": "kmeans", "features": ["a", "b"], "centers": np.array([[0.0, 1.0], [2.0, 3.0]]),
             "shift": np.zeros(2), "scale": np.ones(2), "fuzziness": 1.0}
    kj.save_model(tmp_path / "m.npz", model)
    back = kj.load_model(tmp_path / "m.npz")
    assert back["features"] == ("a", "b") and np.array_equal(back["centers"], model["centers"])
    assert [r["cluster"] for r in kj.predict(back, np.array([[1.9, 3.1], [0.0, 0.9]]))] == [1, 0]
    for bad in ({"centers": np.array([[0.0, np.nan], [2.0, 3.0]])}, {"centers": np.zeros((2, 3))},
                {"scale": np.array([1.0, 0.0])}, {"kind": "gmm"}):
        kj.save_model(tmp_path / "bad.npz", {**model, **bad})
        with pytest.raises(DataError, match="not a valid stored kmeans model"):
            kj.load_model(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="junk.npz: not a valid stored kmeans model"):
        kj.load_model(tmp_path / "junk.npz")
    covs = np.array([np.eye(2), [[1.0, 2.0], [2.0, 1.0]]])              # the second is not positive definite
    gm = {"kind": "gmm", "features": ["a", "b"], "weights": np.array([0.5, 0.5]), "means": np.zeros((2, 2)),
          "covariances": covs, "shift": np.zeros(2), "scale": np.ones(2), "full": 1.0}
    kj.save_model(tmp_path / "g.npz", gm)
    with pytest.raises(DataError, match="not positive definite"):
        gj.load_model(tmp_path / "g.npz")
    kj.save_model(tmp_path / "g.npz", {**gm, "covariances": np.array([np.eye(2), 2 * np.eye(2)])})
    mixture, arrays = gj.load_model(tmp_path / "g.npz")
    assert mixture.covariance == "full" and arrays["features"] == ("a", "b")


def test_job_show_describes_the_rounds_the_fit_and_the_sizes() -> None:
    result = {"rows": 12, "participants": ["a", "b"], "k": 2, "iterations": 3, "converged": True, "secure_sums": 5,
              "secure_sum": "pairwise", "bytes_sent_per_site": 800, "inertia": 1.5, "inertia_units": "original units",
              "kept_restart": 0, "restarts": 2, "history": [{"round": 1, "inertia": 3.0}, {"round": 2, "inertia": 1.5}],
              "cluster_sizes": [9, "< 5"], "centers": [[0.0, 1.0], [5.0, 6.0]]}
    text = "\n".join(kj.describe("kmeans", result))
    assert "12 rows over a, b; k = 2; 3 rounds (converged)" in text and "inertia per round: 3, 1.5" in text
    assert "800 bytes sent per site" in text and "CLUSTER 1" in text
    assert "  rows      9          < 5" in text and "  column 2  1          6" in text   # no names: numbered
    gm = {**result, "log_likelihood": -20.0, "bic": 50.0, "parameters": 9, "covariance": "diag",
          "history": [{"round": 1, "log_likelihood": -20.0}], "weights": [0.75, 0.25], "means": result["centers"]}
    text = "\n".join(kj.describe("gmm", gm))
    assert "BIC 50 (9 parameters, covariance diag)" in text and "0.2500" in text


@pytest.mark.parametrize("job, label, problem", [
    ("kmeans", None, None), ("gmm", None, None), ("xgboost", None, "--label is required with --job xgboost")])
def test_the_harness_needs_a_label_only_for_kinds_that_learn_one(job: str, label: str | None,
                                                                 problem: str | None, tmp_path) -> None:
    from fedpeer.app.harness import cli as harness
    p = argparse.ArgumentParser()
    harness.add_arguments(p)
    args = p.parse_args(["--sites", "3", "--job", job, "--site-data", *[str(tmp_path / f"{i}.csv") for i in range(3)],
                         "--param", "seed=1"] + (["--label", label] if label else []))
    assert harness._check_arguments(args) == problem


def test_a_stored_dbscan_model_round_trips_and_a_bad_one_is_refused(tmp_path) -> None:
    from fedpeer.kinds.cluster import dbscan as dj
    model = {"kind": "dbscan", "features": ["a"], "points": np.array([[0.0], [0.1], [5.0]]),
             "labels": np.array([0.0, 0.0, -1.0]), "eps": 0.5}
    kj.save_model(tmp_path / "d.npz", model)
    back = dj.load_model(tmp_path / "d.npz")
    assert [r["cluster"] for r in dj.predict(back, np.array([[0.3], [5.0], [9.0]]))] == [0, -1, -1]
    for bad in ({"labels": np.array([0.0, 0.5, -1.0])}, {"labels": np.array([0.0, -2.0, -1.0])}, {"eps": 0.0},
                {"points": np.array([[0.0, 1.0], [0.1, 1.0], [5.0, 1.0]])}):
        kj.save_model(tmp_path / "bad.npz", {**model, **bad})
        with pytest.raises(DataError, match="not a valid stored dbscan model"):
            dj.load_model(tmp_path / "bad.npz")
    text = "\n".join(kj.describe("dbscan", {"rows": 9, "participants": ["a"], "clusters": 1, "local_clusters": 2,
                                            "synthetic_rows": 8, "noise_fraction": 1 / 9, "cluster_sizes": [8],
                                            "eps": 0.5, "min_samples": 3}))
    assert "1 cluster from 2 shared local-cluster descriptions (8 synthetic points); noise 0.111" in text


def test_explicit_centres_longer_than_a_parameter_may_be_are_refused_when_proposed() -> None:
    with pytest.raises(JobError, match="parameter init: 1025 characters, more than 1024"):
        kj.KIND.check_params({"init": "1" * 1025})
    assert gj.KIND.check_params({"init": "1,2"})["init"] == "1,2"


@pytest.mark.parametrize("kind, label, answer", [
    ("kmeans", "", ("x", "y")),                   # no label: every column but the ignored ones
    ("gmm", "label", ("x", "y")),                 # a configured label column is not clustered on
    ("stats", "", "[data] label is not set in peers.toml; a stats job needs the label column"),
])
async def test_clustering_kinds_need_no_label_and_the_others_say_it_is_missing(tmp_path, kind: str, label: str,
                                                                               answer) -> None:
    import asyncio
    import dataclasses

    from fedpeer.config import load as cfg
    from fedpeer.jobs import messages as m
    from fedpeer.jobs.lifecycle.registry import JobRegistry
    from fedpeer.kinds.catalog import job_kinds
    from tests.unit.test_policy import ALICE, NAMES, FakeTransport, make_config, proposal, small_csv

    transport = FakeTransport()
    data = dataclasses.replace(small_csv(tmp_path / "data.csv", 20), label=label, positive="",
                               ignore=() if label else ("label",))
    config = make_config(tmp_path, cfg.Policy(), data)
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(config, transport, NAMES, job_kinds(), tg.create_task)
        registry.on_message(ALICE, "peer-job", proposal(ALICE, "peer-job", kind, {}))
        for _ in range(500):      # the CSV is read in a worker thread
            if transport.of(m.JobReject) or transport.of(m.JobAccept):
                break
            await asyncio.sleep(0.01)
        job = registry.jobs.get("peer-job")
        if job is not None and job.task is not None:
            job.task.cancel()
    if isinstance(answer, tuple):
        assert [tuple(msg.features) for _, msg in transport.of(m.JobAccept)] == [answer]
    else:
        assert [msg.reason for _, msg in transport.of(m.JobReject)] == [answer]


def test_shared_cluster_descriptions_that_no_honest_site_sends_are_refused() -> None:
    from fedpeer.ml.cluster import dbscan as db
    honest = [(7, np.array([0.5, 0.5]), np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([np.eye(2), np.eye(2)]))]
    vector = db.pack(honest, 1, 2, 2, 2, 2)
    shared = db.unpack(vector, 2, 2, 2, 2)
    assert [(p, s, rows) for p, s, rows, *_ in shared] == [(1, 0, 7)]
    assert db.synthesize(shared, 3).shape == (7, 2)
    size = db.slot_size(2, 2)
    for at, value in ((0, 2.5), (1, -0.5), (1, 0.9)):          # fractional rows, a negative weight, weights != 1
        bad = vector.copy()
        bad[2 * size + at] = value
        with pytest.raises(ValueError, match="whole rows and weights adding up to 1"):
            db.unpack(bad, 2, 2, 2, 2)
    bad = vector.copy()
    bad[2 * size + 1 + 2 + 4:2 * size + 1 + 2 + 4 + 3] = [1.0, 5.0, 1.0]   # a covariance that is not positive definite
    with pytest.raises(ValueError, match="positive semi-definite"):
        db.unpack(bad, 2, 2, 2, 2)
    bad[2 * size + 1 + 2 + 4:2 * size + 1 + 2 + 4 + 3] = [1.0, 1.0, 1.0]   # semi-definite: passes, then cannot be drawn
    with pytest.raises(JobError, match="not positive definite"):
        db.synthesize(db.unpack(bad, 2, 2, 2, 2), 3)
    # the clustered rows' Σx, Σx² must be what the descriptions imply (7 rows: half at 0, half at 1, unit variance)
    implied = np.array([3.5, 3.5, 7 * 1.0 + 3.5, 7 * 1.0 + 3.5])
    db.check_moments(shared, implied, 0.0, 7)
    with pytest.raises(ValueError, match="reproduce their rows"):
        db.check_moments(shared, implied + [0.0, 0.0, 50.0, 0.0], 0.0, 7)
    db.check_counts(shared, 9, 2)
    with pytest.raises(ValueError, match="add up to the rows"):
        db.check_counts(shared, 9, 1)


def test_too_many_local_clusters_tells_other_sites_no_count() -> None:
    from fedpeer.errors import DataError, public_reason
    from fedpeer.ml.cluster import dbscan as db

    with pytest.raises(DataError) as caught:
        db.pack([None] * 7, 0, 3, 5, 2, 2)
    assert "7 local clusters" in str(caught.value)                   # this site's operator sees the count
    assert "7" not in public_reason(caught.value) and "local_clusters_max" in public_reason(caught.value)


def test_eps_from_the_summed_k_distances_and_its_checks() -> None:
    from fedpeer.ml.cluster import dbscan as dbm

    rng = np.random.default_rng(0)
    Z = rng.standard_normal((400, 3))
    parts = [Z[:150], Z[150:300], Z[300:], Z[:2]]               # the last site has fewer rows than min_samples
    hists = [dbm.kdistance_histogram(p, 5) for p in parts]
    assert hists[3][-1] == 2 and hists[3].sum() == 2
    total = sum(hists)
    dbm.check_kdistances(total, 402)
    with pytest.raises(ValueError, match="hold 403 rows"):
        dbm.check_kdistances(total + np.eye(len(total), dtype=np.int64)[5], 402)
    eps = dbm.eps_from_histogram(total)
    local = np.concatenate([np.sort(np.linalg.norm(p[:, None] - p[None], axis=2), axis=1)[:, 4] for p in parts[:3]])
    assert np.mean(local <= eps) >= 0.75 and np.mean(local <= eps / 10 ** 0.05) < 0.75 + 1e-9
    with pytest.raises(JobError, match="set eps"):
        dbm.eps_from_histogram(np.eye(len(total), dtype=np.int64)[-1] * 10)
    assert dbm.noise_warning(10, 6, np.array([4])).startswith("6 of 10 rows (60%) are noise")
    assert dbm.noise_warning(10, 0, np.array([10])).startswith("one cluster holds all 10 rows")
    assert dbm.noise_warning(10, 2, np.array([5, 3])) is None
    assert dbm.noise_warning(10, 2, np.array([8])).startswith("one cluster holds all 8 rows that are not noise (2 are)")
