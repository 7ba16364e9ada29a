"""What earlier releases run: the capabilities, job parameters and choices of release 0.1.0
(commit be4d39c, protocol 2), the release this build must keep working beside.

0.1.0 cannot say what it runs: it refuses the SiteInfo message (400 unknown_kind) and its hello
and bodies are fixed. A peer that refused SiteInfo, or has not sent one, is taken as 0.1.0 with
exactly BASELINE_CAPABILITIES (fedpeer/jobs/versions.py). The parameter tables below are what
0.1.0 accepts in a proposal (its bodies are exact-key maps): a parameter or a choice a later
build adds must declare a capability (tests/unit/test_versions.py checks every kind against them),
so that it is never sent to a member that would refuse it.

This is a record of history: it changes only when a release is cut, never with the code.
"""

from __future__ import annotations

from collections.abc import Mapping

RELEASE_0_1_0 = "0.1.0"
PROTOCOL_0_1_0 = (2, 2)
COMMIT_0_1_0 = "be4d39cf3944"

# Every kind and secure-sum mode 0.1.0 runs (its daemon speaks no format beyond them).
BASELINE_CAPABILITIES = frozenset({
    "kind-stats", "kind-sumcheck", "kind-bofrf", "kind-xgboost", "kind-tree", "kind-logreg", "kind-mlp",
    "kind-kmeans", "kind-gmm", "kind-dbscan",
    "secsum-ring", "secsum-pairwise", "secsum-allreduce",
})

_SECSUM = ("ring", "pairwise", "allreduce")

# kind -> parameter -> its choices at 0.1.0 (None: a free value within bounds)
PARAMS_0_1_0: Mapping[str, Mapping[str, tuple[str, ...] | None]] = {
    "stats": {"bins": None, "secure_sum": _SECSUM},
    "sumcheck": {"chunk_entries": None, "entries": None, "secure_sum": _SECSUM},
    "bofrf": {"baseline": ("none", "boppid"), "boppid_rounds": None, "clusters": None,
              "distance": ("euclidean", "manhattan"), "grid_search": None, "max_depth": None,
              "min_samples_leaf": None, "n_estimators": None, "secure_sum": _SECSUM, "seed": None, "tau": None,
              "test_fraction": None, "validation_fraction": None, "variant": ("base", "personalized", "clustered")},
    "xgboost": {"classes": None, "colsample_bytree": None, "eta": None, "eval_bins": None, "eval_every": None,
                "eval_round_bins": None, "gamma": None, "grad_abs_max": None, "leaf_abs_max": None,
                "max_bin": None, "max_delta_step": None, "max_depth": None, "member_timeout_ms": None,
                "min_child_weight": None, "min_leaf_rows": None, "mode": ("histogram", "bagging"),
                "normalize": ("none", "samples", "gain"), "nthread": None, "num_local_round": None,
                "objective": ("binary:logistic", "multi:softprob", "reg:squarederror"), "reg_lambda": None,
                "rounds": None, "secure_sum": _SECSUM, "seed": None, "subsample": None, "test_fraction": None,
                "tree_method": ("hist", "approx", "exact")},
    "tree": {"ccp_alpha": None, "classes": None, "criterion": ("gini", "entropy", "squared_error"),
             "eval_bins": None, "icdta_threshold": None, "label_abs_max": None, "max_bin": None, "max_depth": None,
             "min_leaf_rows": None, "mode": ("exact", "icdta"), "secure_sum": _SECSUM, "seed": None,
             "test_fraction": None},
    "logreg": {"C": None, "batch_size": None, "classes": None, "eval_bins": None, "global_every": None,
               "groups": None, "learning_rate": None, "local_epochs": None, "max_iter": None,
               "mode": ("exact", "fedavg"), "rounds": None, "secure_sum": _SECSUM, "seed": None,
               "solver": ("auto", "newton", "lbfgs"), "test_fraction": None, "tol": None},
    "mlp": {"alpha": None, "batch_size": None, "classes": None, "eval_bins": None, "global_every": None,
            "groups": None, "hidden_layer_sizes": None, "learning_rate": None, "local_epochs": None, "rounds": None,
            "secure_sum": _SECSUM, "seed": None, "test_fraction": None},
    "kmeans": {"fuzziness": None, "init": None, "k": None, "max_iter": None, "min_cluster_rows": None,
               "n_init": None, "secure_sum": _SECSUM, "seed": None, "standardize": None, "tol": None},
    "gmm": {"covariance": ("full", "diag"), "init": None, "k": None, "kmeans_max_iter": None, "max_iter": None,
            "min_cluster_rows": None, "n_init": None, "reg_covar": None, "secure_sum": _SECSUM, "seed": None,
            "standardize": None, "tol": None},
    "dbscan": {"components": None, "eps": None, "local_clusters_max": None, "min_cluster_rows": None,
               "min_samples": None, "reg_covar": None, "secure_sum": _SECSUM, "seed": None,
               "synthetic_rows_max": None},
}
