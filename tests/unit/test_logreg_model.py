"""The logreg model file (validated arrays, never unpickled), its scikit-learn export, and how
`fedpeer job` and the harness show a logreg result."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from fedpeer.errors import JobError
from fedpeer.kinds.linear import logreg
from fedpeer.ml.linear import logistic as linear

MODEL = {"coef": np.array([[0.5, -1.0, 2.0]]), "intercept": np.array([0.25]), "features": ["a", "b", "c"],
         "classes": []}


def test_the_model_round_trips_and_predicts_as_scikit_learn(tmp_path: Path) -> None:
    path = tmp_path / "model.npz"
    logreg.save_model(path, MODEL)
    model = logreg.load_model(path)
    assert model["features"] == ("a", "b", "c") and model["classes"] == []
    X = np.random.default_rng(0).normal(size=(20, 3))
    exported = logreg.to_sklearn(linear.sklearn_export(model["coef"], model["intercept"], [], ["a", "b", "c"]))
    assert np.allclose(exported.predict_proba(X)[:, 1], logreg.predict(model, X), rtol=0, atol=1e-15)
    multi = {**MODEL, "coef": np.eye(3), "intercept": np.zeros(3), "classes": ["x", "y", "z"]}
    logreg.save_model(path, multi)
    p = logreg.predict(logreg.load_model(path), X)
    assert p.shape == (20, 3) and np.allclose(p.sum(axis=1), 1.0)


@pytest.mark.parametrize("change", ["shape", "nan", "object", "version", "classes"])
def test_a_model_file_that_is_not_what_fedpeer_stored_is_refused(tmp_path: Path, change: str) -> None:
    arrays = {"version": np.array([logreg.MODEL_VERSION]), "coef": MODEL["coef"], "intercept": MODEL["intercept"],
              "features": np.array('["a", "b", "c"]'), "classes": np.array("[]")}
    if change == "shape":
        arrays["coef"] = np.ones((2, 3))
    elif change == "nan":
        arrays["coef"] = np.array([[np.nan, 1.0, 1.0]])
    elif change == "object":
        arrays["coef"] = np.array([[{"x": 1}, 1.0, 1.0]], dtype=object)   # would need pickle to load
    elif change == "version":
        arrays["version"] = np.array([99])
    else:
        arrays["classes"] = np.array('["x", 3]')
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path = tmp_path / "model.npz"
    path.write_bytes(buf.getvalue())
    with pytest.raises(JobError, match="not a logreg model fedpeer stored"):
        logreg.load_model(path)


def test_newton_is_refused_beyond_its_hessian_limit_and_auto_falls_back() -> None:
    big = linear.Problem(d=500, groups=3, C=1.0)
    assert linear.choose_solver(big, "auto") == "lbfgs"
    with pytest.raises(ValueError, match="use solver lbfgs"):
        linear.choose_solver(big, "newton")
    assert linear.choose_solver(linear.Problem(d=500, groups=1, C=1.0), "auto") == "newton"


def test_non_finite_totals_raise_non_finite() -> None:
    problem = linear.Problem(d=2, groups=1, C=1.0)
    fit = linear.start(problem, "newton", 1e-8, 10, n=5)
    totals = np.full(problem.terms_size(True), np.inf)
    with pytest.raises(linear.NonFinite):
        linear.advance(fit, totals)


def test_job_and_harness_show_a_logreg_result() -> None:
    from fedpeer.app.cli import format_job
    from fedpeer.kinds.linear.text import site_table as logreg_table

    result = {"mode": "exact", "solver": "newton", "C": 1.0, "status": "converged", "iterations": 2,
              "secure_sums": 6, "members": ["site-1", "site-2"], "lost": [], "auc": 0.98, "auc_source": "x",
              "classes_absent_here": ["1"], "classes": [], "features": ["a", "b"], "coef": [[1.0, -2.0]],
              "intercept": [0.5], "history": [{"iteration": 0, "loss": 0.69, "grad_max": 0.3, "step": 0.0},
                                              {"iteration": 1, "loss": 0.2, "grad_max": 1e-9, "step": 1.0,
                                               "test_auc": 0.97}]}
    shown = format_job({"id": "j", "kind": "logreg", "state": "done", "proposer": "site-1", "members": [],
                        "phase": "done", "progress": {"step": 2, "total": 100}, "params": {}, "result": result})
    assert "converged after 2 iterations" in shown and "lack class(es) 1" in shown and "0.9700" in shown
    assert "(intercept)" in shown
    table = logreg_table([{"name": "site-1", "rows": 10, "state": "done", "result": result},
                          {"name": "site-2", "rows": None, "state": "failed", "result": None}])
    assert "converged" in table and "0.200000" in table and "failed" in table
