"""The `tree` job in mode icdta (fedpeer/kinds/tree/icdta.py), three members in one process over
the in-memory network in virtual time: every member stores byte for byte the global tree the same
pure steps give in one process (fedpeer/ml/tree/icdta.py `aggregate_in_process`), with its AUC; a
member whose tree is malformed has it dropped everywhere and nobody fails; a poisoned scores sum
fails the job at every member naming the sum."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_breast_cancer, load_wine

from fedpeer.jobs.kind import ImplausibleTotal, JobContext, site_seed
from fedpeer.kinds.tree import icdta as icdta_kind
from fedpeer.kinds.tree import job as tree_job
from fedpeer.kinds.tree import kind as tree_kind
from fedpeer.ml.tree import icdta
from fedpeer.ml.tree.model import load_model, model_bytes
from fedpeer.protocols import epochs
from fedpeer.testing.members import member_keys, poisoned_sums, run_members
from tests.sim.test_tree_job import SITES, _inline, _sites


def _run(sites: list, params: dict) -> tuple[list, dict, list[bytes]]:
    keys, names = member_keys("tree", len(sites))
    checked = tree_kind.KIND.check_params({"mode": "icdta", **params})

    def member(net, i: int, k: bytes):
        return tree_kind.run(net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]), _inline)

    return run_members(keys, member), checked, keys


def _reference(sites: list, checked: dict, keys: list[bytes], classes: list[str]) -> bytes:
    """The global tree of the same pure steps in one process (test_fraction 0: every row scores and trains)."""
    parts = [(s.X, tree_job.site_labels(s, checked)) for s in sites]
    k = len(classes)
    trees = [icdta.local_tree(X, y, k, checked["criterion"], checked["max_depth"], checked["min_leaf_rows"],
                              checked["ccp_alpha"], site_seed(checked["seed"], key))
             for (X, y), key in zip(parts, keys)]
    cart, _, _, _ = icdta.aggregate_in_process(trees, parts, parts, k, checked["criterion"],
                                               checked["icdta_threshold"])
    return model_bytes(cart, list(sites[0].features), classes)


def test_every_member_stores_the_same_global_tree_with_its_auc() -> None:
    X, y = load_breast_cancer(return_X_y=True)
    sites = _sites(X, y, y.astype(np.int8))
    results, checked, keys = _run(sites, {"max_depth": 3, "min_leaf_rows": 2, "test_fraction": 0.0,
                                          "icdta_threshold": 0.5, "secure_sum": "ring"})
    assert all(isinstance(r, dict) for r in results), results
    assert {r["_model"] for r in results} == {_reference(sites, checked, keys, ["negative", "positive"])}
    r = results[0]
    assert r["mode"] == "icdta" and r["auc"] > 0.9 and r["secure_sums"] == 3 and r["lost"] == []
    assert r["icdta"]["trees_kept"] == ["site-1", "site-2", "site-3"] and r["icdta"]["rules_kept"] == len(r["rules"])
    assert all(t["held_by_every_member"] and t["scored_rows"] > 0 for t in r["icdta"]["trees"].values())
    assert r["federation_rows"] == len(X) and load_model(r["_model"])[0].n_leaves == r["n_leaves"]
    lines = tree_kind.KIND.describe({k: v for k, v in r.items() if k != "_model"})
    assert lines[0].startswith("  tree (icdta): 3 local trees, kept site-1, site-2, site-3 (accuracy >= 0.5)")
    rules = [line for line in lines if line.startswith("    if ")]
    assert rules and "training row" in rules[-1]
    assert all(line.startswith("    if ") or line.startswith("    * ") for line in lines[lines.index(rules[0]):])


def test_multi_class_with_a_test_part_and_the_mean_filter() -> None:
    X, y = load_wine(return_X_y=True)
    names = np.array(["a", "b", "c"])
    sites = _sites(X, names[y], None)
    results, _, _ = _run(sites, {"classes": "a,b,c", "max_depth": 3, "test_fraction": 0.3, "criterion": "entropy"})
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["_model"] for r in results}) == 1
    r = results[0]
    assert 0.5 < r["auc"] <= 1.0 and r["score_source"] == "federated, on the sites' test parts"
    trees, kept = r["icdta"]["trees"], r["icdta"]["trees_kept"]
    for figure in ("accuracy", "macro_f1"):
        mean = sum(t[figure] for t in trees.values()) / len(trees)
        assert all(trees[n][figure] >= mean - 1e-6 for n in kept) and not r["icdta"]["filter_fallback"]
    assert 1 <= len(kept) < 3 or len({t["accuracy"] for t in trees.values()}) == 1


def test_a_member_sending_a_malformed_tree_has_it_dropped_and_nobody_fails(monkeypatch) -> None:
    X, y = load_breast_cancer(return_X_y=True)
    sites = _sites(X, y, y.astype(np.int8))
    keys, _ = member_keys("tree", SITES)
    honest = icdta_kind.IcdtaJob.__init__

    def broken(self, job, own):
        honest(self, job, own)
        if job.ch.me == keys[1]:
            self.doc = {**self.doc, "left": self.doc["left"].copy()}
            self.doc["left"][0] = 10**6         # a child beyond the tree's nodes
    monkeypatch.setattr(icdta_kind.IcdtaJob, "__init__", broken)
    results, _, _ = _run(sites, {"max_depth": 3, "test_fraction": 0.0, "icdta_threshold": 0.5})
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["_model"] for r in results}) == 1 and results[0]["auc"] > 0.9
    for i in (0, 2):
        info = results[i]["icdta"]
        assert "depth-first order" in info["trees_refused"]["site-2"] or "children" in info["trees_refused"]["site-2"]
        assert info["trees_kept"] == ["site-1", "site-3"] and not info["trees"]["site-2"]["held_by_every_member"]
    assert results[1]["icdta"]["trees_refused"] == {} and results[1]["members"] == ["site-1", "site-2", "site-3"]


def test_a_poisoned_scores_sum_fails_the_job_at_every_member_naming_the_sum() -> None:
    X, y = load_breast_cancer(return_X_y=True)
    sites = _sites(X, y, y.astype(np.int8))
    keys, _ = member_keys("tree", SITES)

    def poison(tag: str, vector):
        if "icdta/scores" not in tag:
            return None
        vector = vector.copy()
        vector[-1] += np.uint64(3)          # three more scoring rows than it has
        return vector
    with poisoned_sums(epochs, keys[2], poison) as poisoned:
        results, _, _ = _run(sites, {"max_depth": 3, "test_fraction": 0.0, "secure_sum": "ring"})
    assert poisoned == ["tree/e0/icdta/scores"]
    assert all(isinstance(r, ImplausibleTotal) for r in results), results
    assert "secure sum 'tree/e0/icdta/scores'" in str(results[0]) and "site-" not in str(results[0])


def test_regression_is_refused_in_one_line() -> None:
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    sites = _sites(X, y, None)
    results, _, _ = _run(sites, {"criterion": "squared_error"})
    assert all("mode icdta aggregates classification trees" in str(r) for r in results), results
