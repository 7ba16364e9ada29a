"""FedAvg over secure sums (fedpeer/jobs/fedavg.py): `logreg` mode `fedavg` and the `mlp` job,
every member in one process over the in-memory network in virtual time. Every member ends with
the same weights; two-level groups average inside groups and save federation-wide averages; a
diverging learning rate ends the job naming learning_rate; the MLP's weights are MLPClassifier's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedpeer.errors import JobError
from fedpeer.jobs import mlp as mlp_job
from fedpeer.ml import mlp
from tests.sim.test_logreg_job import dataset, run, split


def breast_cancer_sites(sizes: list[int]) -> list:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return [dataset(Xs, ys) for Xs, ys in split(X, y, sizes)]


def test_logreg_fedavg_approaches_the_exact_model_and_groups_save_global_averages() -> None:
    sites = breast_cancer_sites([300, 150, 80, 39])
    exact, _ = run(sites, {"C": 1.0, "secure_sum": "ring"})
    flat, _ = run(sites, {"C": 1.0, "mode": "fedavg", "rounds": 12, "learning_rate": 0.1, "secure_sum": "ring"})
    grouped, _ = run(sites, {"C": 1.0, "mode": "fedavg", "rounds": 12, "learning_rate": 0.1, "secure_sum": "ring",
                             "groups": "site-1,site-2; site-3,site-4", "global_every": 4})
    for results in (flat, grouped):
        assert all(isinstance(r, dict) for r in results), results
        assert len({str(r["coef"]) + str(r["intercept"]) for r in results}) == 1
    r, g = flat[0], grouped[0]
    assert r["mode"] == "fedavg" and r["iterations"] == 12 and np.asarray(r["coef"]).shape == (1, 30)
    losses = [h["logloss"] for h in r["history"]]
    assert len(losses) == 13 and losses[0] == pytest.approx(np.log(2), abs=1e-6) and losses[-1] < losses[1]
    centralised = exact[0]["federated_eval"]["logloss"]
    assert centralised < losses[-1] < 2 * centralised + 0.05
    assert r["fedavg"] == {"rounds": 12, "global_averages": 12, "global_averages_saved": 0, "groups": []}
    assert g["fedavg"]["global_averages"] == 3 and g["fedavg"]["global_averages_saved"] == 9
    assert g["fedavg"]["groups"] == [["site-1", "site-2"], ["site-3", "site-4"]]
    scopes = [h["scope"] for h in g["history"]]
    assert scopes[3] == "federation" and scopes[4].startswith("group") and scopes[-1] == "federation"
    # the two groups' members saw their own group's figures in group rounds
    assert {x["history"][0]["rows"] for x in grouped} == {450, 119}
    shown = show("logreg", g)
    assert "3 federation-wide averages, 9 saved" in shown and "group 1" in shown and "(intercept)" in shown


def show(kind: str, result: dict) -> str:
    """`fedpeer job` and the harness table for one member's result."""
    from fedpeer.cli import format_job
    from fedpeer.harness import logreg_table

    result = {k: v for k, v in result.items() if k != "_model"}
    table = logreg_table([{"name": "site-1", "rows": 10, "state": "done", "result": result}])
    assert "rounds done" in table
    return format_job({"id": "j", "kind": kind, "state": "done", "proposer": "site-1", "members": [],
                       "phase": "done", "progress": {"step": 1, "total": 1}, "params": {}, "result": result})


def test_mlp_weights_are_mlpclassifier_weights_and_groups_work_multinomial() -> None:
    from sklearn.datasets import load_iris
    from sklearn.neural_network import MLPClassifier

    sites = breast_cancer_sites([250, 200, 119])
    results, _ = run(sites, {"rounds": 8, "learning_rate": 0.05, "hidden_layer_sizes": "8", "secure_sum": "ring"},
                     module=mlp_job)
    assert all(isinstance(r, dict) for r in results), results
    assert len({str(r["coefs"]) for r in results}) == 1
    r = results[0]
    assert r["layer_sizes"] == [30, 8, 1] and r["federated_eval"]["auc"] > 0.98
    assert "MLP 30-8-1 by FedAvg, 8 rounds" in show("mlp", r)
    # scikit-learn's MLPClassifier with these weights predicts what fedpeer predicts
    coefs, intercepts = [np.asarray(c) for c in r["coefs"]], [np.asarray(b) for b in r["intercepts"]]
    X = (sites[0].X - np.asarray(r["mean"])) / np.asarray(r["scale"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # a throw-away fit that only builds the network
        clf = MLPClassifier(hidden_layer_sizes=(8,), max_iter=1).fit(X[:20], sites[0].y[:20])
    clf.coefs_, clf.intercepts_ = coefs, intercepts
    assert np.allclose(clf.predict_proba(X)[:, 1], mlp.predict_proba(coefs, intercepts, X), rtol=0, atol=1e-12)

    X, y = load_iris(return_X_y=True)
    parts = split(X, y, [60, 50, 40])
    sites = [dataset(Xs, ys, positive=None) for Xs, ys in parts]
    results, _ = run(sites, {"rounds": 6, "learning_rate": 0.1, "classes": "0,1,2", "groups": "site-1;site-2,site-3",
                             "global_every": 3, "secure_sum": "ring"}, module=mlp_job)
    assert all(isinstance(r, dict) for r in results), results
    assert len({str(r["coefs"]) for r in results}) == 1
    assert results[0]["layer_sizes"] == [4, 16, 3] and results[0]["fedavg"]["global_averages_saved"] == 4


def test_a_diverging_learning_rate_and_bad_groups_end_the_job_naming_what_to_change() -> None:
    sites = breast_cancer_sites([200, 200, 169])
    results, _ = run(sites, {"C": 1e-6, "mode": "fedavg", "rounds": 3, "learning_rate": 100.0, "secure_sum": "ring"})
    assert all(isinstance(r, JobError) for r in results), results
    assert any("lower learning_rate" in str(r) for r in results), results
    results, _ = run(sites, {"mode": "fedavg", "groups": "site-1,site-9;site-2,site-3", "secure_sum": "ring"})
    assert all(isinstance(r, JobError) and "'site-9' is not a member" in str(r) for r in results), results
    results, _ = run(sites, {"mode": "fedavg", "groups": "site-1;site-2", "secure_sum": "ring"})
    assert all(isinstance(r, JobError) and "in no group" in str(r) for r in results), results
    results, _ = run(sites, {"groups": "site-1;site-2,site-3", "secure_sum": "ring"})
    assert all(isinstance(r, JobError) and "groups is for mode fedavg" in str(r) for r in results), results


def test_the_mlp_model_file_round_trips_and_refuses_what_fedpeer_did_not_store(tmp_path) -> None:
    sizes = [3, 4, 1]
    coefs, intercepts = mlp.unflatten(mlp.initial_weights(sizes, 1), sizes)
    model = {"coefs": coefs, "intercepts": intercepts, "mean": np.zeros(3), "scale": np.ones(3),
             "features": ["a", "b", "c"], "classes": []}
    path = tmp_path / "model.npz"
    mlp_job.save_model(path, model)
    loaded = mlp_job.load_model(path)
    X = np.random.default_rng(0).normal(size=(5, 3))
    assert np.allclose(mlp_job.predict(loaded, X), mlp.predict_proba(coefs, intercepts, X))
    assert mlp_job.export(loaded)["out_activation_"] == "logistic"
    mlp_job.save_model(path, {**model, "coefs": [coefs[0], np.ones((5, 1))]})     # shapes that do not chain
    with pytest.raises(JobError, match="not an mlp model"):
        mlp_job.load_model(path)
