"""`tree` (mode exact) with differential privacy (`--param dp_epsilon=E`): every level of the tree
is one secure sum of the members' class counts per (node, feature, bin), each member's noised
with its Skellam share before it is masked (fedpeer/protocols/dp.py), so no member — the sum's
initiator or a block owner included — holds an un-noised count. The arithmetic is
fedpeer/ml/tree/dpcart.py; docs/algorithms.md, "One tree with differential privacy".

What is released, and nothing else: per level (max_depth of them) the noised class counts of the
frontier nodes per feature and uniform bin — max_depth releases, calibrated together
(`dp.calibrate`: one noise variance for every level, L1 sensitivity F, L2 √F), so the job is
(dp_epsilon, dp_delta)-DP for each site's rows, whatever the tree. Not released: the federation's
row count (the result's is the noised root's), the quantile sketch (cut points are uniform over the
proposal's public `dp_bounds`, as histogram XGBoost's: fedpeer/kinds/xgboost/hist_dp.py), and every
evaluation (each site scores the tree on its own test part, or its [data] test_csv, locally —
`local_test` in its result, which never leaves it).

Mode icdta refuses dp_epsilon: its members' own trees travel un-noised. squared_error refuses it
too (its Σy, Σy² need a label bound and their own sensitivities; not built).

A DP sum gets one attempt (attempts_max=1): a member lost inside a sum stops the job, which stays
charged in every site's ledger. Checks of every level's noised counts, widened by the noise's bound
(dp.noise_bound, tail dp.NOISE_TAIL) and no more: no cell below minus the bound; every feature's
class totals of a node agree with their mean; a node's class counts within what dp_rows_max rows
could give; below the root, a node's counts equal its side of the parent's split.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, JobFailsEverywhere, checked_total
from fedpeer.jobs.privacy import bounds_refusal, colluders_of, job_bounds, job_cost
from fedpeer.ml import dpbins
from fedpeer.ml.tree import dpcart
from fedpeer.ml.tree.model import rules
from fedpeer.protocols import dp
from fedpeer.protocols.securesum.api import secure_sum
from fedpeer.protocols.securesum.wire import VECTOR_ENTRIES_MAX

TAG = "tree/dp"
SPLIT_RULE = ("the criterion's weighted impurity decrease on the noised class counts (gini: Σc² less the noise's "
              f"expectation); each side's noised rows at least max(min_leaf_rows, {dpcart.SIZE_SIGMAS:g} noise sd); "
              "leaf class shares from the noised counts")


def refusal(params: Mapping[str, Any]) -> str | None:
    """Why the tree kind cannot take dp_epsilon with these parameters (None: it can, or no DP): the
    kind's `refused`, so the CLI, the proposer and every member refuse before anything is charged."""
    if params.get("dp_epsilon", 0.0) <= 0:
        return None
    if params["mode"] != "exact":
        return ("tree with dp_epsilon runs in mode exact only (mode icdta sends every member's own tree, "
                "un-noised, to the others)")
    if params["criterion"] == "squared_error":
        return "tree with dp_epsilon takes criterion gini or entropy only (squared_error's Σy, Σy² are not yet)"
    if params["max_bin"] > dpbins.BINS_MAX:
        return f"tree with dp_epsilon takes max_bin up to {dpbins.BINS_MAX} (uniform bins from dp_bounds)"
    return None


def check_level(C: np.ndarray, expected: np.ndarray | None, b_cell: float, b_node: float, rows_max: int) -> None:
    """A level's noised counts (int64 (nodes, F, B, K)) against what honest members' rows could
    give, widened by the noise's bounds (module docstring)."""
    if np.any(C < -b_cell):
        raise ValueError("every count at least zero (within the noise)")
    T = C.sum(axis=2)
    mean = T.mean(axis=1)
    if np.any(np.abs(T - mean[:, None, :]) > b_node):
        raise ValueError("the features' class totals of a node agree (within the noise)")
    if np.any(mean > rows_max + b_node) or np.any(mean < -b_node):
        raise ValueError("a node's class counts within what dp_rows_max rows give (within the noise)")
    if expected is not None and np.any(np.abs(mean - expected) > b_node):
        raise ValueError("a node's class counts equal its side of the parent's split (within the noise)")


def bits_per_value(rows_max: int, bound: float) -> int:
    """Bits of a released count's signed range: [-bound, rows_max + bound], sign included."""
    return math.ceil(math.log2(rows_max + bound + 1)) + 1


async def run_dp(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                 offload: Callable[..., Any] | None = None) -> dict:
    """The tree kind's run() with dp_epsilon > 0 (module docstring)."""
    from fedpeer.kinds.tree.job import TreeJob, finish_result

    why = refusal(params) or bounds_refusal(params, {}, ())
    if why is not None:
        raise JobError(why)
    features = list(ctx.data.features)
    bounds = job_bounds(params, ctx.site_name, features)
    members = len(ch.members)
    colluders = colluders_of(params, members)
    offload = offload or asyncio.to_thread
    job = TreeJob(ch, params, ctx, offload)
    X, y = job.fit
    n_bins, depth, F, K = int(params["max_bin"]), int(params["max_depth"]), X.shape[1], len(job.classes)
    widest = 2 ** (depth - 1) * F * n_bins * K
    if widest > VECTOR_ENTRIES_MAX:
        raise JobFailsEverywhere(f"tree: level {depth - 1} could sum {widest} numbers, more than one secure sum "
                                 f"carries ({VECTOR_ENTRIES_MAX}); lower max_bin or max_depth")
    try:
        cuts = dpbins.uniform_cuts(dpbins.bounds_matrix(bounds, features), n_bins)
    except ValueError as exc:
        raise JobError(f"tree with dp_epsilon: {exc}") from None
    bins = await offload(dpbins.bin_rows, X, cuts)
    labels = np.asarray(y, dtype=np.int64)
    eps, delta = job_cost(params)
    sums = dpcart.plan(F, depth, n_bins, K)
    mu = (await offload(dp.calibrate, sums, eps, delta))[0]     # one sensitivity: one μ for every level
    spread = dp.spread(members, colluders)      # the total carries μ·n/(n − t)
    var_cell = mu * spread
    rng = ctx.noise_rng if ctx.noise_rng is not None else dp.os_rng()
    mode, hop, rows_max = params["secure_sum"], ctx.hop_timeout_ms, int(params["dp_rows_max"])
    tree, positions = dpcart.DpCart(), np.zeros(len(labels), dtype=np.int64)
    released: list[tuple[dp.DpSum, float]] = []
    expected, b_cell = None, 0.0
    for d in range(depth):
        if not tree.frontier:
            break
        ch.progress(f"tree, noised: level {d + 1}", d, depth)
        frontier = np.asarray(tree.frontier, dtype=np.int64)
        C = await offload(dpcart.level_counts, bins, labels, positions, frontier, n_bins, K)
        s = dataclasses.replace(sums[d], entries=C.size)                 # the nodes that are there
        vector = dp.noised_vector([C.ravel()], [s], [mu], members, rng, colluders)
        tag = f"{TAG}/d{d}"
        outcome = await secure_sum(ch, tag, vector, mode=mode, hop_timeout_ms=hop, attempts_max=1)
        released.append((s, mu))
        try:
            total = dp.whole_total(outcome.participants, ch.members, outcome.total)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        Ct = total.reshape(C.shape)
        b_cell = dp.noise_bound(var_cell, C.size)
        b_node = dp.noise_bound(2.0 * var_cell * n_bins, len(frontier) * F * K)   # a feature's total less the mean
        await offload(checked_total, tag, check_level, Ct, expected, b_cell, b_node, rows_max)
        await offload(dpcart.decide, tree, Ct.astype(np.float64), var_cell, params["criterion"],
                      params["min_leaf_rows"], d == depth - 1)
        expected = np.array([tree.counts[c] for c in tree.frontier]).reshape(-1, K)
        await offload(dpcart.route, tree, bins, positions)
    cart = await offload(dpcart.finish, tree, cuts, params["criterion"], K, params["ccp_alpha"])
    counted = await offload(dp.epsilon_of, released, delta)
    job.rows = int(cart.n_node_samples[0])                    # the noised root's rows: the count is not released
    out: dict[str, Any] = {
        "criterion": params["criterion"], "max_depth": depth, "max_bin": n_bins,
        "min_leaf_rows": params["min_leaf_rows"], "ccp_alpha": params["ccp_alpha"], "exact_features": 0,
        "privacy": {"mechanism": "skellam", "epsilon": counted, "delta": delta, "epsilon_asked": eps,
                    "colluders": colluders, "releases": len(released), "noise_variance": mu, "bins": n_bins,
                    "bits_per_value": bits_per_value(rows_max, b_cell), "split_rule": SPLIT_RULE,
                    "accounting": f"RDP (dp-accounting), {len(released)} releases"},
    }
    out = await finish_result(job, cart, rules(cart, features, job.classes, params["min_leaf_rows"]), out,
                              federated=False)
    out["secure_sums"] = len(released)
    return out
