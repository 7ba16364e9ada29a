"""The `logreg` job (fedpeer/kinds/linear/logreg.py), every member in one process over the in-memory network
in virtual time: every member ends with the same coefficients, bit for bit those of the same pure
functions on the sites' rows in one process, and equal to scikit-learn's LogisticRegression on the
pooled standardised rows to 1e-5 relative; by default each site's held-out part (test_fraction)
is never trained on and is what the federated evaluation counts; a site lacking a class is reported; extreme values and
non-finite terms end the job naming what to change; a member lost mid-fit leaves the survivors
with the pooled model of their own rows."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext
from fedpeer.kinds.linear import logreg
from fedpeer.ml.linear import logistic as linear
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.members import after_step, member_keys, run_members


def dataset(X: np.ndarray, labels: np.ndarray, positive: str | None = "1") -> Dataset:
    features = tuple(f"f{j}" for j in range(X.shape[1]))
    X = np.ascontiguousarray(X, dtype=np.float64)
    labels = np.asarray([str(v) for v in labels])
    y = (labels == positive).astype(np.int8) if positive is not None else None
    return Dataset(features, X, y, labels, 0, schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features)))


def split(X: np.ndarray, y: np.ndarray, sizes: list[int], seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rows = np.random.default_rng(seed).permutation(len(y))
    cuts = np.cumsum(sizes)[:-1]
    return [(X[p], y[p]) for p in np.split(rows, cuts)]


async def _inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def run(sites: list[Dataset], params: dict, crash_at_step: int | None = None, victim: int = 1,
        tests: list[Dataset] | None = None, module: Any = logreg) -> tuple[list, list[bytes]]:
    """Every member's result (or exception) of a job of `module`'s kind (logreg, mlp). Unless
    `params` say otherwise, test_fraction = 0: these tests compare with fits on the pooled rows
    (the kinds' default, 0.2 held out: test_held_out_parts_are_evaluated_and_never_trained_on)."""
    keys, names = member_keys("lr", len(sites))
    checked = module.KIND.check_params({"test_fraction": 0.0, **params})

    def member(net: MemoryNetwork, i: int, k: bytes):
        return module.run_job(net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i],
                                                                  test_data=tests[i] if tests else None),
                              offload=_inline)

    crash = after_step(crash_at_step) if crash_at_step is not None else None
    return run_members(keys, member, crash, victim), keys


def fixed_point_sum(vectors: list[np.ndarray], fixed: Any = logreg.TERMS) -> np.ndarray:
    """What the secure sum computes: the encodings added modulo 2^64, decoded."""
    n = len(vectors)
    total = np.sum([fixed.encode(v, n) for v in vectors], axis=0, dtype=np.uint64)
    return fixed.decode(total)


def sklearn_fit(X: np.ndarray, y: np.ndarray, C: float) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn on the pooled rows standardised as StandardScaler does, converged tightly."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = LogisticRegression(C=C, solver="newton-cholesky", tol=1e-14, max_iter=10_000)
        m.fit(StandardScaler().fit_transform(X), y)
    return m.coef_, m.intercept_


def close(got: Any, want: np.ndarray, rtol: float = 1e-5) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


def test_binary_breast_cancer_equals_sklearn_and_the_in_process_reference() -> None:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    parts = split(X, y, [300, 150, 80, 39])
    sites = [dataset(Xs, ys) for Xs, ys in parts]
    params = {"C": 0.5, "tol": 1e-10, "secure_sum": "ring"}
    results, _ = run(sites, params)
    assert all(isinstance(r, dict) for r in results), results
    assert len({str(r["coef"]) + str(r["intercept"]) for r in results}) == 1   # every member: the same model
    r = results[0]
    assert r["solver"] == "newton" and r["status"] == "converged" and r["lost"] == []
    assert np.asarray(r["coef"]).shape == (1, 30) and len(r["intercept"]) == 1
    assert r["secure_sums"] == 2 + r["evaluations"] + 1        # moments, spread, one per evaluation, eval
    # the same pure functions in one process, summed as the secure sum sums: bit for bit
    fit, mean, scale = linear.fit_in_process([(Xs, ys.astype(np.int64)) for Xs, ys in parts], 1, 0.5, tol=1e-10,
                                             add=fixed_point_sum,
                                             add_columns=lambda v: fixed_point_sum(v, logreg.MOMENTS))
    assert r["coef_standardised"] == fit.W[:, :-1].tolist() and r["iterations"] == fit.iterations
    # scikit-learn on the pooled rows
    coef, intercept = sklearn_fit(X, y, 0.5)
    close(r["coef_standardised"], coef)
    close(r["intercept_standardised"], intercept)
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(X)
    close(r["coef"], coef / sc.scale_)                                  # folded back to the original units
    close(r["intercept"], intercept - (coef / sc.scale_) @ sc.mean_)
    # history: the federated log-loss falls to the end; the final model is evaluated by secure sum
    losses = [h["loss"] for h in r["history"]]
    assert losses[0] == pytest.approx(np.log(2)) and losses[-1] < 0.1
    assert r["federated_eval"]["auc"] > 0.99 and r["auc_source"].startswith("federated")
    # the exported coefficients give scikit-learn's predictions
    model = logreg.to_sklearn(r["sklearn"])
    assert np.allclose(model.predict_proba(X)[:, 1], linear.predict_proba(np.asarray(r["coef"]),
                                                                          np.asarray(r["intercept"]), X))


def test_multinomial_with_a_site_lacking_a_class_equals_sklearn() -> None:
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    # site 1 holds rows of class 0 only: non-IID, and fine for exact mode
    no2 = np.flatnonzero(y != 2)
    rest = np.setdiff1d(np.arange(len(y)), no2[:40])
    parts = [(X[no2[:40]], y[no2[:40]])] + split(X[rest], y[rest], [60, len(rest) - 60])
    sites = [dataset(Xs, ys, positive=None) for Xs, ys in parts]
    tests = [dataset(X[::3], y[::3], positive=None)] * 3
    results, _ = run(sites, {"C": 2.0, "classes": "0,1,2", "tol": 1e-10, "secure_sum": "pairwise"}, tests=tests)
    assert all(isinstance(r, dict) for r in results), results
    assert len({str(r["coef"]) for r in results}) == 1
    coef, intercept = sklearn_fit(X, y, 2.0)
    r = results[0]
    close(r["coef_standardised"], coef)
    close(r["intercept_standardised"], intercept)
    assert np.asarray(r["coef"]).shape == (3, 13)
    assert r["class_counts"] == {"0": 59, "1": 71, "2": 48}
    absent = {tuple(x["classes_absent_here"]) for x in results}
    assert absent == {("1", "2"), ()}, absent      # site 1 holds class 0 only
    assert r["test_csv"]["auc"] > 0.99 and r["auc_source"] == "[data] test_csv"
    assert all(h["test_auc"] is not None for h in r["history"][1:])


def test_lbfgs_reaches_the_same_coefficients() -> None:
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    parts = split(X, y, [70, 50, 30])
    sites = [dataset(Xs, ys, positive=None) for Xs, ys in parts]
    results, _ = run(sites, {"C": 1.0, "classes": "0,1,2", "solver": "lbfgs", "tol": 1e-10, "max_iter": 500,
                             "secure_sum": "ring"})
    assert all(isinstance(r, dict) for r in results), results
    r = results[0]
    assert r["solver"] == "lbfgs" and r["status"] == "converged"
    coef, intercept = sklearn_fit(X, y, 1.0)
    close(r["coef_standardised"], coef)
    close(r["intercept_standardised"], intercept)


def test_extreme_values_and_non_finite_terms_name_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    parts = split(X, y, [200, 200, 169])
    huge = parts[1][0].copy()
    huge[0, 3] = 1e18          # a column sum beyond the fixed point's bound
    sites = [dataset(*parts[0]), dataset(huge, parts[1][1]), dataset(*parts[2])]
    results, _ = run(sites, {"secure_sum": "ring"})
    assert all(isinstance(r, JobError) for r in results), results
    assert any("'f3'" in str(r) and "rescale" in str(r) for r in results), results

    real = linear.local_terms

    def diverged(Z: np.ndarray, y: np.ndarray, W: np.ndarray, hessian: bool) -> np.ndarray:
        out = real(Z, y, W, hessian)
        return out * np.inf if len(y) == 200 and np.abs(W).max() > 0 else out

    monkeypatch.setattr(linear, "local_terms", diverged)
    results, _ = run([dataset(*p) for p in parts], {"secure_sum": "ring"})
    assert all(isinstance(r, JobError) for r in results), results
    assert any("lower C" in str(r) for r in results), results


@pytest.mark.parametrize("secure_sum", ["ring", "allreduce"])     # allreduce: the default, all to all
def test_a_member_lost_mid_fit_leaves_the_survivors_with_their_pooled_model(secure_sum: str) -> None:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    parts = split(X, y, [200, 200, 169])
    sites = [dataset(*p) for p in parts]
    results, keys = run(sites, {"C": 1.0, "tol": 1e-10, "secure_sum": secure_sum}, crash_at_step=2, victim=1)
    survivors = [r for r in results if isinstance(r, dict)]
    assert len(survivors) == 2, results
    assert all(r["lost"] == ["site-2"] and r["members"] == ["site-1", "site-3"] for r in survivors)
    assert len({str(r["coef"]) for r in survivors}) == 1
    # the victim is keys[1]; the survivors' rows are sites 0 and 2 in key order
    kept = [parts[i] for i in (0, 2)]
    coef, intercept = sklearn_fit(np.vstack([p[0] for p in kept]), np.concatenate([p[1] for p in kept]), 1.0)
    close(survivors[0]["coef_standardised"], coef)


@settings(max_examples=6, deadline=None)
@given(poison=st.floats(1e7, 1e12), entry=st.sampled_from(["loss", "gradient", "hessian"]), member=st.integers(0, 2))
def test_a_poisoned_contribution_ends_the_exact_fit_everywhere_and_no_model_is_kept(poison: float, entry: str,
                                                                                   member: int) -> None:
    """One member adds `poison` to its summed loss, gradient or Hessian terms: every member fails the
    job naming the sum and the check (never a LinAlgError or a traceback); no model is kept."""
    from fedpeer.jobs.kind import ImplausibleTotal
    from fedpeer.ml.blas import one_blas_thread
    from fedpeer.ml.linear import logistic as linear

    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    sites = [dataset(Xs, ys) for Xs, ys in split(X, y, [200, 200, 169])]
    keys, names = member_keys("lr", 3)
    checked = logreg.KIND.check_params({"max_iter": 20, "solver": "newton"})

    def offload_for(i: int):
        async def offload(fn, *args):
            out = await _inline(fn, *args)
            step = args[0] if fn is one_blas_thread else fn
            if i == member and step is linear.local_terms:
                out = out.copy()
                where = {"loss": 0, "gradient": 1, "hessian": len(out) - 1}[entry]   # the last: a diagonal entry
                out[where] += -poison if entry == "loss" else poison
            return out
        return offload

    results = run_members(keys, lambda net, i, k: logreg.run_job(
        net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]), offload=offload_for(i)))
    assert not any(isinstance(r, dict) for r in results), "a poisoned total was adopted"
    for r in results:
        assert isinstance(r, ImplausibleTotal), r
        assert "a member's contribution is implausible" in str(r) and "LinAlgError" not in str(r), r
        assert not any(name in str(r) for name in names.values()), r     # no site is blamed


@pytest.mark.parametrize("kind", ["logreg", "logreg-fedavg", "mlp"])
def test_held_out_parts_are_evaluated_and_never_trained_on(kind: str) -> None:
    """The default test_fraction (0.2, as xgboost's): each site keeps a stratified share drawn from
    the job's seed and its key out of training; the federated AUC / log-loss / accuracy are over
    those parts, and say how many rows they are over."""
    from dataclasses import replace

    from sklearn.datasets import load_breast_cancer

    from fedpeer.data.dataset import split_train_test
    from fedpeer.jobs.kind import site_seed
    from fedpeer.kinds.linear import mlp as mlp_job

    X, y = load_breast_cancer(return_X_y=True)
    sites = [dataset(Xs, ys) for Xs, ys in split(X, y, [300, 150, 119])]
    module = mlp_job if kind == "mlp" else logreg
    params = {"C": 0.5, "tol": 1e-10, "secure_sum": "ring", "seed": 7, "test_fraction": None}
    params = {k: v for k, v in params.items() if v is not None and k in module.PARAMS}
    if kind != "logreg":
        params.update({"rounds": 4, "learning_rate": 0.1} | ({"mode": "fedavg"} if kind == "logreg-fedavg" else {}))
    assert module.KIND.check_params(params)["test_fraction"] == 0.2 == module.PARAMS["test_fraction"].default
    results, keys = run(sites, {**params, "test_fraction": 0.2}, module=module)
    assert all(isinstance(r, dict) for r in results), results
    parts = [split_train_test(replace(ds, y=ds.y.astype(np.int64)), 0.2, seed=site_seed(7, k), stratify=True)
             for ds, k in zip(sites, keys)]
    train_rows, test_rows = sum(len(t.y) for t, _ in parts), sum(len(h.y) for _, h in parts)
    assert test_rows == sum(round(ds.X.shape[0] * 0.2) for ds in sites)
    for r in results:
        assert r["rows"] == train_rows and r["test_rows"] == test_rows and r["test_fraction"] == 0.2
        assert r["federated_eval"]["rows"] == test_rows and "held-out" in r["federated_eval"]["on"]
        assert "held-out" in r["auc_source"] and r["auc"] == r["federated_eval"]["auc"] > 0.9
    if kind == "logreg":     # trained on the training parts alone: scikit-learn on those, pooled
        coef, intercept = sklearn_fit(np.vstack([t.X for t, _ in parts]), np.concatenate([t.y for t, _ in parts]), 0.5)
        close(results[0]["coef_standardised"], coef)
        close(results[0]["intercept_standardised"], intercept)
    else:                    # every round's evaluation is over the held-out rows
        assert all(h["rows"] == test_rows for h in results[0]["history"])
