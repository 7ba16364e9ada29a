"""FedAvg over secure sums (fedpeer/kinds/linear/fedavg.py): `logreg` mode `fedavg` and the `mlp` job,
every member in one process over the in-memory network in virtual time. Every member ends with
the same weights; two-level groups average inside groups and save federation-wide averages; a
diverging learning rate ends the job naming learning_rate; the MLP's weights are MLPClassifier's;
a member crashed mid-job leaves the survivors done with one model: the same pure functions in one
process, with the lost member's rows in every average before the first one that went without it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedpeer.errors import JobError
from fedpeer.jobs.kind import site_seed
from fedpeer.kinds.linear import logreg
from fedpeer.kinds.linear import mlp as mlp_job
from fedpeer.kinds.linear.fedavg import sgd_epochs
from fedpeer.ml.linear import logistic as linear
from fedpeer.ml.linear import mlp
from tests.sim.test_logreg_job import dataset, fixed_point_sum, run, split


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
    assert r["fedavg"] == {"rounds": 12, "global_averages": 12, "global_averages_saved": 0, "groups": [],
                           "lost_at_round": {}}
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
    from fedpeer.app.cli import format_job
    from fedpeer.kinds.linear.text import site_table as logreg_table

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


# ---------------------------------------------------------------------------------------------
# A member lost mid-job: the rounds go on over the survivors


def reference(trainers: list, rows: list[int], initial: np.ndarray, rounds: int, groups: list[list[int]],
              every: int, lost_at: dict[int, int]) -> np.ndarray:
    """FedAvg in one process, as fedpeer/kinds/linear/fedavg.py defines it after a loss: `trainers[i](w)`
    is site i's local training (its own seeded state, called once per round), the averages are
    summed as the secure sum sums (fixed point, modulo 2^64), and site i's rows count in every
    average before round lost_at[i]."""
    w = [initial.copy() for _ in trainers]
    for r in range(rounds):
        federation = not groups or (r + 1) % every == 0 or r == rounds - 1
        local = [trainers[i](w[i]) if lost_at.get(i, rounds + 1) > r else None for i in range(len(trainers))]
        for scope in [list(range(len(trainers)))] if federation else groups:
            kept = [i for i in scope if local[i] is not None]
            if not kept:
                continue
            sums = fixed_point_sum([np.concatenate([rows[i] * local[i].ravel(), [rows[i]]]) for i in kept])
            for i in kept:
                w[i] = (sums[:-1] / sums[-1]).reshape(initial.shape)
    return w[next(i for i in range(len(trainers)) if i not in lost_at)]


def lost_member(results: list, keys: list[bytes], victim: int) -> tuple[list[dict], int]:
    """The survivors' results, checked to agree on who was lost; the first round averaged without it."""
    survivors = [r for r in results if isinstance(r, dict)]
    assert len(survivors) == len(results) - 1 and isinstance(results[victim], BaseException), results
    name = f"site-{victim + 1}"
    assert all(r["lost"] == [name] and name not in r["members"] and len(r["members"]) == len(results) - 1
               for r in survivors), [(r["lost"], r["members"]) for r in survivors]
    assert all(r["status"] == "rounds done" for r in survivors)
    return survivors, min(r["fedavg"]["lost_at_round"][name] for r in survivors)


@pytest.mark.parametrize(("groups", "victim", "secure_sum"), [
    ("", 2, "ring"),
    ("site-1,site-2; site-3,site-4", 1, "ring"),         # lost in a group round: its group mate knows first
])
def test_logreg_fedavg_goes_on_over_the_survivors_of_a_crash(groups: str, victim: int, secure_sum: str) -> None:
    sites = breast_cancer_sites([300, 150, 80, 39])
    params = {"C": 1.0, "mode": "fedavg", "rounds": 10, "learning_rate": 0.1, "secure_sum": secure_sum,
              "groups": groups, "global_every": 4, "seed": 3}
    results, keys = run(sites, params, crash_at_step=3, victim=victim)
    survivors, lost_at = lost_member(results, keys, victim)
    assert 2 <= lost_at <= 4, lost_at
    assert len({str(r["coef"]) + str(r["intercept"]) for r in survivors}) == 1
    r = survivors[0]
    assert r["iterations"] == 10 and r["fedavg"]["global_averages"] == (10 if not groups else 3)
    seen = sorted(x["fedavg"]["lost_at_round"][f"site-{victim + 1}"] for x in survivors)
    if groups:       # its group mate averaged without it at once, the other group from the next federation round
        assert seen == [lost_at, 3, 3] and lost_at == 2, seen
        assert [x["fedavg"]["groups"] for x in survivors][0] == [["site-1"], ["site-3", "site-4"]]
    # the history's rows drop to the survivors' from the round of the loss
    rows = [h["rows"] for h in r["history"] if h["scope"] == "federation"]
    assert rows[-1] == 569 - len(sites[victim].y) and (groups or rows[0] == 569)

    mean, scale, n = np.asarray(r["mean"]), np.asarray(r["scale"]), r["rows"]
    assert n == 569           # the standardisation of every member's rows at the start

    def trainer(i: int):
        Z = linear.design(sites[i].X, mean, scale)
        y = np.asarray(sites[i].y, dtype=np.int64)
        rng = np.random.default_rng(site_seed(3, keys[i]))
        return lambda w: sgd_epochs(Z, y, w, 1.0, n, 0.1, 1, 32, rng)

    spec = [[0, 1], [2, 3]] if groups else []
    want = reference([trainer(i) for i in range(4)], [len(s.y) for s in sites], np.zeros((1, 31)), 10, spec, 4,
                     {victim: lost_at})
    assert r["coef_standardised"] == want[:, :-1].tolist() and r["intercept_standardised"] == want[:, -1].tolist()


def test_mlp_with_groups_goes_on_when_a_group_loses_its_last_member() -> None:
    """Groups site-1,site-2 | site-3 | site-4: site-3, alone in its group, crashes; the others find it
    missing from the next federation-wide sum, and its group is gone."""
    sites = breast_cancer_sites([250, 150, 100, 69])
    params = {"rounds": 8, "learning_rate": 0.05, "hidden_layer_sizes": "6", "secure_sum": "pairwise",
              "groups": "site-1,site-2;site-3;site-4", "global_every": 3, "seed": 5}
    results, keys = run(sites, params, crash_at_step=2, victim=2, module=mlp_job)
    survivors, lost_at = lost_member(results, keys, 2)
    assert lost_at in (2, 5), lost_at          # federation rounds: 3rd, 6th, 8th (0-based 2, 5, 7)
    assert len({str(r["coefs"]) + str(r["intercepts"]) for r in survivors}) == 1
    r = survivors[0]
    assert r["fedavg"]["groups"] == [["site-1", "site-2"], [], ["site-4"]]
    assert r["rows"] == 569 and r["history"][-1]["rows"] == 569 - 100
    assert "members lost: site-3" in show("mlp", r)

    mean, scale = np.asarray(r["mean"]), np.asarray(r["scale"])
    sizes = r["layer_sizes"]

    def trainer(i: int):
        t = mlp.LocalTrainer((sites[i].X - mean) / scale, np.asarray(sites[i].y, dtype=np.int64), sizes, 1, 0.05,
                             32, 1e-4, site_seed(5, keys[i]))
        return lambda w: t.train(w, 1)

    want = reference([trainer(i) for i in range(4)], [len(s.y) for s in sites], mlp.initial_weights(sizes, 5), 8,
                     [[0, 1], [2], [3]], 3, {2: lost_at})
    coefs, intercepts = mlp.unflatten(want, sizes)
    assert r["coefs"] == [c.tolist() for c in coefs] and r["intercepts"] == [b.tolist() for b in intercepts]
    assert logreg.TERMS.limbs == 3
