"""`dbscan`: federated DBSCAN via Gaussian-mixture descriptions of local clusters (Vasilopoulou's thesis §5.2).

Not exact, unlike kmeans and gmm: DBSCAN's clusters depend on individual rows, so the federation
clusters synthetic points drawn from each site's description of its local clusters instead
(fedpeer/ml/cluster/dbscan.py has the steps and the rules).

Secure sums, in order (tags `dbscan/...`):
0. with `standardize` (the default): moments, as the kmeans job: the federated mean and std, every
   row clustered as (x - mean) / std. With `eps_auto` (the default): kdistances, the federation's
   histogram of each row's distance to its min_samples-th nearest row at its own site (fixed
   log-spaced bins), eps its EPS_AUTO_QUANTILE quantile. It reveals that histogram, federation-wide.
1. descriptions: every member's slots (its own filled, the others zero), the Σx and Σx² of its
   rows in local clusters, its row count and its local noise count. The total is every site's
   descriptions side by side.
2. sizes: rows per synthetic cluster and noise rows, federation-wide.

What every member learns — more than kmeans and gmm share: for every site, the number of its local
DBSCAN clusters, each one's exact row count and the mixture describing it (weights, means,
covariances of up to `components` Gaussians), and every site's row count; then the federation-wide
cluster sizes and noise count. A local cluster with few rows is described by few Gaussians whose
means are close to its rows (a cluster of 1 to `components` rows: its rows exactly, up to reg_covar).

Both totals are checked before they are used (fedpeer/ml/cluster/dbscan.py `unpack`, `check_counts`,
`check_sizes`): one that no honest members can give ends the job everywhere naming the sum and the
check, never a site — a slot's position proves nothing of who wrote it. Not checkable: where a
member says its clusters are (a site's description of its own rows is its word).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param, checked_total
from fedpeer.jobs.params import SECURE_SUM_COMPACT, SECURE_SUM_EXPLAINED, seed
from fedpeer.kinds.cluster import kmeans as km
from fedpeer.ml.blas import one_blas_thread
from fedpeer.ml.cluster import dbscan as db

PARAMS = {
    "eps": Param(float, 0.5, "DBSCAN neighbourhood radius (local and synthetic runs), in standardized units "
                 "(feature units with standardize=false); unused with eps_auto", low=1e-12, high=1e12),
    "standardize": Param(bool, True, "cluster (x - mean) / std with the federated mean and std (one more secure "
                         "sum); false: raw feature units", capability="dbscan-standardize", before=False),
    "eps_auto": Param(bool, True, f"eps from the federation's k-distances: the {db.EPS_AUTO_QUANTILE:g} quantile "
                      "of every row's distance to its min_samples-th nearest row at its own site (a secure sum "
                      "of per-site histograms); false: eps as given", capability="dbscan-eps-auto", before=False),
    "min_samples": Param(int, 5, "DBSCAN: rows within eps that make a core point", low=1, high=100_000),
    "components": Param(int, 10, "Gaussians describing each local cluster (fewer for smaller clusters)",
                        low=1, high=100),
    "local_clusters_max": Param(int, 20, "local clusters a site may describe; a site with more fails the job "
                                "naming this parameter", low=1, high=1000),
    "synthetic_rows_max": Param(int, 200_000, "synthetic points every member clusters (one per clustered row); "
                                "more fails the job naming this parameter", low=1, high=10_000_000),
    "reg_covar": Param(float, 1e-6, "added to each local Gaussian's covariance diagonal", low=0.0, high=1e6),
    "seed": seed("job seed: local mixtures and the synthetic points"),
    "min_cluster_rows": km.MIN_CLUSTER_ROWS,
    "secure_sum": SECURE_SUM_EXPLAINED,
    "secure_sum_compact": SECURE_SUM_COMPACT,
}


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, offload: km.Offload = asyncio.to_thread) -> dict:
    X, features = ctx.data.X, ctx.data.features
    d, p = len(features), params
    members = list(ch.members)
    slots, comps = p["local_clusters_max"], p["components"]
    km.check_size("dbscan", len(members) * slots * db.slot_size(comps, d) + 2 * d, 2,
                  "lower local_clusters_max or components")
    sums = km.Sums(ch, ctx, p["secure_sum"], "dbscan", p["secure_sum_compact"])
    shift, scale = np.zeros(d), np.ones(d)
    if p["standardize"]:
        ch.progress("moments", 0, 2)
        n_all, totals = await km.federated_moments(sums, X, offload)
        space = km.cl.make_space(*km.cl.finish_moments(n_all, totals, d), True)
        shift, scale = space.shift, space.scale
        X = await offload(space.to, X)
    eps, kdist = p["eps"], None
    if p["eps_auto"]:
        ch.progress("k-distances", 0, 2)
        hist = await offload(one_blas_thread, db.kdistance_histogram, X, p["min_samples"])
        _, kdist = await sums.add("kdistances", np.zeros(0), hist)
        if p["standardize"]:             # the rows are known already: every one counted once
            checked_total(sums.tag("kdistances"), db.check_kdistances, kdist, n_all)
        eps = checked_total(sums.tag("kdistances"), db.eps_from_histogram, kdist)
    ch.progress("local DBSCAN and descriptions", 0, 2)
    described, moments = await offload(one_blas_thread, db.describe_with_moments, X, eps, p["min_samples"],
                                       comps, p["seed"], p["reg_covar"])
    try:
        packed = db.pack(described, members.index(ch.me), len(members), slots, comps, d)
    except DataError as exc:      # this site's count stays here: the others hear its public text
        raise JobError(str(exc)) from exc
    vector = np.concatenate([packed, moments])
    clustered = sum(n for n, *_ in described)
    ch.progress("descriptions (secure sum 1 of 2)", 1, 2)
    total, counts = await sums.add("descriptions", vector,
                                   np.array([X.shape[0], X.shape[0] - clustered], dtype=np.int64))
    n = int(counts[0])
    tag = sums.tag("descriptions")
    shared = checked_total(tag, db.unpack, total[:-2 * d], len(members), slots, comps, d)
    checked_total(tag, db.check_counts, shared, n, int(counts[1]))
    if kdist is not None:
        checked_total(sums.tag("kdistances"), db.check_kdistances, kdist, n)
    checked_total(tag, db.check_moments, shared, total[-2 * d:], p["reg_covar"], n)
    synthetic_rows = sum(rows for _, _, rows, *_ in shared)
    if synthetic_rows > p["synthetic_rows_max"]:
        raise JobError(f"the sites' local clusters hold {synthetic_rows} rows, more synthetic points than "
                       f"synthetic_rows_max {p['synthetic_rows_max']}; raise it (each member clusters them all)")
    S = db.synthesize(shared, p["seed"])
    labels = await offload(one_blas_thread, db.cluster_synthetic, S, eps, p["min_samples"])
    k = int(labels.max()) + 1 if len(labels) else 0
    mine = await offload(one_blas_thread, db.assign, X, S, labels, eps)
    ch.progress("cluster sizes (secure sum 2 of 2)", 2, 2)
    _, sizes = await sums.add("sizes", np.zeros(0), np.bincount(mine + 1, minlength=k + 1).astype(np.int64))
    checked_total(sums.tag("sizes"), db.check_sizes, sizes, n)
    warning = db.noise_warning(n, int(sizes[0]), sizes[1:])
    return {
        "features": list(features), "rows": n, "participants": sums.names(),
        "clusters": k, "noise_fraction": float(sizes[0]) / n if n else 0.0,   # exact: noise is not a cluster
        "cluster_sizes": km.sizes_shown(sizes[1:], p["min_cluster_rows"]),
        "local_clusters": len(shared), "local_noise_rows": int(counts[1]), "synthetic_rows": int(len(S)),
        "synthetic_noise": int((labels < 0).sum()), "eps": eps, "min_samples": p["min_samples"],
        "eps_chosen": (f"eps {eps:.4g}: the {db.EPS_AUTO_QUANTILE:g} quantile of the rows' k-distances"
                       if p["eps_auto"] else f"eps {eps:.4g}: as given"),
        "standardized": p["standardize"], "warnings": [warning] if warning else [],
        "secure_sum": p["secure_sum"], "secure_sums": len(sums.sent_entries),
        "bytes_sent_per_site": 8 * sum(sums.sent_entries),
        "_model": {"kind": "dbscan", "features": list(features), "points": S, "labels": labels.astype(np.float64),
                   "eps": eps, "shift": shift, "scale": scale},
    }


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    return await run_job(ch, params, ctx)


def load_model(path: Any) -> dict:
    """The synthetic points and their clusters; DataError if the file is not a valid dbscan model."""
    import json
    import zipfile
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = {name: npz[name] for name in npz.files}
        if str(stored["kind"][()]) != "dbscan":
            raise ValueError("not a dbscan model")
        features = json.loads(str(stored["features"][()]))
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise ValueError("features is not a list of names")
        points, labels, eps = stored["points"], stored["labels"], stored["eps"]
        if points.dtype != np.float64 or points.ndim != 2 or points.shape[1] != len(features) \
                or labels.shape != (len(points),) or eps.shape != () or not np.isfinite(points).all() \
                or not np.isfinite(labels).all() or (labels < -1).any() or (labels != np.round(labels)).any() \
                or not float(eps) > 0:
            raise ValueError("arrays out of shape or range")
        d = len(features)      # models before `standardize` hold no shift and scale: raw units
        shift, scale = stored.get("shift", np.zeros(d)), stored.get("scale", np.ones(d))
        if shift.shape != (d,) or scale.shape != (d,) or not np.isfinite(shift).all() or not (scale > 0).all():
            raise ValueError("shift or scale out of shape or range")
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a valid stored dbscan model: {exc}") from None
    return {"features": tuple(features), "points": points, "labels": labels.astype(np.int64), "eps": float(eps),
            "shift": shift, "scale": scale}


def predict(model: Mapping[str, Any], X: np.ndarray) -> list[dict]:
    """Each row's cluster: that of the nearest clustered synthetic point within eps, else -1 (noise)."""
    if "shift" in model:
        X = (X - model["shift"]) / model["scale"]
    labels = db.assign(X, model["points"], model["labels"], model["eps"])
    return [{"row": i + 1, "cluster": int(c)} for i, c in enumerate(labels)]


# [policy.dbscan]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "components_max": Limit("components", 100, "Gaussians describing each local cluster (components)"),
    "local_clusters_max": Limit("local_clusters_max", 1000, "local clusters a site describes (local_clusters_max)"),
    "synthetic_rows_max": Limit("synthetic_rows_max", 10_000_000,
                                "synthetic points every site clusters (synthetic_rows_max)"),
    "cluster_rows_min": Limit("min_cluster_rows", 1, "smallest cluster size shown exactly (min_cluster_rows)"),
}


def predict_file(path: Path, result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict` with the stored model."""
    model = load_model(path)
    return predict(model, rows(model["features"]))


KIND = JobKind(name="dbscan", help="federated DBSCAN on synthetic points from shared per-cluster Gaussian mixtures "
               "(after Vasilopoulou's thesis, §5.2; shares more than kmeans/gmm; no label needed)",
               params=PARAMS, run=run, needs_data=True, binary_label=False, needs_label=False,
               save_model=km.save_model, model_file="model.npz",
               limits=LIMITS, describe=functools.partial(km.describe, "dbscan"), site_table=km.site_table,
               predict=predict_file)
