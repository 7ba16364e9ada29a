"""Boosted decision stumps (AdaBoost, Gençtürk's BOFRF thesis §2.2.3.1, Alg. 2) as pure functions on numpy
arrays: the weak learner of the BOPPID baseline (boppid.py) and a per-round federated AdaBoost.

Rules of this module: no networking, no clock, no logging, no global random state, no mutation of
the caller's arrays. Labels are int 0/1 (1 = positive); internally the boosting code uses -1/+1 as
the thesis does (eq. 3.1).

`Stumps` and the per-round functions `boost_*` (AdaBoost, thesis Alg. 2, with additive per-round
statistics, so a federation can run it round by round over secure sums — `fedboost_reference`);
`adaboost` is the same loop on one site's rows. The input checks `_as_labels` and `_finite_matrix`
are shared with bofrf.py and boppid.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Stumps", "stumps_score", "exact_cuts", "uniform_cuts", "boost_init_weights", "boost_local_stats",
    "boost_stats_length", "boost_choose", "boost_update_weights", "BoostStep", "adaboost",
    "fedboost_reference",
]

# ---------------------------------------------------------------------------------------------
# Boosted decision stumps: the weak learner shared by BOPPID and the per-round federated AdaBoost
# ---------------------------------------------------------------------------------------------
#
# AdaBoost as in thesis Alg. 2 (§2.2.3.1): weak learners are stumps (one split, two leaves);
# ε_j = Σ w I(miss) / Σ w, α_j = ½ ln((1−ε_j)/ε_j), w_i *= exp(α_j) if missed else exp(−α_j);
# output sign(Σ α_j c_j(x)). For two classes this is SAMME with its α halved — the same
# predictions (all α scale alike). Open details, with the standard choices made here:
# - the stump fitted "using the current weights" (Alg. 2 line 5) is the one with the smallest
#   weighted error over all candidate (feature, threshold, polarity) — the classic discrete
#   AdaBoost weak learner (sklearn's AdaBoost stump minimises weighted Gini instead);
# - candidate thresholds: `exact_cuts` (midpoints between a site's consecutive distinct values:
#   exact search, for a site's local AdaBoost) or agreed federation-wide cuts (`uniform_cuts`
#   from agreed bounds) for the federated version, where every site must score the same
#   candidates;
# - ties between candidates -> lowest feature, then lowest threshold, then polarity +1;
# - ε = 0: α is computed with ε = 1e-10 and boosting stops (every later round would refit the
#   same stump); ε >= 0.5 (no stump better than chance): boosting stops without it;
# - after each update the weights are rescaled so their total stays that of round 0, using only
#   the summed statistics (Z' = (Z−E)e^{−α} + E e^{α}): identical at every site, no extra sum,
#   and the mean weight stays 1 — good for fixed-point secure sums (resolution 2^-32).
# A stump h(x) = s if x[f] > t else −s (s = polarity ∈ {−1, +1}); x[f] <= t goes left, as in
# scikit-learn's trees.

_EPS_FLOOR = 1e-10


@dataclass(frozen=True)
class Stumps:
    """A weighted sum of decision stumps: score(x) = Σ_j alpha[j] · s_j · (+1 if x[feature[j]] >
    threshold[j] else −1) with s_j = polarity[j]. Plain arrays (no pickle needed on the wire)."""

    feature: np.ndarray     # int64 (J,)
    threshold: np.ndarray   # float64 (J,)
    polarity: np.ndarray    # int8 (J,), -1 or +1
    alpha: np.ndarray       # float64 (J,)

    def __post_init__(self) -> None:
        f = np.asarray(self.feature, dtype=np.int64)
        t = np.asarray(self.threshold, dtype=np.float64)
        s = np.asarray(self.polarity, dtype=np.int8)
        a = np.asarray(self.alpha, dtype=np.float64)
        if not (f.ndim == t.ndim == s.ndim == a.ndim == 1 and f.shape == t.shape == s.shape == a.shape):
            raise ValueError("stump arrays must be one-dimensional and of one length")
        if f.size and ((f < 0).any() or not np.isin(s, (-1, 1)).all()
                       or not (np.isfinite(t).all() and np.isfinite(a).all())):
            raise ValueError("invalid stump arrays")
        for name, v in (("feature", f), ("threshold", t), ("polarity", s), ("alpha", a)):
            object.__setattr__(self, name, v)

    @property
    def size(self) -> int:
        return int(self.feature.shape[0])

    @staticmethod
    def empty() -> Stumps:
        return Stumps(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int8), np.zeros(0))

    def scaled(self, factor: float) -> Stumps:
        return Stumps(self.feature, self.threshold, self.polarity, self.alpha * float(factor))

    def votes(self, X: np.ndarray) -> np.ndarray:
        """(J, rows) ±1 vote of each stump (unweighted)."""
        X = np.asarray(X, dtype=np.float64)
        if self.size and (X.ndim != 2 or X.shape[1] <= int(self.feature.max())):
            raise ValueError(f"X of shape {X.shape} lacks a feature the stumps use")
        right = X[:, self.feature].T > self.threshold[:, None]
        return np.where(right, 1.0, -1.0) * self.polarity[:, None].astype(np.float64)


def stumps_score(model: Stumps, X: np.ndarray) -> np.ndarray:
    """Σ α h(x) (centred; score > 0 = positive prediction, 0 = negative)."""
    X = np.asarray(X, dtype=np.float64)
    if model.size == 0:
        return np.zeros(X.shape[0], dtype=np.float64)
    return model.alpha @ model.votes(X)


def exact_cuts(X: np.ndarray) -> list[np.ndarray]:
    """Per column, the midpoints between consecutive distinct values: every distinct split of
    these rows (a constant column has none)."""
    X = _finite_matrix(X)
    cuts = []
    for j in range(X.shape[1]):
        u = np.unique(X[:, j])
        cuts.append(np.unique((u[:-1] + u[1:]) / 2.0) if u.size > 1 else np.zeros(0))
    return cuts


def uniform_cuts(low: np.ndarray, high: np.ndarray, n_cuts: int) -> list[np.ndarray]:
    """Per column, `n_cuts` thresholds evenly inside (low, high) — from federation-wide bounds,
    so every site scores the same candidates (a column with high == low gets none)."""
    lo = np.asarray(low, dtype=np.float64).ravel()
    hi = np.asarray(high, dtype=np.float64).ravel()
    if lo.shape != hi.shape or not (np.isfinite(lo).all() and np.isfinite(hi).all()) or (hi < lo).any():
        raise ValueError("bounds must be finite, of one length, and low <= high")
    if n_cuts < 1:
        raise ValueError("n_cuts must be >= 1")
    frac = np.arange(1, n_cuts + 1, dtype=np.float64) / (n_cuts + 1)
    return [np.unique(a + (b - a) * frac) if b > a else np.zeros(0) for a, b in zip(lo, hi)]


def _as_labels(y: Any, rows: int | None = None) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if rows is not None and y.shape[0] != rows:
        raise ValueError(f"{y.shape[0]} labels for {rows} rows")
    if y.size and not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    return y.astype(np.int8, copy=False)


def _finite_matrix(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be (rows, columns), got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X must be finite")
    return X


def _check_cuts(cuts: Sequence[np.ndarray], d: int | None = None) -> list[np.ndarray]:
    out = [np.asarray(c, dtype=np.float64).ravel() for c in cuts]
    if d is not None and len(out) != d:
        raise ValueError(f"{len(out)} cut lists for {d} columns")
    for c in out:
        if c.size and (not np.isfinite(c).all() or (np.diff(c) <= 0).any()):
            raise ValueError("cuts must be finite and strictly increasing")
    return out


def boost_stats_length(cuts: Sequence[np.ndarray]) -> int:
    """Length of the per-round vector that is summed: Σ_f 2·(len(cuts[f]) + 1)."""
    return int(sum(2 * (len(c) + 1) for c in cuts))


def boost_init_weights(n_rows: int) -> np.ndarray:
    """Round-0 row weights: 1 each (AdaBoost's uniform 1/n, times the federation's row total —
    no site needs that total, and the mean weight 1 suits fixed-point sums)."""
    return np.ones(int(n_rows), dtype=np.float64)


def boost_local_stats(X: np.ndarray, y: np.ndarray, w: np.ndarray, cuts: Sequence[np.ndarray]) -> np.ndarray:
    """One site's additive statistics for a boosting round: for each column f, the total weight
    of positive and of negative rows in each of the len(cuts[f]) + 1 bins the cuts delimit
    (bin b holds x with cuts[b-1] < x <= cuts[b]). Layout: column after column, each block
    [positive bins..., negative bins...]. float64, length `boost_stats_length(cuts)`, >= 0.
    Summed over sites (secure sum) these give every candidate stump's weighted error."""
    X = _finite_matrix(X)
    y = _as_labels(y, X.shape[0])
    w = np.asarray(w, dtype=np.float64)
    if w.shape != y.shape or not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite, non-negative, one per row")
    cuts = _check_cuts(cuts, X.shape[1])
    pos = y == 1
    blocks = []
    for j, c in enumerate(cuts):
        b = np.searchsorted(c, X[:, j], side="left")
        nb = c.size + 1
        blocks.append(np.bincount(b[pos], weights=w[pos], minlength=nb))
        blocks.append(np.bincount(b[~pos], weights=w[~pos], minlength=nb))
    return np.concatenate(blocks) if blocks else np.zeros(0)


@dataclass(frozen=True)
class BoostStep:
    """What every site derives from one round's summed statistics (identically everywhere)."""

    feature: int
    threshold: float
    polarity: int
    error: float        # ε: weighted error / total weight
    alpha: float        # ½ ln((1−ε)/ε); 0 when `stop` and the stump is not kept
    total: float        # Z: total weight this round
    keep: bool          # append this stump to the model
    stop: bool          # no further round


def boost_choose(stats_total: np.ndarray, cuts: Sequence[np.ndarray]) -> BoostStep | None:
    """The stump with the smallest weighted error given the SUMMED statistics, and its α
    (thesis Alg. 2 lines 5–7). Ties -> lowest feature, lowest threshold, polarity +1 before −1.
    None when no column has a cut (nothing to split on)."""
    cuts = _check_cuts(cuts)
    s = np.asarray(stats_total, dtype=np.float64)
    if s.shape != (boost_stats_length(cuts),):
        raise ValueError(f"statistics of length {s.shape} for cuts needing {boost_stats_length(cuts)}")
    best: tuple[float, int, int, int, float] | None = None
    off = 0
    for j, c in enumerate(cuts):
        nb = c.size + 1
        pos, neg = s[off:off + nb], s[off + nb:off + 2 * nb]
        off += 2 * nb
        if c.size == 0:
            continue
        P, N = pos.sum(), neg.sum()
        pl, nl = np.cumsum(pos)[:-1], np.cumsum(neg)[:-1]        # left of cut k: bins 0..k
        err_plus = pl + (N - nl)                                # +1 on the right: misses left positives
        err_minus = nl + (P - pl)                               # −1 on the right
        both = np.stack([err_plus, err_minus], axis=1).ravel()  # order: (k, +1), (k, −1), ...
        i = int(np.argmin(both))
        if best is None or both[i] < best[0]:
            best = (float(both[i]), j, i // 2, 1 if i % 2 == 0 else -1, float(P + N))
    if best is None:
        return None
    err, j, k, pol, total = best
    if total <= 0:
        return BoostStep(j, float(cuts[j][k]), pol, 0.5, 0.0, total, keep=False, stop=True)
    eps = min(max(err / total, 0.0), 1.0)
    if eps >= 0.5:
        return BoostStep(j, float(cuts[j][k]), pol, eps, 0.0, total, keep=False, stop=True)
    e = max(eps, _EPS_FLOOR)
    alpha = 0.5 * math.log((1.0 - e) / e)
    return BoostStep(j, float(cuts[j][k]), pol, eps, alpha, total, keep=True, stop=eps <= 0.0)


def boost_update_weights(X: np.ndarray, y: np.ndarray, w: np.ndarray, step: BoostStep) -> np.ndarray:
    """Alg. 2 lines 8–9 on one site's rows: w_i · exp(α) if the stump misses row i else
    w_i · exp(−α), then · Z/Z' with Z' = (Z − E)e^{−α} + E e^{α} (E = εZ), which keeps the
    federation's total weight at Z using only summed quantities. Returns new weights."""
    X = _finite_matrix(X)
    y = _as_labels(y, X.shape[0])
    w = np.asarray(w, dtype=np.float64)
    if not step.keep:
        return w.copy()
    h = np.where(X[:, step.feature] > step.threshold, 1, -1) * step.polarity
    miss = h != np.where(y == 1, 1, -1)
    a = step.alpha
    e_total = step.error * step.total
    z_new = (step.total - e_total) * math.exp(-a) + e_total * math.exp(a)
    scale = step.total / z_new if z_new > 0 else 1.0
    return w * np.where(miss, math.exp(a), math.exp(-a)) * scale


def _append(model: Stumps, step: BoostStep) -> Stumps:
    return Stumps(np.append(model.feature, step.feature), np.append(model.threshold, step.threshold),
                  np.append(model.polarity, np.int8(step.polarity)), np.append(model.alpha, step.alpha))


def adaboost(X: np.ndarray, y: np.ndarray, rounds: int, cuts: Sequence[np.ndarray] | None = None) -> Stumps:
    """AdaBoost with stumps on one site's rows (thesis Alg. 2), built from the same per-round
    functions as the federated version with a one-site "sum". cuts=None: `exact_cuts(X)`."""
    X = _finite_matrix(X)
    return fedboost_reference([(X, y)], rounds, exact_cuts(X) if cuts is None else cuts)


def fedboost_reference(sites: Sequence[tuple[np.ndarray, np.ndarray]], rounds: int, cuts: Sequence[np.ndarray],
                       sum_fn: Callable[[list[np.ndarray]], np.ndarray] | None = None) -> Stumps:
    """Per-round federated AdaBoost (the loop a job coroutine runs), in one process.

    For r = 1..rounds: every site computes `boost_local_stats` on its rows with its current
    weights -> the vectors are summed (`sum_fn`, default: plain sum in site order; the job uses
    the secure sum, and a test can pass the same fixed-point rounding) -> every site runs
    `boost_choose` on the total (identical result everywhere) -> appends the stump if `keep` ->
    `boost_update_weights` on its own rows -> stops when `stop`.
    With agreed cuts this is exactly AdaBoost on the union of all sites' rows restricted to
    those candidate thresholds (MultBoost-like, thesis §2.3.1.1) — it is NOT BOPPID."""
    if rounds < 0:
        raise ValueError("rounds must be >= 0")
    cuts = _check_cuts(cuts)
    data = [(_finite_matrix(X), _as_labels(y)) for X, y in sites]
    weights = [boost_init_weights(X.shape[0]) for X, _ in data]
    add = sum_fn or (lambda vs: np.sum(np.stack(vs), axis=0))
    model = Stumps.empty()
    for _ in range(int(rounds)):
        total = add([boost_local_stats(X, y, w, cuts) for (X, y), w in zip(data, weights)])
        step = boost_choose(total, cuts)
        if step is None:
            break
        if step.keep:
            model = _append(model, step)
        if step.stop:
            break
        weights = [boost_update_weights(X, y, w, step) for (X, y), w in zip(data, weights)]
    return model
