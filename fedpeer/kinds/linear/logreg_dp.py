"""`logreg` with differential privacy (`--param dp_epsilon=E`): gradient descent for a fixed number
of steps on clipped, noised gradient sums (fedpeer/protocols/dp.py; docs/algorithms.md, logistic
regression with DP).

The fit (every member alike, from the noised totals only):
    W_0 = 0;  W_k = W_{k-1} - dp_step · ( G_k / 2^f + coef_{k-1} / C ) / n       k = 1 .. dp_iterations
with G_k the noised secure sum of every row's gradient of its log-loss at W_{k-1}, that gradient
first scaled down to L2 norm at most dp_grad_clip and rounded to quanta of 2^-f
(dp_grad_clip · 2^f <= 2^VALUE_BITS), and n the noised row count (released once, with G_1).
No line search (it would compare un-noised losses) and no stopping rule (the number of releases
must be known before the first, to calibrate the noise): `dp_iterations` sums, all run.

Features need no public bounds: the clip bounds each row's gradient whatever its feature values,
so the rows are used as they are, without the exact mode's standardisation (which would release
the federation's means and spreads, needing per-column bounds to noise them). Put the features on
comparable scales before the job (a public transformation): the clip scales a row's gradient as a
whole, so a column of large values dominates what is left of it.

Sensitivities (add or remove one row; integer units of the sums):
- rows: L1 = L2 = 1;
- every gradient sum (P = groups·(features + 1) entries): the row's rounded, clipped gradient,
  L2 <= dp_grad_clip·2^f + √P/2 (rounding moves each entry by at most 1/2), L1 <= √P·L2.
All 1 + dp_iterations releases are calibrated together (`dp.calibrate`: equal noise multipliers,
the split rule the result reports), so the job is (dp_epsilon, dp_delta)-DP for each site's rows.

Released: only those sums. Not released: the class counts (the noised rows are enough for the
step), the federation's log-loss (a line search or a stopping rule would need it) and the exact
mode's federated evaluation on the held-out parts (another release: its budget would come out of
the fit's). Each site scores its own held-out part (`test_fraction`) and [data] test_csv
locally; those figures stay in its own result.

Checks: the rows within [2, dp_rows_max] widened by the noise's bound; every gradient sum's L2 norm
within what the rows' clipped gradients allow, (rows + bound)·L2, plus the noise vector's bound
√P·dp.noise_bound (tail dp.NOISE_TAIL per sum), and no more.
A DP sum gets one attempt (attempts_max = 1; docs/security.md, a DP sum's retry): a member lost
inside a sum stops the job, which stays charged at every site; there is no new epoch over the
survivors as in the exact mode (that would be dp_iterations more releases than the proposal paid for).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.capabilities import DP_LOGREG
from fedpeer.jobs.kind import Param, checked_total
from fedpeer.jobs.params import DP_PARAMS
from fedpeer.jobs.privacy import colluders_of, job_cost
from fedpeer.ml import evaluation as evalcounts
from fedpeer.ml.blas import one_blas_thread
from fedpeer.ml.linear import logistic as linear
from fedpeer.protocols import dp
from fedpeer.protocols.fixedpoint import fraction_bits
from fedpeer.protocols.securesum.api import secure_sum

VALUE_BITS = 19             # a row's clipped gradient is at most 2^19 quanta in L2 norm (20 bits with the sign)
CHUNK_ROWS = 1 << 14        # rows per block of per-row gradients (bounds temporary memory)
ROWS_MAX = 2 ** 32          # float64 sums of rounded entries (<= 2^19 + 1) over fewer rows are exact
TAG = "lr/dp"

# dp_epsilon takes logreg's own capability: a member whose logreg predates DP refuses it by name
# even when its stats and kmeans take dp-skellam-1. dp_clip (per-feature bounds) is not a parameter
# here: the gradient's clip replaces it (module docstring).
PARAMS = {
    "dp_epsilon": replace(DP_PARAMS["dp_epsilon"], capability=DP_LOGREG,
                          help="differential privacy: the job's ε for each site's rows (0: off; mode exact only)"),
    **{name: DP_PARAMS[name] for name in ("dp_delta", "dp_rows_max", "dp_colluders")},
    "dp_grad_clip": Param(float, 1.0, "differential privacy: the L2 bound every row's log-loss gradient is "
                          "clipped to (no feature bounds needed)", low=1e-6, high=1e6, capability=DP_LOGREG),
    "dp_iterations": Param(int, 20, "differential privacy: gradient-descent steps, all run (the noise is "
                           "calibrated to them); one secure sum each", low=1, high=1000, capability=DP_LOGREG),
    "dp_step": Param(float, 2.0, "differential privacy: the gradient-descent step on the mean penalised "
                     "log-loss", low=1e-6, high=1e3, capability=DP_LOGREG),
}


def plan(P: int, iterations: int, clip: float) -> list[dp.DpSum]:
    """The job's releases: the rows, then one gradient sum per step (module docstring)."""
    l2 = clip * 2.0 ** fraction_bits(clip, VALUE_BITS) + math.sqrt(P) / 2 + 1e-6   # 1e-6: float rounding of the clip
    return [dp.DpSum("rows", 1, 1, 1)] + [dp.DpSum(f"it{k}/gradient", math.sqrt(P) * l2, l2, P)
                                          for k in range(1, iterations + 1)]


def local_gradient(Z: np.ndarray, y: np.ndarray, W: np.ndarray, clip: float) -> np.ndarray:
    """Σ over this site's rows of round(clip_l2(∇loss_i(W), clip)·2^f), f = fraction_bits(clip,
    VALUE_BITS), as int64 (P,) row-major as W. Z: rows with a trailing column of ones."""
    groups, width = W.shape
    assert Z.shape[0] < ROWS_MAX
    scale = 2.0 ** fraction_bits(clip, VALUE_BITS)
    out = np.zeros(groups * width)
    for start in range(0, Z.shape[0], CHUNK_ROWS):
        z, t = Z[start:start + CHUNK_ROWS], y[start:start + CHUNK_ROWS]
        p = linear.probabilities(z, W)
        if groups == 1:
            residual = (p - t)[:, None]
        else:
            residual = p
            residual[np.arange(len(t)), t] -= 1.0
        rows = (residual[:, :, None] * z[:, None, :]).reshape(len(t), groups * width)
        rows = dp.clip_l2(rows, clip) * scale
        out += np.rint(rows, out=rows).sum(axis=0)
    return out.astype(np.int64)


def check_rows(total: np.ndarray, bound: float, rows_max: int) -> int:
    n = int(total[0])
    if n < 2 or n > rows_max + bound:
        raise ValueError("check 'the rows between 2 and dp_rows_max (within the noise)' failed")
    return n


def check_gradient(total: np.ndarray, n: int, rows_bound: float, release: dp.DpSum, bound: float) -> None:
    most = (n + rows_bound) * release.l2 + math.sqrt(release.entries) * bound
    if float(np.linalg.norm(total.astype(np.float64))) > most:
        raise ValueError("check 'the gradient sum within the rows times the clip (within the noise)' failed")


def _penalised(W: np.ndarray) -> np.ndarray:
    mask = np.ones_like(W)
    mask[:, -1] = 0.0
    return mask


async def fit_dp(member: Any) -> dict:
    """The DP fit of a logreg Member (fedpeer/kinds/linear/logreg.py), its result with "privacy"."""
    ch, params, ctx = member.ch, member.params, member.ctx
    if params["mode"] != "exact":
        raise JobError("logreg mode fedavg does not take dp_epsilon (only mode exact has DP)")
    if params["groups"].strip():
        raise JobError("logreg: groups is for mode fedavg, which does not take dp_epsilon")
    members = len(ch.members)
    colluders = colluders_of(params, members)
    clip, steps, step = float(params["dp_grad_clip"]), int(params["dp_iterations"]), float(params["dp_step"])
    eps, delta = job_cost(params)
    d, groups = member.X.shape[1], member.groups
    W = np.zeros((groups, d + 1))
    sums = plan(W.size, steps, clip)
    mus = await member.offload(dp.calibrate, sums, eps, delta)     # 0.2 s at 1000 steps: off the event loop
    total_mu = dp.spread(members, colluders)      # the total carries μ·n/(n − t)
    bounds = [dp.noise_bound(mu * total_mu, s.entries) for s, mu in zip(sums, mus)]
    rng = ctx.noise_rng if ctx.noise_rng is not None else dp.os_rng()
    quantum = 2.0 ** -fraction_bits(clip, VALUE_BITS)
    Z = linear.design(member.X, np.zeros(d), np.ones(d))
    mode, hop, C = params["secure_sum"], ctx.hop_timeout_ms, float(params["C"])
    n, history = 0, []
    for k in range(1, steps + 1):
        ch.progress(f"logreg: DP gradient step {k}", k, steps)
        grad = await member.offload(one_blas_thread, local_gradient, Z, member.y, W, clip)
        if k == 1:
            vector = dp.noised_vector([[Z.shape[0]], grad], sums[:2], mus[:2], members, rng, colluders)
        else:
            vector = dp.noised_vector([grad], sums[k:k + 1], mus[k:k + 1], members, rng, colluders)
        tag = f"{TAG}/it{k}"
        outcome = await secure_sum(ch, tag, vector, mode=mode, hop_timeout_ms=hop, attempts_max=1)
        try:
            total = dp.whole_total(outcome.participants, ch.members, outcome.total)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        if k == 1:
            n = checked_total(tag, check_rows, total[:1], bounds[0], int(params["dp_rows_max"]))
            total = total[1:]
        checked_total(tag, check_gradient, total, n, bounds[0], sums[k], bounds[k])
        g = (total.reshape(W.shape) * quantum + _penalised(W) * W / C) / n
        W = linear._grid(W - step * g)
        history.append({"iteration": k, "grad_max": float(np.abs(g).max()), "step": step})
    return local_result(member, W, n, history, sums, mus, delta, eps)


def local_result(member: Any, W: np.ndarray, n: int, history: list[dict], sums: list[dp.DpSum],
                 mus: list[float], delta: float, eps: float) -> dict:
    """The DP fit's result: the model, what was spent, and this site's own scores (not released)."""

    params, ctx = member.params, member.ctx
    names, features = member.names, list(ctx.data.features)
    coef, intercept = W[:, :-1], W[:, -1]
    labels = names or ["negative", "positive"]
    here = np.bincount(member.y, minlength=max(member.groups, 2))
    members, lost = member.member_names()
    out: dict[str, Any] = {
        "mode": "exact", "solver": "dp-gd", "C": params["C"], "status": "dp_iterations",
        "iterations": len(history), "evaluations": len(history), "secure_sums": len(history),
        "grad_max": history[-1]["grad_max"], "features": features, "classes": names,
        "coef": coef.tolist(), "intercept": intercept.tolist(), "rows": n,
        "test_fraction": params.get("test_fraction", 0.0),
        "classes_absent_here": [labels[k] for k, c in enumerate(here) if c == 0],
        "history": history, "members": members, "lost": lost,
        "sklearn": linear.sklearn_export(coef, intercept, names, features),
        "federated_eval": None, "auc": None, "auc_source": None,
        "privacy": {"mechanism": "skellam", "epsilon": dp.epsilon_of(list(zip(sums, mus)), delta), "delta": delta,
                    "epsilon_asked": eps, "grad_clip": float(params["dp_grad_clip"]),
                    "colluders": int(params["dp_colluders"]), "iterations": len(history),
                    "step": float(params["dp_step"]), "bits_per_value": VALUE_BITS + 1,
                    "split": f"equal noise multipliers over {len(sums)} releases (the rows, "
                             f"{len(sums) - 1} gradient sums): μ_i = c·Δ2_i², c the least meeting (ε, δ)",
                    "noise_variance": {"rows": mus[0], "gradient": mus[1]},
                    "accounting": f"RDP (dp-accounting), {len(sums)} releases",
                    "not_released": "class counts, log-loss, federated evaluation"},
    }
    if member.held is not None and len(member.held[1]):
        proba = linear.predict_proba(coef, intercept, member.held[0])
        auc = evalcounts.local_auc(member.held[1], proba) if member.groups == 1 else None
        out["held_out_here"] = {"rows": int(len(member.held[1])), "auc": auc}
        out["auc"], out["auc_source"] = auc, "this site's held-out part (not released)"
    if member.test is not None:
        test_auc = evalcounts.local_auc(member.test[1], linear.predict_proba(coef, intercept, member.test[0]))
        out["test_csv"] = {"auc": test_auc, "rows": int(len(member.test[1]))}
        out["auc"], out["auc_source"] = test_auc, "[data] test_csv"
    out["_model"] = {"coef": coef, "intercept": intercept, "features": features, "classes": names}
    return out

