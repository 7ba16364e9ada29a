"""`kmeans`: exact federated k-means / fuzzy c-means on secure sums (docs/algorithms.md;
Marcelloni's federated-learning lecture).

Every member ends with the same centres, the ones Lloyd's algorithm gives on the pooled rows from
the same initial centres (fixed-point rounding of the sums aside), and no site's sums are visible
to anyone: each round is one secure sum of, per restart and cluster, the sum of the site's rows
nearest that centre and their count, plus the inertia (fedpeer/ml/cluster/kmeans.py has the block and the
rules: convergence as scikit-learn, the empty-cluster rule, the initial centres).

Secure sums, in order (tags `kmeans/...`):
1. moments: [Σx, Σx² per feature] and the row count: the federation-wide mean and std, for the
   initial centres (drawn from N(mean, std²) with the job seed, `n_init` restarts), for
   `standardize` and for the tolerance.
2. one per round: the blocks of every restart still running, all restarts in the same sum.
A member lost between two sums would make them cover different sites: the job then fails with that
reason rather than mixing populations (inside one sum, the secure sum re-runs over the survivors).

What every member learns: the federation's row count, per-feature mean and std, every round's
centres, inertia and cluster sizes (their counts and sums, per restart). Nothing per site.

Every total is checked before it is used (fedpeer/ml/cluster/kmeans.py `check_moments`,
`check_block`): one that no honest members can give ends the job everywhere naming the sum and
the check, never a site (fedpeer/jobs/kind.py `ImplausibleTotal`).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param, checked_total
from fedpeer.jobs.params import SECURE_SUM_COMPACT, SECURE_SUM_EXPLAINED, seed
from fedpeer.jobs.report import series
from fedpeer.kinds.aligned import MESSAGES as VERTICAL_MESSAGES
from fedpeer.kinds.cluster import kmeans_dp
from fedpeer.kinds.cluster.text import describe, site_table
from fedpeer.kinds.cluster.vertical import run_vertical
from fedpeer.ml.blas import one_blas_thread
from fedpeer.ml.cluster import kmeans as cl
from fedpeer.ml.moments import whole_counts
from fedpeer.protocols.fixedpoint import FixedPoint, encode_counts
from fedpeer.protocols.securesum.api import VECTOR_ENTRIES_MAX, secure_sum

# 2^95 range at 2^-32 resolution: a site's sums of squares over millions of rows fit
FIXED = FixedPoint(frac_bits=32, limbs=4)
COUNT_MAX = 2**40                     # rows per site a count may hold
INIT_CHARS_MAX = 1024                 # the `init` parameter's text (a job parameter's wire limit)

Offload = Callable[..., Awaitable[Any]]

MIN_CLUSTER_ROWS = Param(int, 5, "a cluster with fewer rows federation-wide is reported as '< N', never its size",
                         low=1, high=1_000_000)

PARAMS = {
    "k": Param(int, 8, "number of clusters", low=1, high=1000),
    "max_iter": Param(int, 300, "Lloyd rounds per restart at most", low=1, high=10_000),
    "tol": Param(float, 1e-4, "stop when the squared centre shift is at most tol x mean feature variance "
                 "(as scikit-learn)", low=0.0, high=1.0),
    "n_init": Param(int, 10, "restarts from different seeded initial centres, all in the same secure sums; "
                    "the lowest inertia is kept (1 when init is given)", low=1, high=100),
    "seed": seed("job seed: initial centres and empty-cluster re-seeding"),
    "standardize": Param(bool, True, "cluster (x - mean) / std with the federated mean and std (false: raw "
                         "units, where the widest column decides); centres are reported in original units either way"),
    "fuzziness": Param(float, 1.0, "1: hard k-means; m > 1: fuzzy c-means with fuzzifier m (Bezdek)",
                       low=1.0, high=10.0),
    "init": Param(str, "", "explicit initial centres in original units, 'x1,x2;y1,y2' (k groups of one value "
                  "per feature, at most 1024 characters); empty: drawn from the federated mean and std",
                  high=INIT_CHARS_MAX),
    "k_max": Param(int, 0, "0: k as given; 2 or more: every k from 2 to k_max is fitted and the one with the "
                   "highest Calinski-Harabasz score (from the same secure sums) is kept (hard k-means, no init)",
                   low=0, high=1000, capability="kmeans-k-auto"),
    "min_cluster_rows": MIN_CLUSTER_ROWS,
    "secure_sum": SECURE_SUM_EXPLAINED,
    "secure_sum_compact": SECURE_SUM_COMPACT,
    **kmeans_dp.PARAMS,         # differential privacy (fedpeer/kinds/cluster/kmeans_dp.py): off at dp_epsilon = 0
}


def k_range(params: Mapping[str, Any], n: int | None = None) -> list[int]:
    """The k a job fits: [k], or 2..k_max (below the row count n when known)."""
    if not params["k_max"]:
        return [params["k"]]
    if params["k_max"] < 2:
        raise JobError("parameter k_max: 0 (k as given) or at least 2")
    if params["init"] or params.get("fuzziness", 1.0) != 1.0:
        raise JobError("k_max chooses k for hard k-means from drawn centres: leave init empty and fuzziness 1")
    return list(range(2, params["k_max"] + 1 if n is None else min(params["k_max"], n - 1) + 1))


def k_chosen(params: Mapping[str, Any], scores: Sequence[Mapping[str, Any]], criterion: str, best: int,
             default: int) -> str:
    """Which k the result holds, and why."""
    if not scores:
        return (f"k = {params['k']}: as given{' (the default)' if params['k'] == default else ''}; "
                f"k_max = K tries k = 2..K and keeps the best by {criterion}")
    return f"k = {best}: the best {criterion} over k = {scores[0]['k']}..{scores[-1]['k']}"


def in_effect(params: Mapping[str, Any]) -> dict[str, int]:
    """[policy] clusters_max bounds the largest k a job fits: k_max when it chooses k."""
    return {"k": max(params["k"], params["k_max"])}


class Sums:
    """The job's secure sums: floats (fixed point) and counts in one vector each time, the same
    participants every time, and a count of what each site sent."""

    def __init__(self, ch: Any, ctx: JobContext, mode: str, prefix: str, compact: bool = False) -> None:
        self.ch, self.ctx, self.mode, self.prefix, self.compact = ch, ctx, mode, prefix, compact
        self.participants: tuple[bytes, ...] | None = None
        self.sent_entries: list[int] = []

    @staticmethod
    def entries(floats: int, counts: int) -> int:
        return floats * FIXED.limbs + counts

    async def add(self, name: str, floats: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parties = len(self.ch.members)
        try:
            vector = np.concatenate([FIXED.encode(floats, parties), encode_counts(counts, parties, COUNT_MAX)])
        except DataError as exc:
            raise JobError(f"{exc}; set standardize=true or rescale the features") from None
        out = await secure_sum(self.ch, self.tag(name), vector, mode=self.mode,
                               hop_timeout_ms=self.ctx.hop_timeout_ms, compact=self.compact)
        if self.participants is None:
            self.participants = out.participants
        elif out.participants != self.participants:
            raise JobError("a member dropped out between two secure sums; the sums would cover different sites")
        self.sent_entries.append(len(vector))
        split = len(floats) * FIXED.limbs
        return FIXED.decode(out.total[:split]), checked_total(self.tag(name), whole_counts, out.total[split:])

    def tag(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def names(self) -> list[str]:
        return [self.ctx.names.get(k, k.hex()[:16]) for k in self.participants or ()]


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)




async def federated_moments(sums: Sums, X: np.ndarray, offload: Offload) -> tuple[int, np.ndarray]:
    """(n, [Σx, Σx²]) over the federation (secure sum 1)."""
    moments = await offload(cl.local_moments, X)
    totals, counts = await sums.add("moments", moments, np.array([X.shape[0]], dtype=np.int64))
    n = int(counts[0])
    checked_total(sums.tag("moments"), cl.check_moments, n, totals, X.shape[1])
    return n, totals


def check_size(kind: str, floats: int, counts: int, fix: str) -> None:
    entries = Sums.entries(floats, counts)
    if entries > VECTOR_ENTRIES_MAX:
        raise JobError(f"{kind}: one round's sums hold {entries} entries, more than the secure sum's "
                       f"{VECTOR_ENTRIES_MAX}; {fix}")


async def run_lloyd(ch: Any, sums: Sums, lloyd: cl.Lloyd, Z: np.ndarray, n: int, offload: Offload,
                    phase: str) -> None:
    """Rounds of secure sums until every restart is done (the same at every member)."""
    labels: dict[int, np.ndarray] = {}
    bound = lloyd.max_iter + 1
    for step in range(1, bound + 1):
        if lloyd.finished:
            return
        ch.progress(f"{phase} round {step}", step, bound)
        floats, counts = await offload(one_blas_thread, lloyd.local, Z, labels)
        f_total, c_total = await sums.add(f"round{step}", floats, counts)
        checked_total(sums.tag(f"round{step}"), lloyd.advance, f_total, c_total, n)
        objectives = [r.history[-1] for r in lloyd.restarts if r.history]
        if objectives:                    # the live curve: the best restart's objective so far
            ch.progress(f"{phase} round {step}", step, bound, point={"round": step, "objective": min(objectives)})
    assert lloyd.finished, "each restart ends within max_iter + 1 rounds"


def sizes_shown(counts: np.ndarray, min_rows: int) -> list[int | str]:
    return [int(c) if c >= min_rows else f"< {min_rows}" for c in counts]


def _plan_for(params: Mapping[str, Any], n: int, totals: np.ndarray, d: int) -> tuple[cl.Space, cl.Lloyd]:
    k = params["k"]
    if n < k:
        raise JobError(f"the federation has {n} rows; k = {k} clusters need at least {k} (lower k)")
    init = None
    if params["init"]:
        if len(params["init"]) > INIT_CHARS_MAX:
            raise JobError(f"parameter init: longer than {INIT_CHARS_MAX} characters")
        init = cl.parse_centers(params["init"], k, d)
    return cl.plan((n, totals), d, k=k, seed=params["seed"], n_init=params["n_init"],
                   standardize=params["standardize"], tol=params["tol"], max_iter=params["max_iter"],
                   fuzziness=params["fuzziness"], init=init)


def calinski_harabasz(space: cl.Space, n: int, totals: np.ndarray, d: int, k: int, inertia: float) -> float:
    """(B / (k - 1)) / (W / (n - k)) in the clustering space: W the inertia, B = T - W with T the
    total sum of squares about the mean, from secure sum 1's Σx, Σx² (as scikit-learn's score)."""
    z_sums, z_squares, _ = cl.space_moments(space, n, totals, d)
    total = float((z_squares - z_sums * z_sums / n).sum())
    return float("inf") if inertia <= 0 else (total - inertia) / (k - 1) / (inertia / (n - k))


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, offload: Offload = asyncio.to_thread) -> dict:
    X, features = ctx.data.X, ctx.data.features
    d, ks = len(features), k_range(params)
    restarts = 1 if params["init"] else params["n_init"]
    nf, nc = cl.block_sizes(max(ks), d)
    check_size("kmeans", nf * restarts, nc * restarts, "lower k or n_init")
    sums = Sums(ch, ctx, params["secure_sum"], "kmeans", params["secure_sum_compact"])
    ch.progress("moments", 0, 1)
    n, totals = await federated_moments(sums, X, offload)
    fits, scores = [], []
    for k in k_range(params, n) if params["k_max"] else ks:
        sums.prefix = f"kmeans/k{k}" if params["k_max"] else "kmeans"
        space, lloyd = _plan_for({**params, "k": k}, n, totals, d)
        Z = await offload(space.to, X)
        await run_lloyd(ch, sums, lloyd, Z, n, offload, f"k = {k}: lloyd" if params["k_max"] else "lloyd")
        inertia = lloyd.restarts[lloyd.best()].inertia
        assert inertia is not None
        fits.append((k, space, lloyd))
        if params["k_max"]:
            scores.append({"k": k, "calinski_harabasz": calinski_harabasz(space, n, totals, d, k, inertia),
                           "inertia": inertia})
    at = max(range(len(scores)), key=lambda i: scores[i]["calinski_harabasz"]) if scores else 0
    k, space, lloyd = fits[at]
    return {**result(lloyd, space, {**params, "k": k}, features, n, sums), "k_scores": scores,
            "k_chosen": k_chosen(params, scores, "Calinski-Harabasz score", k, PARAMS["k"].default),
            "warnings": warnings(params, n, totals, features)}


def warnings(params: Mapping[str, Any], n: int, totals: np.ndarray, features: tuple[str, ...]) -> list[str]:
    """What a data scientist should hear of a kmeans or gmm job's set-up: columns of very different
    scales left unstandardized (from the federated std of secure sum 1)."""
    if params["standardize"]:
        return []
    _, std = cl.finish_moments(n, totals, len(features))
    line = cl.scale_warning(std, features)
    return [line] if line else []


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    dp_on = params.get("dp_epsilon", 0.0) > 0
    if ctx.data.partition == "vertical" and params["k_max"]:
        raise JobError("k_max: k is chosen over horizontal sites only; give k")
    if dp_on and params.get("k_max"):
        raise JobError("k_max: choosing k would spend privacy budget on every k tried; with dp_epsilon, give k")
    if ctx.data.partition == "vertical":      # LLF-CM over vertical sites (fedpeer/kinds/cluster/vertical.py)
        if dp_on:
            raise JobError("kmeans over vertical data does not take dp_epsilon")
        return await run_vertical(ch, params, ctx)
    if dp_on:
        return await kmeans_dp.run_dp(ch, params, ctx)
    return await run_job(ch, params, ctx)


def result(lloyd: cl.Lloyd, space: cl.Space, params: Mapping[str, Any], features: tuple[str, ...],
           n: int, sums: Sums) -> dict:
    best = lloyd.restarts[lloyd.best()]
    centers = space.back(best.centers)
    order = cl.canonical_order(centers)
    assert best.counts is not None and best.inertia is not None
    rounds = sums.sent_entries[1:]
    return {
        "k": params["k"], "features": list(features), "rows": n, "participants": sums.names(),
        "centers": centers[order].tolist(),
        "inertia": best.inertia,            # fuzzy c-means: the objective Σ u^m ‖x - c‖² it minimises
        "inertia_units": "standardized features" if params["standardize"] else "original units",
        "iterations": best.iterations, "converged": best.converged,
        "history": [{"round": i + 1, "inertia": v} for i, v in enumerate(best.history)],
        "cluster_sizes": sizes_shown(best.counts[order], params["min_cluster_rows"]),
        "restarts": len(lloyd.restarts), "restart_inertia": [r.inertia for r in lloyd.restarts],
        "kept_restart": lloyd.best(), "empty_clusters_reseeded": best.reseeded,
        "fuzziness": params["fuzziness"], "standardized": params["standardize"],
        "secure_sum": params["secure_sum"], "secure_sums": len(sums.sent_entries),
        "bytes_sent_per_site": 8 * sum(sums.sent_entries),
        "bytes_per_round_per_site": 8 * max(rounds) if rounds else 0,
        "_model": {"kind": "kmeans", "features": list(features), "centers": best.centers[order],
                   "shift": space.shift, "scale": space.scale, "fuzziness": params["fuzziness"]},
    }


def history(fit: str, result: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """The curve of a kmeans or gmm result: its fit (inertia, log-likelihood) per round."""
    return series(result.get("history") or [], None, (fit,))


# ---------------------------------------------------------------------------------------------
# The stored model and `fedpeer predict`
# ---------------------------------------------------------------------------------------------

def save_model(path: Any, model: Mapping[str, Any]) -> None:
    """Plain arrays in an .npz (no pickle); the feature names as a JSON string."""
    import io
    from pathlib import Path

    from fedpeer.base.store import atomic_write

    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in model.items() if k not in ("kind", "features")}
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, kind=np.array(model["kind"]), features=np.array(json.dumps(model["features"])),
             **arrays)
    atomic_write(Path(path), buffer.getvalue())


def load_arrays(path: Any, kind: str, shapes: Mapping[str, Callable[[int, int], tuple[int, ...]]]) -> dict:
    """The stored arrays, each checked: float64, finite, the shape `shapes[name](k, d)` gives.
    DataError naming the file otherwise."""
    import zipfile
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = {name: npz[name] for name in npz.files}
        if str(stored.pop("kind")[()]) != kind:
            raise ValueError(f"not a {kind} model")
        features = json.loads(str(stored.pop("features")[()]))
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise ValueError("features is not a list of names")
        d, k = len(features), stored["centers" if "centers" in stored else "means"].shape[0]
        out: dict[str, Any] = {"features": tuple(features)}
        for name, shape in shapes.items():
            a = stored[name]
            if a.dtype != np.float64 or a.shape != shape(k, d) or not np.isfinite(a).all():
                raise ValueError(f"array {name} is not finite float64 of shape {shape(k, d)}")
            out[name] = a
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a valid stored {kind} model: {exc}") from None
    return out


def load_model(path: Any) -> dict:
    model = load_arrays(path, "kmeans", {"centers": lambda k, d: (k, d), "shift": lambda k, d: (d,),
                                         "scale": lambda k, d: (d,), "fuzziness": lambda k, d: ()})
    if (model["scale"] <= 0).any() or not 1.0 <= float(model["fuzziness"]) <= 10.0:
        raise DataError(f"{path}: not a valid stored kmeans model: scale or fuzziness out of range")
    return model


def predict(model: Mapping[str, Any], X: np.ndarray) -> list[dict]:
    """Each row's cluster (index in the canonical order) and its distance to that centre
    (clustering space); fuzzy models add each cluster's membership."""
    Z = (X - model["shift"]) / model["scale"]
    d2 = cl.sq_distances(Z, model["centers"])
    labels = d2.argmin(axis=1)
    rows = [{"row": i + 1, "cluster": int(c), "distance": float(np.sqrt(d2[i, c]))} for i, c in enumerate(labels)]
    m = float(model["fuzziness"])
    if m > 1.0:
        u = cl.memberships(d2, m)
        for row, mem in zip(rows, u):
            row.update({f"u_{c}": float(v) for c, v in enumerate(mem)})
    return rows


# [policy.kmeans]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "clusters_max": Limit("k", 1000, "clusters (k)"),
    "iterations_max": Limit("max_iter", 10_000, "Lloyd rounds per restart, one secure sum each (max_iter)"),
    "restarts_max": Limit("n_init", 100, "restarts summed side by side (n_init)"),
    "cluster_rows_min": Limit("min_cluster_rows", 1, "smallest cluster size shown exactly (min_cluster_rows)"),
}


def predict_file(path: Path, result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict` with the stored model."""
    model = load_model(path)
    return predict(model, rows(model["features"]))


KIND = JobKind(name="kmeans", help="exact federated k-means / fuzzy c-means on secure sums (no label needed)",
               params=PARAMS, run=run, needs_data=True, binary_label=False, needs_label=False,
               save_model=save_model,
               model_file="model.npz",
               limits=LIMITS, in_effect=in_effect, describe=functools.partial(describe, "kmeans"),
               site_table=site_table,
               predict=predict_file, history=functools.partial(history, "inertia"),
               vertical=True, messages=VERTICAL_MESSAGES)
