"""The `tree` job (fedpeer/kinds/tree/job.py), three members in one process over the in-memory
network in virtual time: every member stores byte for byte the tree the same pure functions grow
on the pooled rows (classification, multi-class, regression); a member crashed mid-job leaves the
survivors with the tree of the survivors' rows."""

from __future__ import annotations

import hashlib

import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
from sklearn.tree import DecisionTreeRegressor

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.jobs.kind import JobContext
from fedpeer.kinds.tree import job as tree_job
from fedpeer.kinds.tree import kind as tree_kind
from fedpeer.ml.tree.model import load_model, model_bytes
from fedpeer.ml.xgb.sketch import sketch_steps
from fedpeer.kinds.tree.site import train_reference
from fedpeer.testing.members import after_step, member_keys, run_members

SITES = 3


def _site(X: np.ndarray, labels: np.ndarray, y: np.ndarray | None) -> Dataset:
    features = tuple(f"f{j}" for j in range(X.shape[1]))
    X = np.ascontiguousarray(X, dtype=np.float64)
    fingerprint = schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features))
    return Dataset(features, X, y, labels.astype(str), 0, fingerprint)


def _sites(X: np.ndarray, labels: np.ndarray, y: np.ndarray | None) -> list[Dataset]:
    return [_site(X[i::SITES], labels[i::SITES], None if y is None else y[i::SITES]) for i in range(SITES)]


async def _inline(fn, *args):
    return fn(*args)


def _run(sites: list[Dataset], params: dict, crash_at_level: int | None = None, victim: int = 1) -> tuple[list, dict]:
    keys, names = member_keys("tree", len(sites))
    checked = tree_kind.KIND.check_params(params)

    def member(net, i: int, k: bytes):
        return tree_job.run_job(net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]), _inline)

    crash = after_step(crash_at_level) if crash_at_level is not None else None
    return run_members(keys, member, crash, victim), checked


def _reference(sites: list[Dataset], checked: dict, labels: list[str]) -> bytes:
    return _pooled([s.X for s in sites], [tree_job.site_labels(s, checked) for s in sites], checked, labels)


def _pooled(Xs: list, ys: list, checked: dict, labels: list[str]) -> bytes:
    cart = train_reference(Xs, ys, tree_job.tree_params(checked))
    return model_bytes(cart, [f"f{j}" for j in range(Xs[0].shape[1])], labels)


def test_every_member_stores_the_pooled_rows_tree_byte_for_byte() -> None:
    X, y = load_breast_cancer(return_X_y=True)
    sites = _sites(X, y, y.astype(np.int8))
    results, checked = _run(sites, {"max_depth": 4, "max_bin": 1024, "min_leaf_rows": 1, "test_fraction": 0.0,
                                    "secure_sum": "ring"})
    assert all(isinstance(r, dict) for r in results), results
    assert {r["_model"] for r in results} == {_reference(sites, checked, ["negative", "positive"])}
    r = results[0]
    assert r["model_sha256"] == hashlib.sha256(r["_model"]).hexdigest()
    assert r["secure_sums"] == sketch_steps(30, 1024) + 4 + 1 and r["exact_features"] == 30 and r["lost"] == []
    assert r["n_leaves"] == len(r["rules"]) and r["depth"] == 4 and r["auc"] > 0.98
    assert r["tree"]["left"][r["tree"]["left"].index(-1)] == -1 and len(r["tree"]["value"][0]) == 2
    lines = tree_kind.KIND.describe({k: v for k, v in r.items() if k != "_model"})
    assert "scikit-learn's midpoints on 30 of 30 features" in lines[2] and lines[-1].startswith("    if ")


def test_multi_class_and_regression_jobs_give_the_reference_tree() -> None:
    X, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])
    sites = _sites(X, names[y], None)
    results, checked = _run(sites, {"classes": "setosa,versicolor,virginica", "max_depth": 3, "max_bin": 64,
                                    "test_fraction": 0.2, "criterion": "entropy"})
    parts = [_training_part(s, checked, k) for k, s in enumerate(sites)]
    assert {r["_model"] for r in results} == {_pooled([p.X for p in parts], [p.y for p in parts], checked,
                                                      list(names))}
    assert results[0]["auc"] > 0.8 and results[0]["rows"]["test"] > 0

    Xd, yd = load_diabetes(return_X_y=True, scaled=False)
    sites = _sites(Xd, yd, None)
    results, checked = _run(sites, {"criterion": "squared_error", "max_depth": 6, "max_bin": 1024,
                                    "min_leaf_rows": 5, "test_fraction": 0.0})
    assert {r["_model"] for r in results} == {_reference(sites, checked, [])}
    cart, _, _ = load_model(results[0]["_model"])
    pooled = np.concatenate([s.X for s in sites]), np.concatenate([tree_job.site_labels(s, checked) for s in sites])
    fitted = DecisionTreeRegressor(max_depth=6, min_samples_leaf=5, random_state=0).fit(*pooled).tree_
    np.testing.assert_array_equal(cart.threshold, fitted.threshold)
    np.testing.assert_array_equal(cart.value, fitted.value[:, 0, :])
    assert 0 < results[0]["rmse"] < 50 and "auc" not in results[0]


def _training_part(site: Dataset, checked: dict, k: int) -> Dataset:
    """Member k's training part as the job splits its rows (seeded by the job seed and its key)."""
    from dataclasses import replace

    from fedpeer.data.dataset import split_train_test
    from fedpeer.jobs.kind import site_seed

    keys, _ = member_keys("tree", SITES)
    y = tree_job.site_labels(site, checked)
    return split_train_test(replace(site, y=y), checked["test_fraction"], site_seed(checked["seed"], keys[k]))[0]


def test_a_member_crashed_mid_job_leaves_the_survivors_the_tree_of_their_rows() -> None:
    X, y = load_breast_cancer(return_X_y=True)
    sites = _sites(X, y, y.astype(np.int8))
    results, checked = _run(sites, {"max_depth": 5, "max_bin": 1024, "test_fraction": 0.0, "secure_sum": "ring"},
                            crash_at_level=2, victim=1)
    survivors = [r for r in results if isinstance(r, dict)]
    assert len(survivors) == 2, results
    assert all(r["lost"] == ["site-2"] and r["members"] == ["site-1", "site-3"] for r in survivors)
    assert {r["_model"] for r in survivors} == {_reference([sites[0], sites[2]], checked, ["negative", "positive"])}
    assert survivors[0]["federation_rows"] == len(sites[0].X) + len(sites[2].X)


def test_an_implausible_histogram_fails_the_job_at_every_member_naming_the_sum(monkeypatch) -> None:
    from fedpeer.jobs.kind import ImplausibleTotal
    from fedpeer.kinds.tree.site import TreeSite

    X, y = load_breast_cancer(return_X_y=True)
    sites = _sites(X, y, y.astype(np.int8))
    honest = TreeSite.level_vector

    def lying(self, growth):
        vector = honest(self, growth)
        if self.X.shape[0] == len(sites[1].X) and np.array_equal(self.X, sites[1].X):
            vector = vector.copy()
            vector[0] += np.uint64(10**6)       # a million rows of class 0 in the first bin
        return vector

    monkeypatch.setattr(TreeSite, "level_vector", lying)
    results, _ = _run(sites, {"max_depth": 3, "test_fraction": 0.0, "secure_sum": "ring"})
    assert all(isinstance(r, ImplausibleTotal) for r in results), results
    assert "secure sum 'tree/e0/d0'" in str(results[0]) and "site-" not in str(results[0])
