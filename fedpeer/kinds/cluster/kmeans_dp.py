"""`kmeans` with differential privacy (`--param dp_epsilon=E --param dp_clip=C`): Lloyd's rounds on
clipped, noised secure sums (fedpeer/protocols/dp.py; docs/algorithms.md, clustering).

A DP job is hard k-means, one restart, a public number of rounds (`dp_rounds`, fixed in advance so
the noise can be calibrated before any sum): the accountant must know every release.
1. moments: [rows], [Σx per feature] and [Σx² per feature] (values clipped to ±C): the noised
   federation mean and spread, from which the initial centres are drawn with the job seed
   (public), as kmeans draws them (N(mean, std²)).
2. dp_rounds rounds, each one sum of [Σx of the rows nearest each centre (k·d)] and [their counts (k)].
Sensitivities (add or remove one row; quanta of 2^-f with C·2^f <= 2^VALUE_BITS): rows 1; Σx and
Σx² (its own scale) L1 d·2^VALUE_BITS, L2 √d·2^VALUE_BITS (a row adds to one centre only, so per round too); counts 1.
All 3 + 2·dp_rounds releases are calibrated together (equal noise multipliers). A centre whose
noised count is below `min_cluster_rows` keeps its place; centres stay within ±C.

What every member learns: the noised totals only. The inertia is not released (another release
would cost budget): the result reports none; a member scores its own rows with the centres.
Checks: the moments' rows within [2, dp_rows_max], Σx and Σx² within what the rows' clipped
values allow; every round's counts adding up to the rows and each count, each Σx within what honest
members' clipped rows could give, widened by the noise's bound (dp.noise_bound) and no more.
A DP sum gets one attempt (attempts_max=1): a ring mode's re-run over fewer members would hand
every member a total short of the lost member's noise share. A lost member stops the job; it stays charged.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.capabilities import DP_SKELLAM
from fedpeer.jobs.kind import JobContext, Param, checked_total
from fedpeer.jobs.params import DP_PARAMS
from fedpeer.jobs.privacy import colluders_of, job_cost
from fedpeer.ml.cluster.kmeans import initial_centers
from fedpeer.protocols import dp
from fedpeer.protocols.fixedpoint import fraction_bits
from fedpeer.protocols.securesum.api import secure_sum

VALUE_BITS = 19
PARAMS = {
    **DP_PARAMS,
    "dp_rounds": Param(int, 8, "differential privacy: Lloyd rounds, all run (the noise is calibrated to them)",
                       low=1, high=100, capability=DP_SKELLAM),
}


def plan(k: int, d: int, rounds: int) -> list[dp.DpSum]:
    top = float(2 ** VALUE_BITS)
    sums = [dp.DpSum("rows", 1, 1, 1), dp.DpSum("moments", d * top, math.sqrt(d) * top, d),
            dp.DpSum("squares", d * top, math.sqrt(d) * top, d)]
    for r in range(1, rounds + 1):
        sums += [dp.DpSum(f"round{r}/sums", d * top, math.sqrt(d) * top, k * d), dp.DpSum(f"round{r}/counts", 1, 1, k)]
    return sums


def local_round(X: np.ndarray, Q: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ quantised x per nearest centre (k·d), rows per centre (k)) of this site's clipped rows X,
    Q = round(X·2^f) (whole floats below 2^VALUE_BITS: their float64 sums over fewer than
    2^(52 - VALUE_BITS) rows are exact, matrix product included)."""
    nearest = ((centres * centres).sum(axis=1) - 2.0 * (X @ centres.T)).argmin(axis=1)
    k = centres.shape[0]
    onehot = np.zeros((X.shape[0], k))
    onehot[np.arange(X.shape[0]), nearest] = 1.0
    return (onehot.T @ Q).astype(np.int64).ravel(), np.bincount(nearest, minlength=k).astype(np.int64)


def check_moments(total: np.ndarray, d: int, bounds: list[float], rows_max: int) -> int:
    n, top = int(total[0]), float(2 ** VALUE_BITS)
    if not 2 <= n <= rows_max + bounds[0]:
        raise ValueError("check 'the rows between 2 and dp_rows_max (within the noise)' failed")
    most = (n + bounds[0]) * top
    if np.any(np.abs(total[1:1 + d]) > most + bounds[1]):
        raise ValueError("check 'every Σx within the rows times the clip (within the noise)' failed")
    squares = total[1 + d:]
    if np.any(squares < -bounds[2]) or np.any(squares > most + bounds[2]):
        raise ValueError("check 'every Σx² within [0, rows times the clip²] (within the noise)' failed")
    return n


def check_round(sums: np.ndarray, counts: np.ndarray, n: int, b_sums: float, b_counts: float) -> None:
    top = float(2 ** VALUE_BITS)
    k = len(counts)
    if np.any(counts < -b_counts) or abs(int(counts.sum()) - n) > k * b_counts + b_counts:
        raise ValueError("check 'the cluster sizes add up to the rows (within the noise)' failed")
    most = (np.maximum(counts, 0) + b_counts)[:, None] * top + b_sums
    if np.any(np.abs(sums.reshape(k, -1)) > most):
        raise ValueError("check 'every cluster's Σx within its rows times the clip (within the noise)' failed")


async def run_dp(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    clip, rounds, k = float(params["dp_clip"]), int(params["dp_rounds"]), int(params["k"])
    if clip <= 0:
        raise JobError("kmeans with dp_epsilon needs dp_clip: the public bound on every feature's |value|")
    if params["fuzziness"] != 1.0 or params["init"]:
        raise JobError("kmeans with dp_epsilon runs hard k-means from drawn centres: leave fuzziness and init out")
    X = dp.clip_entries(np.asarray(ctx.data.X, dtype=float), -clip, clip)
    d, members = X.shape[1], len(ch.members)
    colluders = colluders_of(params, members)
    eps, delta = job_cost(params)
    sums = plan(k, d, rounds)
    mus = await asyncio.to_thread(dp.calibrate, sums, eps, delta)    # a search over dp-accounting's curve: off the loop
    total_mu = dp.spread(members, colluders)      # the total carries μ·n/(n − t)
    bounds = [dp.noise_bound(mu * total_mu, s.entries) for s, mu in zip(sums, mus)]
    rng = ctx.noise_rng if ctx.noise_rng is not None else dp.os_rng()
    scale = 2.0 ** -fraction_bits(clip, VALUE_BITS)
    assert X.shape[0] < 2 ** (52 - VALUE_BITS)
    Q = np.rint(X / scale)
    mode, hop, tag = params["secure_sum"], ctx.hop_timeout_ms, "kmeans/dp-"

    ch.progress("moments, noised", 0, rounds + 1)
    moments = [[X.shape[0]], dp.summed_quanta(X.copy(), clip, VALUE_BITS),
               dp.summed_quanta(np.square(X), clip * clip, VALUE_BITS)]
    vector = dp.noised_vector(moments, sums[:3], mus[:3], members, rng, colluders)
    total = _signed(await secure_sum(ch, tag + "moments", vector, mode=mode, hop_timeout_ms=hop, attempts_max=1), ch)
    n = checked_total(tag + "moments", check_moments, total, d, bounds, params["dp_rows_max"])
    mean = np.clip(total[1:1 + d] * scale / n, -clip, clip)
    square_scale = 2.0 ** -fraction_bits(clip * clip, VALUE_BITS)
    std = np.sqrt(np.clip(total[1 + d:] * square_scale / n - mean * mean, 0.0, clip * clip))
    # kmeans' own initial centres (fedpeer/ml/cluster/kmeans.py): N(mean, std²) with the job seed
    centres = np.clip(initial_centers(mean, std, k, params["seed"], 0), -clip, clip)
    sizes = np.zeros(k)
    for r in range(1, rounds + 1):
        ch.progress(f"lloyd round {r}, noised", r, rounds + 1)
        s_local, c_local = local_round(X, Q, centres)
        i = 1 + 2 * r
        vector = dp.noised_vector([s_local, c_local], sums[i:i + 2], mus[i:i + 2], members, rng, colluders)
        outcome = await secure_sum(ch, f"{tag}round{r}", vector, mode=mode, hop_timeout_ms=hop, attempts_max=1)
        total = _signed(outcome, ch)
        s_total, sizes = total[:k * d], total[k * d:]
        checked_total(f"{tag}round{r}", check_round, s_total, sizes, n, bounds[i], bounds[i + 1])
        kept = sizes >= params["min_cluster_rows"]
        moved = s_total.reshape(k, d) * scale / np.maximum(sizes, 1)[:, None]
        centres = np.where(kept[:, None], np.clip(moved, -clip, clip), centres)
    order = np.lexsort(centres.T[::-1])
    released = list(zip(sums, mus))
    return {
        "k": k, "features": list(ctx.data.features), "rows": n,
        "participants": [ctx.names.get(m, m.hex()[:16]) for m in ch.members],
        "centers": centres[order].tolist(), "inertia": None, "iterations": rounds, "converged": None,
        "cluster_sizes": [int(c) if c >= params["min_cluster_rows"] else f"< {params['min_cluster_rows']}"
                          for c in np.maximum(sizes, 0)[order]],
        "secure_sum": mode, "standardized": False, "fuzziness": 1.0, "history": [], "secure_sums": rounds + 1,
        # federated means and deviations would be one more release: DP k-means clusters the values
        # as they are, clipped to ±dp_clip, and says so when standardize (the default) was asked
        "warnings": ["not standardized: with dp_epsilon the values are clustered in their own units, clipped "
                     "to ±dp_clip; scale the columns alike before the job"] if params.get("standardize") else [],
        "privacy": {"mechanism": "skellam", "epsilon": dp.epsilon_of(released, delta), "delta": delta,
                    "epsilon_asked": eps, "clip": clip, "colluders": colluders, "rounds": rounds,
                    "bits_per_value": VALUE_BITS + 1,
                    "accounting": f"RDP (dp-accounting), {len(sums)} releases"},
        "_model": {"kind": "kmeans", "features": list(ctx.data.features), "centers": centres[order],
                   "shift": np.zeros(d), "scale": np.ones(d), "fuzziness": 1.0},
    }


def _signed(outcome: Any, ch: Any) -> np.ndarray:
    try:
        return dp.whole_total(outcome.participants, ch.members, outcome.total)
    except ValueError as exc:
        raise JobError(str(exc)) from None
