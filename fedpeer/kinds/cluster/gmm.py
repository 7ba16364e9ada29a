"""`gmm`: exact federated Gaussian-mixture EM on secure-summed statistics (docs/algorithms.md).

Every member ends with the same mixture: the one EM gives on the pooled rows from the same
initialisation (fixed-point rounding aside). fedpeer/ml/cluster/mixture.py has the statistics and the
M-step (scikit-learn's, `reg_covar` included).

Secure sums, in order (tags `gmm/...`):
1. moments (as the kmeans job): mean and std, for `standardize` and the k-means initial centres.
2. federated k-means rounds (the kmeans job's, `n_init` restarts, tol 1e-4, `kmeans_max_iter`).
3. init: the statistics with responsibilities one-hot on the nearest k-means centre (scikit-learn's
   init_params="kmeans") -> the first mixture.
4. one per EM round: the statistics at the current mixture and its log-likelihood. EM stops when
   the mean log-likelihood per row changes by less than `tol` (scikit-learn's rule) or after
   `max_iter` rounds. The kept mixture is the last one *evaluated*, so the reported
   log-likelihood, BIC and cluster sizes are exactly those of the stored model (scikit-learn keeps
   one more M-step, whose likelihood it has not computed; the difference is within `tol`).

What every member learns: the row count, per-feature mean and std, the k-means rounds (see the
kmeans job), every round's mixture and log-likelihood, and cluster sizes. Nothing per site.

Every total is checked before it is used (the kmeans job's checks, then fedpeer/ml/cluster/mixture.py
`check_block`): one that no honest members can give ends the job everywhere naming the sum and the
check, never a site.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param, checked_total
from fedpeer.jobs.params import SECURE_SUM_COMPACT, SECURE_SUM_EXPLAINED, seed
from fedpeer.kinds.cluster import kmeans as km
from fedpeer.ml.cluster import kmeans as cl
from fedpeer.ml.cluster import mixture as mx

KMEANS_TOL = 1e-4

PARAMS = {
    "k": Param(int, 3, "number of mixture components", low=1, high=1000),
    "covariance": Param(str, "full", "covariance of each component: 'full' (d x d) or 'diag'",
                        choices=mx.COVARIANCE_TYPES),
    "reg_covar": Param(float, 1e-6, "added to every covariance's diagonal (as scikit-learn)", low=0.0, high=1e6),
    "max_iter": Param(int, 100, "EM rounds at most", low=1, high=10_000),
    "tol": Param(float, 1e-3, "stop when the mean log-likelihood per row changes by less (as scikit-learn)",
                 low=0.0, high=1e3),
    "kmeans_max_iter": Param(int, 100, "rounds of the federated k-means that initialises EM", low=1, high=10_000),
    "n_init": Param(int, 4, "restarts of the initialising k-means (all in the same secure sums)", low=1, high=100),
    "seed": seed("job seed: the k-means initial centres"),
    "standardize": Param(bool, True, "fit (x - mean) / std with the federated mean and std (false: raw units); "
                         "the mixture is reported in original units either way"),
    "init": Param(str, "", "explicit initial k-means centres in original units, 'x1,x2;y1,y2' (at most 1024 "
                  "characters); empty: drawn from the federated mean and std", high=km.INIT_CHARS_MAX),
    "k_max": Param(int, 0, "0: k as given; 2 or more: a mixture for every k from 2 to k_max, the one with the "
                   "lowest BIC kept (no init)", low=0, high=1000, capability="gmm-k-auto"),
    "min_cluster_rows": km.MIN_CLUSTER_ROWS,
    "secure_sum": SECURE_SUM_EXPLAINED,
    "secure_sum_compact": SECURE_SUM_COMPACT,
}


def _kmeans_params(params: Mapping[str, Any]) -> dict:
    return {"k": params["k"], "init": params["init"], "seed": params["seed"], "n_init": params["n_init"],
            "standardize": params["standardize"], "tol": KMEANS_TOL, "max_iter": params["kmeans_max_iter"],
            "fuzziness": 1.0}


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, offload: km.Offload = asyncio.to_thread) -> dict:
    X, features = ctx.data.X, ctx.data.features
    d, cov, ks = len(features), params["covariance"], km.k_range(params)
    restarts = 1 if params["init"] else params["n_init"]
    nf, nc = cl.block_sizes(max(ks), d)
    km.check_size("gmm", nf * restarts, nc * restarts, "lower k or n_init")
    gf, gc = mx.stat_sizes(max(ks), d, cov)
    km.check_size("gmm", gf, gc, "use covariance=diag or fewer components")
    sums = km.Sums(ch, ctx, params["secure_sum"], "gmm", params["secure_sum_compact"])
    ch.progress("moments", 0, 1)
    n, totals = await km.federated_moments(sums, X, offload)
    fits, scores = [], []
    for k in km.k_range(params, n) if params["k_max"] else ks:
        sums.prefix = f"gmm/k{k}" if params["k_max"] else "gmm"
        fit = await fit_k(ch, {**params, "k": k}, X, features, sums, n, totals, offload)
        fits.append(fit)
        if params["k_max"]:
            scores.append({"k": k, "bic": fit["bic"], "log_likelihood": fit["log_likelihood"]})
    at = min(range(len(scores)), key=lambda i: scores[i]["bic"]) if scores else 0
    return {**fits[at], "k_scores": scores, "k_chosen": km.k_chosen(params, scores, "(lowest) BIC", fits[at]["k"],
                                                              PARAMS["k"].default),
            "warnings": km.warnings(params, n, totals, features)}


async def fit_k(ch: Any, params: Mapping[str, Any], X: np.ndarray, features: tuple[str, ...], sums: km.Sums,
                n: int, totals: np.ndarray, offload: km.Offload) -> dict:
    """One mixture of params' k: the k-means that starts it, then EM, as the result holds it."""
    d, k, cov = len(features), params["k"], params["covariance"]
    first = len(sums.sent_entries)
    space, lloyd = km._plan_for(_kmeans_params(params), n, totals, d)
    Z = await offload(space.to, X)
    await km.run_lloyd(ch, sums, lloyd, Z, n, offload, f"k = {k}: k-means init" if params["k_max"] else "k-means init")
    best = lloyd.restarts[lloyd.best()]
    centers = best.centers
    labels, _ = await offload(km.one_blas_thread, cl.nearest, Z, centers)
    ch.progress("init", 0, 1)
    floats, _ = await offload(km.one_blas_thread, mx.local_block, Z, None, centers, cov, labels)
    f_total, c_total = await sums.add("init", floats, np.zeros(k, dtype=np.int64))
    checked_total(sums.tag("init"), mx.check_block, n, f_total, c_total, centers, cov, None,
                  (best.counts, best.inertia))
    model = mx.mstep(n, f_total, centers, cov, params["reg_covar"])
    history: list[float] = []
    for step in range(1, params["max_iter"] + 1):
        ch.progress(f"em round {step}", step, params["max_iter"])
        floats, counts = await offload(km.one_blas_thread, mx.local_block, Z, model, model.means, cov)
        f_total, c_total = await sums.add(f"em{step}", floats, counts)
        checked_total(sums.tag(f"em{step}"), mx.check_block, n, f_total, c_total, model.means, cov, model)
        history.append(float(f_total[-1]))
        ch.progress(f"em round {step}", step, params["max_iter"],   # the result's units (original, not standardised)
                    point={"round": step, "log_likelihood": history[-1] - n * float(np.log(space.scale).sum())})
        if step == params["max_iter"] or (step > 1 and abs(history[-1] - history[-2]) / n < params["tol"]):
            break
        model = mx.mstep(n, f_total, model.means, cov, params["reg_covar"])
    return result(model, history, c_total, space, params, features, n, sums, lloyd, first)


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    return await run_job(ch, params, ctx)


def result(model: mx.Mixture, history: list[float], counts: np.ndarray, space: cl.Space, params: Mapping[str, Any],
           features: tuple[str, ...], n: int, sums: km.Sums, lloyd: cl.Lloyd, first: int = 1) -> dict:
    k, d, cov = params["k"], len(features), params["covariance"]
    original = mx.to_original(model, space.shift, space.scale)
    order = cl.canonical_order(original.means)
    original, model = original.reordered(order), model.reordered(order)
    log_scale = float(np.log(space.scale).sum())
    loglik = [v - n * log_scale for v in history]       # densities of the original units
    converged = len(history) > 1 and abs(history[-1] - history[-2]) / n < params["tol"]
    em = sums.sent_entries[-len(history):]
    return {
        "k": k, "covariance": cov, "features": list(features), "rows": n, "participants": sums.names(),
        "weights": original.weights.tolist(), "means": original.means.tolist(),
        "covariances": original.covariances.tolist(),
        "log_likelihood": loglik[-1], "mean_log_likelihood": loglik[-1] / n,
        "bic": mx.bic(loglik[-1], n, k, d, cov), "parameters": mx.parameter_count(k, d, cov),
        "iterations": len(history), "converged": converged,
        "history": [{"round": i + 1, "log_likelihood": v} for i, v in enumerate(loglik)],
        "cluster_sizes": km.sizes_shown(counts[order], params["min_cluster_rows"]),
        "kmeans_rounds": len(sums.sent_entries) - first - len(history) - 1,
        "kmeans_inertia": lloyd.restarts[lloyd.best()].inertia,
        "standardized": params["standardize"], "reg_covar": params["reg_covar"],
        "secure_sum": params["secure_sum"], "secure_sums": len(sums.sent_entries),
        "bytes_sent_per_site": 8 * sum(sums.sent_entries), "bytes_per_round_per_site": 8 * max(em),
        "_model": {"kind": "gmm", "features": list(features), "weights": model.weights, "means": model.means,
                   "covariances": model.covariances, "shift": space.shift, "scale": space.scale,
                   "full": float(cov == "full")},
    }


def load_model(path: Any) -> tuple[mx.Mixture, dict]:
    """The stored mixture (clustering space) and its arrays; DataError if the file is not one."""
    from fedpeer.errors import DataError
    stored = km.load_arrays(path, "gmm", {"weights": lambda k, d: (k,), "means": lambda k, d: (k, d),
                                          "shift": lambda k, d: (d,), "scale": lambda k, d: (d,),
                                          "full": lambda k, d: ()})
    full = float(stored["full"]) == 1.0
    k, d = stored["means"].shape
    try:
        import zipfile
        with np.load(path, allow_pickle=False) as npz:
            covs = npz["covariances"]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a valid stored gmm model: {exc}") from None
    want = (k, d, d) if full else (k, d)
    if covs.dtype != np.float64 or covs.shape != want or not np.isfinite(covs).all() \
            or (stored["weights"] < 0).any() or (stored["scale"] <= 0).any():
        raise DataError(f"{path}: not a valid stored gmm model: covariances, weights or scale out of shape or range")
    model = mx.Mixture(stored["weights"], stored["means"], covs, "full" if full else "diag")
    try:
        model.cholesky()
    except JobError as exc:
        raise DataError(f"{path}: not a valid stored gmm model: {exc}") from None
    return model, stored


def predict(stored: tuple[mx.Mixture, dict], X: np.ndarray) -> list[dict]:
    """Each row's most probable component (canonical order) and every component's probability."""
    model, arrays = stored
    Z = (X - arrays["shift"]) / arrays["scale"]
    resp, _ = mx.estep(Z, model, model.cholesky())
    return [{"row": i + 1, "cluster": int(r.argmax()), **{f"p_{c}": float(v) for c, v in enumerate(r)}}
            for i, r in enumerate(resp)]


# [policy.gmm]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "components_max": Limit("k", 1000, "mixture components (k)"),
    "iterations_max": Limit("max_iter", 10_000, "EM rounds, one secure sum each (max_iter)"),
    "restarts_max": Limit("n_init", 100, "restarts of the initialising k-means (n_init)"),
    "cluster_rows_min": Limit("min_cluster_rows", 1, "smallest cluster size shown exactly (min_cluster_rows)"),
}


def predict_file(path: Path, result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict` with the stored model."""
    model = load_model(path)
    return predict(model, rows(model[1]["features"]))


KIND = JobKind(name="gmm", help="exact federated Gaussian mixture (EM on secure-summed statistics; no label needed)",
               params=PARAMS, run=run, needs_data=True, binary_label=False, needs_label=False,
               save_model=km.save_model,
               model_file="model.npz",
               limits=LIMITS, in_effect=km.in_effect, describe=functools.partial(km.describe, "gmm"),
               site_table=km.site_table,
               predict=predict_file, history=functools.partial(km.history, "log_likelihood"))
