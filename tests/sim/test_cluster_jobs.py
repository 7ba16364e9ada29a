"""The `kmeans` and `gmm` jobs (fedpeer/kinds/cluster/kmeans.py, gmm.py), every member in one process over
the in-memory network in virtual time: the federated result equals the in-process reference (the
same pure functions on the pooled rows) to 1e-9 relative, and k-means equals scikit-learn's
KMeans started from the same centres on non-IID make_blobs (each site holds most of one blob)."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.errors import JobError
from fedpeer.jobs.kind import ImplausibleTotal, JobContext
from fedpeer.kinds.cluster import gmm as gj
from fedpeer.kinds.cluster import kmeans as kj
from fedpeer.ml.cluster import kmeans as cl
from fedpeer.ml.cluster import mixture as mx
from fedpeer.testing.members import member_keys, run_members

RTOL = 1e-9


def dataset(X: np.ndarray) -> Dataset:
    features = tuple(f"x{j}" for j in range(X.shape[1]))
    X = np.ascontiguousarray(X, dtype=np.float64)
    X.setflags(write=False)
    return Dataset(features, X, None, np.array([""] * len(X)), 0,
                   schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features)))


def non_iid_blobs(n: int = 1500, d: int = 2, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """make_blobs with 3 blobs; site i holds 80 % of blob i and 10 % of each other blob."""
    from sklearn.datasets import make_blobs
    X, y = make_blobs(n_samples=n, centers=3, n_features=d, random_state=seed, cluster_std=[1.0, 1.5, 0.7])
    rng = np.random.default_rng(seed)
    owner = np.where(rng.random(n) < 0.8, y, (y + rng.integers(1, 3, n)) % 3)
    return X, [X[owner == i] for i in range(3)]


def run(kind, parts: list[np.ndarray], params: dict) -> list:
    keys, names = member_keys("cluster", len(parts))
    checked = kind.KIND.check_params(params)
    return run_members(keys, lambda net, i, k: kind.run_job(
        net.channel(k), checked, JobContext(names[k], names, 2_000, data=dataset(parts[i])), kj._inline))


def same_everywhere(results: list) -> dict:
    assert all(isinstance(r, dict) for r in results), results
    first = {k: v for k, v in results[0].items() if k != "_model"}
    for r in results[1:]:
        assert {k: v for k, v in r.items() if k != "_model"} == first
    return results[0]


def reference(X: np.ndarray, params: dict) -> tuple[cl.Space, cl.Lloyd]:
    p = kj.KIND.check_params(params)
    init = cl.parse_centers(p["init"], p["k"], X.shape[1]) if p["init"] else None
    space, lloyd, _ = cl.reference_kmeans(X, k=p["k"], seed=p["seed"], n_init=p["n_init"],
                                          standardize=p["standardize"], tol=p["tol"], max_iter=p["max_iter"],
                                          fuzziness=p["fuzziness"], init=init)
    return space, lloyd


@pytest.mark.parametrize("params", [
    {"k": 3, "n_init": 4, "seed": 7, "secure_sum": "ring"},
    {"k": 3, "n_init": 2, "seed": 1, "standardize": True},
    {"k": 3, "n_init": 2, "seed": 3, "fuzziness": 2.0, "secure_sum": "ring"},
    {"k": 4, "n_init": 12, "seed": 11},
], ids=["hard", "standardized", "fuzzy", "twelve-restarts"])
def test_federated_kmeans_equals_the_pooled_reference(params: dict) -> None:
    X, parts = non_iid_blobs()
    fed = same_everywhere(run(kj, parts, params))
    space, lloyd = reference(X, params)
    best = lloyd.restarts[lloyd.best()]
    centers = space.back(best.centers)
    order = cl.canonical_order(centers)
    np.testing.assert_allclose(fed["centers"], centers[order], rtol=RTOL)
    np.testing.assert_allclose(fed["inertia"], best.inertia, rtol=RTOL)
    np.testing.assert_allclose([h["inertia"] for h in fed["history"]], best.history, rtol=RTOL)
    assert fed["iterations"] == best.iterations and fed["kept_restart"] == lloyd.best()
    assert fed["cluster_sizes"] == [int(c) for c in best.counts[order]] and sum(fed["cluster_sizes"]) == len(X)
    assert fed["rows"] == len(X) and fed["converged"] and len(fed["participants"]) == 3
    assert fed["secure_sums"] == 1 + max(len(r.history) for r in lloyd.restarts)
    assert fed["centers"] == sorted(fed["centers"])            # canonical order: by first coordinate


@pytest.mark.parametrize("offset", [0.0, 1e6], ids=["near-origin", "far-from-origin"])
def test_federated_kmeans_equals_sklearn_from_the_same_centres(offset: float) -> None:
    """Far from the origin, ‖x‖² - 2x·c + ‖c‖² would lose ~1e-8 of the inertia to cancellation:
    the inertia is summed as Σ (x - c)², as scikit-learn does."""
    from sklearn.cluster import KMeans

    X, parts = non_iid_blobs(n=3000, d=3, seed=4)
    X, parts = X + offset, [p + offset for p in parts]
    init = X[[0, 1, 2]]
    text = ";".join(",".join(repr(float(v)) for v in row) for row in init)
    fed = same_everywhere(run(kj, parts, {"k": 3, "init": text, "n_init": 5, "standardize": False}))
    sk = KMeans(3, init=init, n_init=1, tol=1e-4, max_iter=300).fit(X)
    order = cl.canonical_order(sk.cluster_centers_)
    np.testing.assert_allclose(fed["centers"], sk.cluster_centers_[order], rtol=RTOL)
    np.testing.assert_allclose(fed["inertia"], sk.inertia_, rtol=RTOL)
    assert fed["iterations"] == sk.n_iter_ and fed["restarts"] == 1   # n_init does not apply to explicit centres
    assert fed["cluster_sizes"] == list(np.bincount(sk.labels_)[order])


def test_small_clusters_are_shown_as_below_the_minimum_and_the_model_predicts() -> None:
    X, parts = non_iid_blobs(n=300)
    far = np.array([[40.0, 40.0], [40.5, 40.0]])               # a cluster of 2 rows, at one site
    parts[0] = np.vstack([parts[0], far])
    results = run(kj, parts, {"k": 4, "n_init": 6, "seed": 2, "standardize": False})
    fed = same_everywhere(results)
    assert fed["cluster_sizes"][-1] == "< 5" and fed["centers"][-1] == pytest.approx([40.25, 40.0])
    assert sorted(c for c in fed["cluster_sizes"] if isinstance(c, int)) and sum(
        c for c in fed["cluster_sizes"] if isinstance(c, int)) == 300
    model = results[1]["_model"]
    scored = kj.predict(model, np.array([[40.2, 40.1], fed["centers"][0]]))
    assert [r["cluster"] for r in scored] == [3, 0] and scored[1]["distance"] == pytest.approx(0.0, abs=1e-9)


def test_a_lying_member_fails_the_job_with_the_reason() -> None:
    X, parts = non_iid_blobs(n=300)
    original = cl.Lloyd.local

    def lying(self, Z, labels):
        floats, counts = original(self, Z, labels)
        if Z.shape[0] == parts[1].shape[0]:
            counts = counts + 1                                   # claims rows it does not have
        return floats, counts

    cl.Lloyd.local = lying
    try:
        results = run(kj, parts, {"k": 3, "n_init": 1})
    finally:
        cl.Lloyd.local = original
    assert all(isinstance(r, ImplausibleTotal) and "a member's contribution is implausible" in str(r)
               and "site-" not in str(r) for r in results), results


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_federated_gmm_equals_the_pooled_reference_and_sklearn(covariance: str) -> None:
    from sklearn.mixture import GaussianMixture

    X, parts = non_iid_blobs(n=1500, d=2, seed=5)
    params = {"k": 3, "covariance": covariance, "seed": 3, "n_init": 2, "tol": 1e-6, "max_iter": 200,
              "standardize": False}
    fed = same_everywhere(run(gj, parts, params))
    p = gj.KIND.check_params(params)
    space, lloyd, _ = cl.reference_kmeans(X, **gj._kmeans_params(p) | {"init": None})
    C = lloyd.restarts[lloyd.best()].centers
    labels, _ = cl.nearest(X, C)
    model, history, counts = mx.em_reference(X, C, labels, covariance=covariance, reg_covar=p["reg_covar"],
                                             tol=p["tol"], max_iter=p["max_iter"])
    order = cl.canonical_order(model.means)
    ref = model.reordered(order)
    np.testing.assert_allclose(fed["weights"], ref.weights, rtol=RTOL)
    np.testing.assert_allclose(fed["means"], ref.means, rtol=RTOL)
    np.testing.assert_allclose(fed["covariances"], ref.covariances, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(fed["log_likelihood"], history[-1] * len(X), rtol=RTOL)
    assert fed["iterations"] == len(history) and fed["cluster_sizes"] == list(counts[order])
    # scikit-learn from the same first mixture: within EM's own tolerance
    first = mx.mstep(len(X), mx.local_block(X, None, C, covariance, labels)[0], C, covariance, p["reg_covar"])
    precisions = np.linalg.inv(first.covariances) if covariance == "full" else 1 / first.covariances
    sk = GaussianMixture(3, covariance_type=covariance, weights_init=first.weights, means_init=first.means,
                         precisions_init=precisions, tol=1e-6, max_iter=200).fit(X)
    sk_order = cl.canonical_order(sk.means_)
    np.testing.assert_allclose(fed["means"], sk.means_[sk_order], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fed["mean_log_likelihood"], sk.score(X), rtol=1e-6)
    assert fed["bic"] == pytest.approx(sk.bic(X), rel=1e-6)


def test_gmm_standardized_reports_original_units_and_predicts() -> None:
    X, parts = non_iid_blobs(n=900, d=2, seed=6)
    parts = [p * [1000.0, 0.01] + [5e4, -3.0] for p in parts]     # features on very different scales
    results = run(gj, parts, {"k": 3, "standardize": True, "seed": 1})
    fed = same_everywhere(results)
    pooled = np.vstack(parts)
    assert np.isclose(sum(fed["weights"]), 1.0)
    assert pooled[:, 0].min() < fed["means"][0][0] < fed["means"][-1][0] < pooled[:, 0].max()
    scored = gj.predict((mx.Mixture(**{k: results[0]["_model"][k] for k in ("weights", "means", "covariances")},
                                    covariance="full"), results[0]["_model"]), np.array(fed["means"]))
    assert [r["cluster"] for r in scored] == [0, 1, 2]
    assert all(abs(sum(v for k, v in r.items() if k.startswith("p_")) - 1) < 1e-9 for r in scored)


def moons_and_blobs() -> tuple[np.ndarray, list[np.ndarray]]:
    """make_moons + two make_blobs, non-IID over 3 sites (site i holds 80 % of shape i mod 3)."""
    from sklearn.datasets import make_blobs, make_moons
    Xm, ym = make_moons(600, noise=0.05, random_state=0)
    Xb, yb = make_blobs(400, centers=[[3, 2], [-1.5, 2]], cluster_std=0.15, random_state=0)
    X, y = np.vstack([Xm, Xb]), np.concatenate([ym, yb + 2])
    rng = np.random.default_rng(0)
    owner = np.where(rng.random(len(X)) < 0.8, y % 3, rng.integers(0, 3, len(X)))
    parts = [X[owner == i] for i in range(3)]
    return np.vstack(parts), parts


def test_federated_dbscan_agrees_with_centralized_dbscan() -> None:
    from sklearn.cluster import DBSCAN
    from sklearn.metrics import adjusted_rand_score

    from fedpeer.kinds.cluster import dbscan as dj

    X, parts = moons_and_blobs()
    results = run(dj, parts, {"eps": 0.2, "min_samples": 5, "components": 6, "seed": 1,
                                 "standardize": False, "eps_auto": False})
    fed = same_everywhere(results)
    central = DBSCAN(eps=0.2, min_samples=5).fit_predict(X)
    model = results[2]["_model"]
    model = {**model, "labels": model["labels"].astype(np.int64)}
    labels = np.array([r["cluster"] for p in parts for r in dj.predict(model, p)])
    assert adjusted_rand_score(central, labels) >= 0.9
    assert fed["clusters"] == len(set(central) - {-1}) == 4 and fed["rows"] == len(X)
    assert fed["local_clusters"] >= 4 and 0 <= fed["noise_fraction"] < 0.05
    assert sum(c for c in fed["cluster_sizes"] if isinstance(c, int)) <= len(X)


def test_dbscan_refuses_more_local_clusters_than_allowed_naming_the_parameter() -> None:
    from fedpeer.kinds.cluster import dbscan as dj

    _, parts = moons_and_blobs()
    results = run(dj, parts, {"eps": 0.2, "min_samples": 5, "components": 3, "local_clusters_max": 1})
    assert any(isinstance(r, JobError) and "raise local_clusters_max" in str(r) for r in results), results


@pytest.mark.parametrize("mode", ["allreduce", "pairwise"])
def test_a_member_lost_between_rounds_fails_the_job_rather_than_mixing_populations(mode: str) -> None:
    """All to all (the default), the round's sum fails naming the lost member; through the ring,
    its initiator re-runs the sum without it, and the job refuses the smaller population."""
    _, parts = non_iid_blobs(n=600)
    parts = [parts[0][::2], parts[0][1::2], parts[1], parts[2]]     # 4 members: 3 survivors still make a ring
    keys, names = member_keys("cluster", 4)
    params = kj.KIND.check_params({"k": 3, "n_init": 1, "tol": 0.0, "max_iter": 50, "secure_sum": mode})
    survivors = run_members(
        keys, lambda net, i, k: kj.run_job(net.channel(k), params, JobContext(names[k], names, 500,
                                                                             data=dataset(parts[i])), kj._inline),
        crash=lambda net: any(phase == "lloyd round 3" for _, phase, _, _ in net.progress_log), victim=3,
        detect_ms=200.0, unreachable_ms=100.0)[:3]
    assert all(isinstance(r, JobError) for r in survivors), survivors
    if mode == "pairwise":
        assert any("dropped out between two secure sums" in str(r) for r in survivors), survivors
    else:
        assert all(keys[3].hex()[:16] in str(r) for r in survivors), survivors


def test_gmm_reports_each_em_rounds_log_likelihood_live_in_the_results_units() -> None:
    """The live history (`job show`, /metrics, MLflow): one point per EM round, equal to the
    result's history (original units, here far from the standardised ones)."""
    _, parts = non_iid_blobs(n=600, d=2, seed=6)
    parts = [p * [1000.0, 0.01] for p in parts]
    keys, names = member_keys("cluster", len(parts))
    checked, nets = gj.KIND.check_params({"k": 3, "standardize": True, "seed": 1}), []

    def member(net, i, k):
        nets.append(net)
        return gj.run_job(net.channel(k), checked, JobContext(names[k], names, 2_000, data=dataset(parts[i])),
                          kj._inline)

    fed = same_everywhere(run_members(keys, member))
    live = [p for who, p in nets[0].points if who == keys[0] and "log_likelihood" in p]
    assert [p["round"] for p in live] == [h["round"] for h in fed["history"]]
    assert np.allclose([p["log_likelihood"] for p in live], [h["log_likelihood"] for h in fed["history"]],
                       rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# Defaults a data scientist would choose (issue 39), on scikit-learn's breast-cancer rows
# ---------------------------------------------------------------------------------------------

def breast_cancer_sites() -> tuple[np.ndarray, list[np.ndarray]]:
    from sklearn.datasets import load_breast_cancer
    X = load_breast_cancer().data
    return X, [X[i::3] for i in range(3)]


def test_kmeans_by_default_is_scikit_learns_kmeans_on_the_standardized_pooled_rows() -> None:
    from sklearn.cluster import KMeans

    X, parts = breast_cancer_sites()
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    init = X[[0, 100, 200]]                                   # original units, as `init` takes them
    text = ";".join(",".join(repr(float(v)) for v in row) for row in init)
    fed = same_everywhere(run(kj, parts, {"k": 3, "init": text}))
    sk = KMeans(3, init=(init - X.mean(axis=0)) / X.std(axis=0), n_init=1, tol=1e-4, max_iter=300).fit(Z)
    centres = sk.cluster_centers_ * X.std(axis=0) + X.mean(axis=0)   # reported in original units
    order = cl.canonical_order(centres)
    np.testing.assert_allclose(fed["centers"], centres[order], rtol=1e-7)
    np.testing.assert_allclose(fed["inertia"], sk.inertia_, rtol=1e-7)
    assert fed["standardized"] and fed["inertia_units"] == "standardized features" and fed["warnings"] == []
    assert fed["cluster_sizes"] == list(np.bincount(sk.labels_)[order])


def test_kmeans_and_gmm_on_raw_columns_of_very_different_scales_warn() -> None:
    _, parts = breast_cancer_sites()
    for kind, params in ((kj, {"k": 2, "n_init": 1}), (gj, {"k": 2, "n_init": 1, "max_iter": 3})):
        raw = same_everywhere(run(kind, parts, {**params, "standardize": False}))
        assert len(raw["warnings"]) == 1 and "column scales differ" in raw["warnings"][0]
        assert "x23" in raw["warnings"][0] and "standardize=true" in raw["warnings"][0]
        assert any("warning: column scales differ" in line for line in kind.KIND.describe(raw))


def test_dbscan_by_default_finds_clusters_where_raw_units_find_only_noise_and_says_so() -> None:
    from fedpeer.kinds.cluster import dbscan as dj

    X, parts = breast_cancer_sites()
    fed = same_everywhere(run(dj, parts, {}))
    assert fed["clusters"] >= 1 and fed["noise_fraction"] < 0.5 and fed["standardized"]
    assert fed["eps_chosen"].startswith("eps ") and "quantile" in fed["eps_chosen"]
    # breast cancer is one dense mass with outliers at that eps: said, not left for the reader to notice
    assert fed["clusters"] == 1 and fed["warnings"] == [
        f"one cluster holds all {fed['cluster_sizes'][0]} rows that are not noise ({round(fed['noise_fraction'] * 569)}"
        " are): the rows form no separate dense groups at this eps (a lower eps may split it, with more noise; kmeans "
        "or gmm find groups that are not separated by sparse regions)"]
    assert "1 cluster from" in "\n".join(dj.KIND.describe(fed))
    assert any(fed["eps_chosen"] in line for line in dj.KIND.describe(fed))
    raw = same_everywhere(run(dj, parts, {"standardize": False, "eps_auto": False}))   # 0.1.0's defaults
    assert raw["clusters"] == 0 and raw["noise_fraction"] == 1.0
    assert raw["warnings"] and "are noise" in raw["warnings"][0] and "eps_auto=true" in raw["warnings"][0]
    assert any(line.startswith("  warning: ") for line in dj.KIND.describe(raw))
    whole = same_everywhere(run(dj, parts, {"standardize": False, "eps_auto": False, "eps": 1e5}))
    assert whole["clusters"] == 1 and "one cluster holds all" in whole["warnings"][0]
    # the stored model clusters new rows in the same standardized space
    model = run(dj, parts, {})[0]["_model"]
    assert [r["cluster"] for r in dj.predict(model, X[:20])].count(-1) < 20


def test_kmeans_k_max_keeps_the_best_calinski_harabasz_and_says_why() -> None:
    from sklearn.metrics import calinski_harabasz_score

    X, parts = non_iid_blobs(n=900, d=2, seed=1)        # three blobs, well apart
    fed = same_everywhere(run(kj, parts, {"k_max": 5, "n_init": 3, "seed": 1}))
    assert [s["k"] for s in fed["k_scores"]] == [2, 3, 4, 5]
    assert fed["k"] == 3 and fed["k_chosen"] == "k = 3: the best Calinski-Harabasz score over k = 2..5"
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    labels = np.argmin(((Z[:, None, :] - ((np.array(fed["centers"]) - X.mean(axis=0)) / X.std(axis=0))) ** 2)
                       .sum(axis=2), axis=1)
    kept = next(s for s in fed["k_scores"] if s["k"] == 3)
    assert kept["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(Z, labels), rel=1e-9)
    assert "  k = 3: the best Calinski-Harabasz score over k = 2..5" in kj.KIND.describe(fed)
    fixed = same_everywhere(run(kj, parts, {"k": 8, "n_init": 1}))
    assert fixed["k_scores"] == [] and fixed["k_chosen"].startswith("k = 8: as given (the default); k_max = K")


def test_gmm_k_max_keeps_the_lowest_bic() -> None:
    _, parts = non_iid_blobs(n=900, d=2, seed=1)
    fed = same_everywhere(run(gj, parts, {"k_max": 4, "n_init": 2, "seed": 1, "covariance": "diag"}))
    bics = {s["k"]: s["bic"] for s in fed["k_scores"]}
    assert sorted(bics) == [2, 3, 4] and fed["k"] == min(bics, key=bics.get) == 3
    assert fed["bic"] == bics[3] and "lowest) BIC over k = 2..4" in fed["k_chosen"]


def test_k_max_is_bounded_by_the_clusters_limit_and_refuses_init_and_fuzziness() -> None:
    params = kj.KIND.check_params({"k": 3, "k_max": 12})
    with pytest.raises(JobError, match="in effect 12"):
        kj.KIND.check_policy(params, {"clusters_max": 10})
    kj.KIND.check_policy(kj.KIND.check_params({"k": 3}), {"clusters_max": 10})
    for bad in ({"k_max": 4, "fuzziness": 2.0}, {"k_max": 4, "init": "0,0;1,1"}, {"k_max": 1}):
        with pytest.raises(JobError, match="k_max"):
            kj.k_range(kj.KIND.check_params(bad))
