"""`xgboost` histogram mode with differential privacy (`--param dp_epsilon=E`): every level of
every tree is one secure sum of the members' gradient and hessian histograms, each member's
clipped and noised before it is masked (fedpeer/protocols/dp.py), so no member — the sum's
initiator or a block owner included — holds an un-noised histogram. The arithmetic is
fedpeer/ml/xgb/dpboost.py; docs/algorithms.md, "Histogram mode with differential privacy".

What is released, and nothing else: per tree (`rounds` of them, binary:logistic only) and level
(max_depth of them) the noised histograms G and H of the tree's features (colsample_bytree
chooses them from the job seed: only theirs travel) — 2·rounds·max_depth releases, calibrated
together (`dp.calibrate`: one noise multiplier for every G, HESS_NOISE_WEIGHT times its variance
for every H), so the job is (dp_epsilon, dp_delta)-DP for
each site's rows, whatever the trees. Not released: the row counts (the split rule uses the
noised hessians instead of min_leaf_rows), the label counts (the base score is 0.5, public), the
quantile sketch (cut points are uniform over the proposal's public `dp_bounds`), and every
evaluation (a DP job runs no evaluation sum: each site scores the model on its own test part, or
its [data] test_csv, locally — `local_test` in its result, which never leaves it).

Bounds: `dp_bounds` (JSON {"col": [lo, hi], ...}, fedpeer/config/bounds.py `bounds_text`) is carried by
the proposal — the proposer fills it from its own [data] bounds — and every member refuses, before it touches its
data, a job whose dp_bounds differ from its own [data] bounds for a feature or lack one
(fedpeer/jobs/lifecycle/admission.py), so the cut points are the same public ones everywhere.

A DP sum gets one attempt (attempts_max=1): a member lost inside a sum stops the job, which
stays charged in every site's ledger (an epoch over the survivors would release a total without
the lost member's noise share). Checks of every level's noised totals, widened by the noise's
bound (dp.noise_bound, tail dp.NOISE_TAIL) and no more: no H bin below minus the bound; every
released feature's totals of a node agree with their mean; each node's totals within what
dp_rows_max rows could give, and (below the root) equal to its side of the parent's split.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, checked_total, site_seed
from fedpeer.jobs.privacy import bounds_refusal, colluders_of, job_bounds, job_cost
from fedpeer.ml import dpbins
from fedpeer.ml.xgb import boosting
from fedpeer.ml.xgb import dpboost as dx
from fedpeer.ml.xgb.histboost import model_bytes, tree_features
from fedpeer.protocols import dp
from fedpeer.protocols.securesum.api import secure_sum

TAG = "xgbh/dp"


def refusal(params: Mapping[str, Any]) -> str | None:
    """Why histogram XGBoost cannot take dp_epsilon with these parameters (None: it can, or no DP);
    the kind's `refused`, so the CLI, the proposer and every member refuse before anything is
    charged. Missing bounds are refused by every member (fedpeer/jobs/privacy.py `bounds_refusal`):
    the proposer fills them from its [data] bounds after the CLI's check."""
    if params.get("dp_epsilon", 0.0) <= 0:
        return None
    if params["mode"] != "histogram":
        return "xgboost with dp_epsilon runs in histogram mode only (bagging mode's trees are a site's own rows)"
    if params["objective"] != "binary:logistic":
        return ("xgboost with dp_epsilon takes objective binary:logistic only: its per-row gradients are bounded "
                "(g in [-1, 1], h in [0, 1/4]); multi:softprob and reg:squarederror are not yet")
    if params["max_bin"] > dpbins.BINS_MAX:
        return (f"xgboost with dp_epsilon takes max_bin up to {dpbins.BINS_MAX} (uniform bins: a cut's side sums fewer "
                "noised bins when there are fewer)")
    return None


def check_level(G: np.ndarray, H: np.ndarray, expected: np.ndarray | None, b_entry: float, b_g: float, b_h: float,
                rows_max: int) -> None:
    """A level's noised totals (int64 quanta, (nodes, F_r, bins)) against what honest members'
    clipped rows could give, widened by the noise's bounds (module docstring)."""
    if np.any(H < -b_entry):
        raise ValueError("every H bin at least zero (within the noise)")
    gt, ht, g_node, h_node = dx.node_totals(G, H)
    if np.any(np.abs(gt - g_node[:, None]) > b_g) or np.any(np.abs(ht - h_node[:, None]) > b_h):
        raise ValueError("the features' totals of a node agree (within the noise)")
    most = rows_max * float(2 ** dx.VALUE_BITS)
    if np.any(np.abs(g_node) > most + b_g) or np.any(h_node > most + b_h) or np.any(h_node < -b_h):
        raise ValueError("a node's G and H within what dp_rows_max rows give (within the noise)")
    if expected is not None and (np.any(np.abs(g_node - expected[:, 0]) > b_g)
                                 or np.any(np.abs(h_node - expected[:, 1]) > b_h)):
        raise ValueError("a node's totals equal its side of the parent's split (within the noise)")


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


async def run_dp(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                 offload: Callable[..., Any] | None = None) -> dict:
    """The xgboost kind's run() with dp_epsilon > 0; `offload` runs the heavier local steps
    (asyncio.to_thread in the daemon; `_inline` in simulations under virtual time)."""
    from fedpeer.kinds.xgboost.hist import hist_params
    from fedpeer.kinds.xgboost.messages import Tools
    from fedpeer.kinds.xgboost.site import Site, score_result
    from fedpeer.kinds.xgboost.target import class_names, model_score, prepare, site_labels

    why = refusal(params) or bounds_refusal(params, {}, ())
    if why is not None:
        raise JobError(why)
    assert getattr(ctx.data, "engine", "memory") == "memory", "a Dask site refuses DP at admission (dask_refused)"
    features = list(ctx.data.features)
    bounds = job_bounds(params, ctx.site_name, features)
    members = len(ch.members)
    colluders = colluders_of(params, members)
    site = Site(ch=ch, params=params, ctx=ctx, tools=Tools())
    prepare(site)                                   # the same seeded train/test split as the exact mode
    X, y = site.fit
    p = hist_params(params, 1)
    sp = p.split_params()
    n_bins, depth, F = int(params["max_bin"]), int(params["max_depth"]), X.shape[1]
    try:
        cuts = dpbins.uniform_cuts(dpbins.bounds_matrix(bounds, features), n_bins)
    except ValueError as exc:
        raise JobError(f"xgboost with dp_epsilon: {exc}") from None
    offload = offload or asyncio.to_thread
    bins = await offload(dpbins.bin_rows, X, cuts)
    n_released = int(tree_features(p, 0, F).sum())
    eps, delta = job_cost(params)
    sums = dx.plan(n_released, depth, p.num_round, n_bins)
    mus = await offload(dp.calibrate, sums, eps, delta,     # a search over dp-accounting's curve: off the loop
                        [1.0, dx.HESS_NOISE_WEIGHT] * (len(sums) // 2))
    mu_g, mu_h = mus[0], mus[1]                         # the same sensitivity: one μ for G's, one for H's
    spread = dp.spread(members, colluders)      # the total carries μ·n/(n − t)
    sigma_g = math.sqrt(mu_g * spread) * 2.0 ** -dx.GRAD_FRAC      # one bin's noise, in g's units
    sigma_h = math.sqrt(mu_h * spread) * 2.0 ** -dx.HESS_FRAC
    rng = ctx.noise_rng if ctx.noise_rng is not None else dp.os_rng()
    mode, hop, rows_max = params["secure_sum"], ctx.hop_timeout_ms, int(params["dp_rows_max"])
    seed = site_seed(params["seed"], ch.me)
    margins = np.zeros(X.shape[0])
    trees, released, i = [], [], 0
    for t in range(p.num_round):
        ch.progress(f"histogram mode, noised: tree {t + 1} of {p.num_round}", t, p.num_round)
        gq, hq = dx.quantised_derivatives(margins, y)
        drawn = None                 # this member's own draw of the tree's rows (as HistSite draws them)
        if p.subsample < 1.0:
            drawn = np.random.default_rng([seed, t]).random(len(y)) < p.subsample
        chosen = np.flatnonzero(tree_features(p, t, F))
        tree_bins = bins if len(chosen) == F else np.ascontiguousarray(bins[:, chosen])
        tree, positions = dx.DpTree(), np.zeros(len(y), dtype=np.int64)
        expected = None
        for d in range(depth):
            if not tree.frontier:
                break
            frontier = np.asarray(tree.frontier, dtype=np.int64)
            G, H = await offload(dx.level_sums, tree_bins, gq, hq, positions, frontier, n_bins, drawn)
            s = [dataclasses.replace(x, entries=G.size) for x in sums[i:i + 2]]    # the nodes that are there
            vector = dp.noised_vector([G.ravel(), H.ravel()], s, [mu_g, mu_h], members, rng, colluders)
            tag = f"{TAG}/t{t}/d{d}"
            outcome = await secure_sum(ch, tag, vector, mode=mode, hop_timeout_ms=hop, attempts_max=1)
            released += [(s[0], mu_g), (s[1], mu_h)]
            try:
                total = dp.whole_total(outcome.participants, ch.members, outcome.total)
            except ValueError as exc:
                raise JobError(str(exc)) from None
            Gt, Ht = total[:G.size].reshape(G.shape), total[G.size:].reshape(H.shape)
            b_entry = dp.noise_bound(mu_h * spread, H.size)
            node_entries = 2 * len(frontier) * len(chosen)      # a node's totals, and their differences
            b_g, b_h = (dp.noise_bound(2.0 * m * spread * n_bins, node_entries) for m in (mu_g, mu_h))
            checked_total(tag, check_level, Gt, Ht, expected, b_entry, b_g, b_h, rows_max)
            dx.decide(tree, Gt * 2.0 ** -dx.GRAD_FRAC, Ht * 2.0 ** -dx.HESS_FRAC, chosen, sp, sigma_g, sigma_h,
                      last=d == depth - 1)
            expected = np.array([[tree.G[c] * 2.0 ** dx.GRAD_FRAC, tree.H[c] * 2.0 ** dx.HESS_FRAC]
                                 for c in tree.frontier]).reshape(-1, 2)
            await offload(dx.route, tree, bins, positions)
            i += 2
        i = (t + 1) * 2 * depth
        final = dx.finish(tree, cuts, sp)
        margins += final.value[positions]
        trees.append(final)
    model = model_bytes(trees, (dx.BASE_SCORE,), F, p)
    counted = await offload(dp.epsilon_of, released, delta)
    info = boosting.model_info(model)
    out: dict[str, Any] = {
        "mode": "histogram", "rounds": params["rounds"], "trees": info.n_trees,
        "model_sha256": boosting.model_sha256(model), "history": [], "base_score": dx.BASE_SCORE,
        "features": features, "objective": params["objective"], "classes": class_names(params),
        "rows": {"train": int(len(y)), "test": int(len(site.test[1])) if params["test_fraction"] else 0},
        "members": [ctx.names.get(m, m.hex()[:16]) for m in ch.members], "lost": [],
        "secure_sums": len(released) // 2,
        "privacy": {"mechanism": "skellam", "epsilon": counted, "delta": delta,
                    "epsilon_asked": eps, "colluders": colluders, "releases": len(released),
                    "noise_variance": {"g": mu_g, "h": mu_h}, "bits_per_value": dx.VALUE_BITS + 1, "bins": n_bins,
                    "split_rule": "xgboost's gain on the noised G, H less the noise's expected share; each side's "
                                  f"noised H at least max(min_child_weight, {dx.HESS_SIGMAS:g} noise sd); leaf "
                                  "values from the noised sums, shrunk by their noise's variance",
                    "accounting": f"RDP (dp-accounting), {len(released)} releases"},
    }
    score_result(out, params, None, "")
    if params["test_fraction"] > 0:      # this site's own test part, scored here: nothing is released
        out["local_test"] = await offload(model_score, model, site.test[0], site.test[1], params)
    if ctx.test_data is not None:
        score_result(out, params, None, "", await offload(model_score, model, ctx.test_data.X,
                                                          site_labels(ctx.test_data, params), params))
    out["_model"] = model
    return out
