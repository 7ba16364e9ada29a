"""The mathematics of BOFRF (docs/algorithms.md; Gençtürk's BOFRF thesis ch. 3–5), as pure functions on
numpy arrays.

Rules of this module: no networking, no clock, no logging, no global random state (every seed is
an argument), no mutation of the caller's arrays. Labels are int 0/1 (1 = positive).

BOFRF, per tree i of site n (the job moves the arrays, this module does the arithmetic):
- `confusion_per_tree`: c_i^n(q) = (tp, tn, fp, fn) on a site's rows (eq. 3.3–3.4); a tree that
  abstains (NaN probabilities: it splits on a feature the site lacks) counts nothing (§3.1).
- the job secure-sums the matrices: C_i^n = Σ_q c_i^n(q) (eq. 3.5, docs/algorithms.md).
- `mcc`: M(C) (eq. 3.6), 0 where the denominator is 0; `tree_weights`: eq. 3.7 / 3.14.
- `ensemble_score`: F(x) = Σ_i α_i (2 p_i(x) − 1) (eq. 3.8–3.10 with the trees' class
  probabilities instead of ±1 votes, so that AUC is defined; sign = prediction); `vote_share`:
  the same vote as P(positive) in [0, 1] (`fedpeer predict`'s score).
- `select_final`: eq. 3.11; `choose_tau`: personalized BOFRF (§3.3, eq. 3.14–3.18) on the
  site's validation rows (docs/algorithms.md; the thesis does not say which rows it tuned on).
- `characteristic_vector`, `farthest_first_clusters`: clustered BOFRF (ch. 5, eq. 5.3–5.6).
- `train_local_forest`: the site's random forest (§3.1, §3.5, §6.3; min_samples_leaf >= 2).

Tie rules (all chosen to agree with scikit-learn, which predicts class 0 on a probability tie):
a tree predicts positive iff p > 0.5; an ensemble predicts positive iff its score > 0.

Layout: decision stumps and federated AdaBoost (`Stumps`, `boost_*`, `adaboost`,
`fedboost_reference`) are in stumps.py, the BOPPID baseline (`boppid_*`, thesis §2.3.1.3, Alg. 4)
in boppid.py; their public names are importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedpeer.ml.forest.boppid import (
    BOPPID_TAU,
    boppid_coefficients,
    boppid_combine,
    boppid_errors,
    boppid_local,
    boppid_reference,
    boppid_score,
    boppid_select,
)
from fedpeer.ml.moments import exact_sum
from fedpeer.ml.forest.stumps import (
    BoostStep,
    Stumps,
    _as_labels,
    adaboost,
    boost_choose,
    boost_init_weights,
    boost_local_stats,
    boost_stats_length,
    boost_update_weights,
    exact_cuts,
    fedboost_reference,
    stumps_score,
    uniform_cuts,
)

__all__ = [
    "CONFUSION_FIELDS", "TAU_GRID", "confusion_per_tree", "mcc", "tree_weights", "ensemble_score",
    "vote_share",
    "binary_metrics", "local_rf_score", "choose_tau", "characteristic_vector", "farthest_first_clusters",
    "site_metrics", "train_local_forest", "select_final", "MIN_SAMPLES_LEAF",
    "Stumps", "stumps_score", "exact_cuts", "uniform_cuts", "boost_init_weights", "boost_local_stats",
    "boost_stats_length", "boost_choose", "boost_update_weights", "BoostStep", "adaboost",
    "fedboost_reference",
    "boppid_local", "boppid_errors", "boppid_select", "boppid_coefficients", "boppid_combine",
    "boppid_reference", "boppid_score", "BOPPID_TAU",
]

CONFUSION_FIELDS = ("tp", "tn", "fp", "fn")
TAU_GRID = tuple(round(0.05 * i, 2) for i in range(11))        # 0.0, 0.05, ..., 0.5
MIN_SAMPLES_LEAF = 2
"""A leaf holding a single training row lets a curious site single that person out (§6.3)."""

_EXACT_INT_MAX = 1 << 31      # below this, tp*tn - fp*fn is computed exactly in int64


# ---------------------------------------------------------------------------------------------
# BOFRF: confusion matrices, MCC weights, scores, metrics
# ---------------------------------------------------------------------------------------------

def _as_proba(proba: Any) -> np.ndarray:
    p = np.asarray(proba, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"proba must be (trees, rows), got shape {p.shape}")
    return p


def confusion_per_tree(proba: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(T, 4) int64 confusion counts (tp, tn, fp, fn) of every tree on these rows (eq. 3.3–3.4).

    Tree t predicts positive on a row iff proba[t, row] > 0.5 — at exactly 0.5 it predicts the
    negative class, as scikit-learn's DecisionTreeClassifier/RandomForestClassifier.predict do
    (argmax over (P(0), P(1)) takes the first class on a tie). A NaN entry is an abstention and
    counts nothing; a tree that abstains on the whole site (splits on a feature the site lacks)
    therefore gets an all-zero row and leaves the summed matrix unchanged (§3.1)."""
    p = _as_proba(proba)
    y = _as_labels(y, p.shape[1])
    voted = ~np.isnan(p)
    pred_pos = voted & (p > 0.5)
    pred_neg = voted & ~(p > 0.5)
    pos = (y == 1)[None, :]
    neg = ~pos
    out = np.empty((p.shape[0], 4), dtype=np.int64)
    out[:, 0] = (pred_pos & pos).sum(axis=1)
    out[:, 1] = (pred_neg & neg).sum(axis=1)
    out[:, 2] = (pred_pos & neg).sum(axis=1)
    out[:, 3] = (pred_neg & pos).sum(axis=1)
    return out


def check_roster(held: np.ndarray, parties: int) -> None:
    """ValueError unless the summed roster (per member: how many participants hold its forest) can
    be honest: whole counts between 0 and the participants."""
    if (held < 0).any() or (held > parties).any():
        raise ValueError("every forest is held by between 0 and all the participants")


def check_confusion(total: np.ndarray, parties: int, count_max: int) -> None:
    """ValueError unless summed confusion matrices (T, 4) of tp, tn, fp, fn can be honest: whole
    counts, none negative, none and no tree's four together above the participants' declared
    maximum (each count bounded before the sum, the sum in Python integers: entries near 2^62
    cannot wrap a tree's sum back to an honest one)."""
    if (total < 0).any():
        raise ValueError("no summed confusion count is negative")
    most = parties * count_max
    if (total > most).any() or (exact_sum(total, axis=1) > most).any():
        raise ValueError("no tree is scored on more rows than the participants can hold")


def mcc(conf: np.ndarray) -> np.ndarray:
    """Matthews correlation (eq. 3.6) of each row (tp, tn, fp, fn) of `conf`; float64 (T,).

    Where the denominator is 0 (one class only in the rows, or a tree that predicts one class
    everywhere, or an all-abstaining tree) the MCC is set to 0, as §3.1 says: the tree is ignored."""
    c = np.asarray(conf)
    if c.ndim == 1:
        c = c[None, :]
    if c.ndim != 2 or c.shape[1] != 4:
        raise ValueError(f"confusion matrices must be (T, 4), got shape {c.shape}")
    if c.size and (c < 0).any():
        raise ValueError("confusion counts must be non-negative")
    cf = c.astype(np.float64)
    if c.size and np.issubdtype(c.dtype, np.integer) and c.max() < _EXACT_INT_MAX:
        ci = c.astype(np.int64)       # tp*tn - fp*fn exact in int64, rounded once
        num = (ci[:, 0] * ci[:, 1] - ci[:, 2] * ci[:, 3]).astype(np.float64)
    else:
        num = cf[:, 0] * cf[:, 1] - cf[:, 2] * cf[:, 3]
    tp, tn, fp, fn = (cf[:, i] for i in range(4))
    # two square roots instead of one of the 4-fold product: no overflow for any realistic count
    den = np.sqrt((tp + fp) * (tp + fn)) * np.sqrt((tn + fp) * (tn + fn))
    out = np.zeros(c.shape[0], dtype=np.float64)
    ok = den > 0
    out[ok] = num[ok] / den[ok]
    return np.clip(out, -1.0, 1.0)


def tree_weights(mcc_values: np.ndarray, tau: float) -> np.ndarray:
    """α_i = MCC_i if MCC_i > τ else 0 (eq. 3.7; eq. 3.14 for a personalized τ). Strictly
    greater: a tree exactly at τ gets weight 0. NaN counts as 0."""
    m = np.asarray(mcc_values, dtype=np.float64)
    return np.where(np.nan_to_num(m, nan=-np.inf) > float(tau), m, 0.0)


def ensemble_score(proba: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """score(x) = Σ_i α_i (2 p_i(x) − 1) over the trees (rows of `proba`); abstaining (NaN)
    entries contribute 0. Positive score = positive prediction (eq. 3.8–3.10 with probabilities:
    each tree votes in [-1, 1] instead of ±1, which keeps the sign rule and makes AUC defined)."""
    p = _as_proba(proba)
    a = np.asarray(alpha, dtype=np.float64)
    if a.shape != (p.shape[0],):
        raise ValueError(f"{a.shape} weights for {p.shape[0]} trees")
    votes = np.where(np.isnan(p), 0.0, 2.0 * p - 1.0)
    return a @ votes if p.shape[0] else np.zeros(p.shape[1], dtype=np.float64)


def vote_share(proba: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """P(positive) of the weighted vote: Σ |α_i| p'_i(x) / Σ |α_i| over the trees that vote on x
    (not NaN), where p' = p for α ≥ 0 and 1 − p for a tree with a negative weight (it votes
    against its own probability, as in `ensemble_score`). Then ensemble_score = W (2 P − 1) with
    W = Σ |α_i| ≥ 0: P > 0.5 exactly where the score is positive, and P = 0.5 where no tree with a
    weight votes. A BOFRF model keeps only trees with α > 0: P is their α-weighted mean P(positive)."""
    p = _as_proba(proba)
    a = np.asarray(alpha, dtype=np.float64)
    if a.shape != (p.shape[0],):
        raise ValueError(f"{a.shape} weights for {p.shape[0]} trees")
    voted = ~np.isnan(p)
    toward = np.where(a[:, None] >= 0, p, 1.0 - p)
    weight = np.abs(a)[:, None] * voted
    total = weight.sum(axis=0)
    share = (weight * np.where(voted, toward, 0.0)).sum(axis=0)
    return np.divide(share, total, out=np.full(p.shape[1], 0.5), where=total > 0)



def site_metrics(proba: np.ndarray, y: np.ndarray, own: np.ndarray, alpha: np.ndarray) -> tuple[dict, dict, dict]:
    """binary_metrics on one site's rows of its local RF (its own trees, unweighted), its weighted
    forest F_n (its own trees, weights alpha) and the global F (every tree), from `proba` (trees x rows)."""
    return (binary_metrics(y, local_rf_score(proba[own])), binary_metrics(y, ensemble_score(proba[own], alpha[own])),
            binary_metrics(y, ensemble_score(proba, alpha)))

def local_rf_score(proba: np.ndarray) -> np.ndarray:
    """The plain local random forest: mean over its trees of p (what predict_proba returns),
    centred: mean(2p − 1) = 2·predict_proba − 1, so score > 0 iff the forest predicts positive.
    Abstaining trees are left out of the mean; a row where every tree abstains scores 0."""
    p = _as_proba(proba)
    voted = ~np.isnan(p)
    n = voted.sum(axis=0)
    total = np.where(voted, 2.0 * p - 1.0, 0.0).sum(axis=0)
    return np.divide(total, n, out=np.zeros(p.shape[1], dtype=np.float64), where=n > 0)


def _auc(y: np.ndarray, score: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score

    if y.size == 0 or np.unique(y).size < 2:
        return None
    return float(roc_auc_score(y, score))


def binary_metrics(y: np.ndarray, score: np.ndarray) -> dict:
    """{"auc", "accuracy", "sensitivity", "specificity", "mcc"} of a centred score on labeled rows.

    prediction = score > 0 (a 0 score predicts negative, like scikit-learn's ties). AUC is
    sklearn's roc_auc_score on the raw score; it is None when the rows hold only one class (and
    sensitivity/specificity are None when there is no positive/negative row). Plain floats, so
    the dict is JSON-ready."""
    s = np.asarray(score, dtype=np.float64)
    y = _as_labels(y, s.shape[0] if s.ndim == 1 else None)
    if s.shape != y.shape:
        raise ValueError(f"{s.shape} scores for {y.shape} labels")
    pred = s > 0
    pos = y == 1
    tp = int((pred & pos).sum())
    tn = int((~pred & ~pos).sum())
    fp = int((pred & ~pos).sum())
    fn = int((~pred & pos).sum())
    n = y.size
    return {
        "auc": _auc(y, s),
        "accuracy": (tp + tn) / n if n else None,
        "sensitivity": tp / (tp + fn) if tp + fn else None,
        "specificity": tn / (tn + fp) if tn + fp else None,
        "mcc": float(mcc(np.array([[tp, tn, fp, fn]], dtype=np.int64))[0]),
    }


def choose_tau(proba_val: np.ndarray, y_val: np.ndarray, mcc_values: np.ndarray,
               grid: Sequence[float] = TAU_GRID) -> float:
    """Personalized BOFRF (§3.3, eq. 3.14–3.18): the τ of `grid` whose ensemble F(τ) has the best
    AUC on the site's own VALIDATION rows (`proba_val`: every tree's P(positive) on them).
    Ties go to the smaller τ (fewer trees cut). If the validation rows hold one class only, no
    AUC exists and every τ ties: the smallest τ is returned.

    The thesis picks the argmax without naming the rows (eq. 3.17–3.18); docs/algorithms.md requires
    validation rows so that the test part the site reports on stays unseen. Pass the site's own
    trees (proba_val[own], mcc_values[own]) to tune its local F_n(τ) separately, as eq. 3.17 does."""
    p = _as_proba(proba_val)
    y = _as_labels(y_val, p.shape[1])
    m = np.asarray(mcc_values, dtype=np.float64)
    taus = sorted(float(t) for t in grid)
    if not taus:
        raise ValueError("empty tau grid")
    best_tau, best_auc = taus[0], None
    for tau in taus:
        auc = _auc(y, ensemble_score(p, tree_weights(m, tau)))
        # AUCs equal in exact arithmetic can come back 1 ulp apart from roc_auc_score: only a
        # real improvement moves to a larger tau, so ties go to the smaller one as documented
        if auc is not None and (best_auc is None or auc > best_auc + AUC_TIE_TOLERANCE):
            best_tau, best_auc = tau, auc
    return best_tau


AUC_TIE_TOLERANCE = 1e-12


def select_final(auc_global: float | None, auc_local: float | None) -> str:
    """Eq. 3.11: "global" if AUC(F) > AUC(F_n) else "local". When either AUC is undefined (a
    one-class test part) the comparison cannot favour F, so the site keeps its own F_n."""
    if auc_global is None or auc_local is None:
        return "local"
    if isinstance(auc_global, float) and math.isnan(auc_global):
        return "local"
    return "global" if auc_global > auc_local else "local"


# ---------------------------------------------------------------------------------------------
# Clustered BOFRF (ch. 5)
# ---------------------------------------------------------------------------------------------

def characteristic_vector(X: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """V_n (eq. 5.3–5.4): per column the mean of the min–max-normalised values, each clipped to
    [0, 1], with FEDERATION-WIDE bounds `low`/`high` (one per column) so that every site's vector
    is on the same scale (site-local bounds would map every site onto [0, 1] and erase exactly
    the shifts the clustering is looking for). Clipping keeps rows outside declared or estimated
    bounds (e.g. mean ± 3 sd) from dragging a mean beyond [0, 1].

    A one-hot (0/1) column with bounds 0 and 1 gives the category share, the categorical case of
    eq. 5.4. A column with high == low carries no information about any site (its normalised
    value is undefined, 0/0): it contributes the constant 0.5, the centre of the range, at every
    site — identical at all sites, so it adds nothing to any distance, and it stays finite."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be (rows >= 1, columns), got shape {X.shape}")
    lo = np.broadcast_to(np.asarray(low, dtype=np.float64), (X.shape[1],))
    hi = np.broadcast_to(np.asarray(high, dtype=np.float64), (X.shape[1],))
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("bounds must be finite")
    if (hi < lo).any():
        raise ValueError("high must be >= low in every column")
    if not np.isfinite(X).all():
        raise ValueError("X must be finite")
    span = hi - lo
    flat = span == 0
    z = (X - lo) / np.where(flat, 1.0, span)
    v = np.clip(z, 0.0, 1.0).mean(axis=0)
    v[flat] = 0.5
    return v


def _distances(vectors: np.ndarray, point: np.ndarray, metric: str) -> np.ndarray:
    diff = vectors - point
    if metric == "euclidean":
        return np.sqrt((diff * diff).sum(axis=1))       # eq. 5.5
    if metric == "manhattan":
        return np.abs(diff).sum(axis=1)                 # eq. 5.6
    raise ValueError(f"metric must be 'euclidean' or 'manhattan', got {metric!r}")


def farthest_first_clusters(vectors: np.ndarray, k: int, metric: str = "euclidean", first: int = 0) -> np.ndarray:
    """Clustered BOFRF's grouping of sites (ch. 5 steps 2–7, Alg. 9): `first` is the first
    centroid; then, until there are k centroids, the point farthest from its nearest centroid
    (ties -> lowest index; current centroids are never re-picked) becomes the next centroid.
    Finally every point joins its nearest centroid (ties -> the earliest-picked centroid); a
    centroid always forms its own cluster even if it duplicates an earlier centroid's vector.

    Returns int64 labels (N,): label j = the j-th centroid picked (label[first] == 0).
    Deterministic. k >= N puts every point alone. The thesis picks the first centroid at random
    (the caller's `first` plays that role) and calls this K-means++ — it is in fact farthest-first
    traversal (Gonzalez), with no sampling; Alg. 9 line 16 says argmin where the text says
    farthest: the text is followed."""
    V = np.asarray(vectors, dtype=np.float64)
    if V.ndim != 2 or V.shape[0] == 0:
        raise ValueError(f"vectors must be (N >= 1, d), got shape {V.shape}")
    if not np.isfinite(V).all():
        raise ValueError("vectors must be finite")
    n = V.shape[0]
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not 0 <= first < n:
        raise ValueError(f"first must be in [0, {n}), got {first}")
    k = min(int(k), n)
    centroids = [int(first)]
    nearest = _distances(V, V[first], metric)           # distance to the nearest centroid so far
    is_centroid = np.zeros(n, dtype=bool)
    is_centroid[first] = True
    while len(centroids) < k:
        cand = np.where(is_centroid, -np.inf, nearest)
        nxt = int(np.argmax(cand))                      # first maximum = lowest index
        centroids.append(nxt)
        is_centroid[nxt] = True
        nearest = np.minimum(nearest, _distances(V, V[nxt], metric))
    dist = np.stack([_distances(V, V[c], metric) for c in centroids], axis=1)    # (N, k)
    labels = np.argmin(dist, axis=1).astype(np.int64)    # first minimum = earliest centroid
    labels[np.asarray(centroids)] = np.arange(len(centroids))
    return labels


# ---------------------------------------------------------------------------------------------
# The site's random forest
# ---------------------------------------------------------------------------------------------

def train_local_forest(X: np.ndarray, y: np.ndarray, *, n_estimators: int = 100, max_depth: int | None = None,
                       min_samples_leaf: int = MIN_SAMPLES_LEAF, max_features: Any = "sqrt", seed: int,
                       grid: Mapping[str, Sequence[Any]] | None = None, cv_folds: int = 3,
                       n_jobs: int = 1) -> Any:
    """The site's random forest R_n (eq. 3.2; Alg. 6), a fitted sklearn RandomForestClassifier.

    min_samples_leaf is raised to >= 2 always, including every value of a search grid (§6.3:
    a one-row leaf singles a person out, and gives trees 0/1 probabilities only).
    With `grid` (param -> candidate values, e.g. {"max_depth": [None, 8], "min_samples_leaf":
    [2, 5]}; §3.5, §6.3), a grid search with stratified `cv_folds`-fold CV on these (training)
    rows picks the combination with the best mean AUC (ties -> the first in grid order) and
    refits it on all rows. The folds are reduced to the size of the smaller class; with fewer
    than 2 rows of either class the search is skipped. Deterministic given `seed` (the CV
    shuffle and every forest use it)."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    X = np.asarray(X, dtype=np.float64)
    y = _as_labels(y, X.shape[0] if X.ndim == 2 else None)
    base = RandomForestClassifier(n_estimators=n_estimators, max_depth=max_depth,
                                  min_samples_leaf=_leaf(min_samples_leaf, X.shape[0]), max_features=max_features,
                                  random_state=int(seed), n_jobs=n_jobs)
    if not grid:
        return base.fit(X, y)
    param_grid = {str(k): list(v) for k, v in grid.items()}
    if "min_samples_leaf" in param_grid:
        param_grid["min_samples_leaf"] = list(dict.fromkeys(_leaf(v, X.shape[0])
                                                            for v in param_grid["min_samples_leaf"]))
    smaller = int(min((y == 0).sum(), (y == 1).sum()))
    folds = min(int(cv_folds), smaller)
    if folds < 2:
        return base.fit(X, y)
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=int(seed))
    search = GridSearchCV(base, param_grid, scoring="roc_auc", cv=cv, refit=True, n_jobs=1, error_score="raise")
    search.fit(X, y)
    return search.best_estimator_


def _leaf(value: Any, n_rows: int) -> int:
    """min_samples_leaf raised to the privacy floor. A float (sklearn's "fraction of the rows"
    form) is turned into its row count on these rows first, so it can never mean fewer than 2."""
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        if not 0.0 < float(value) < 1.0:
            raise ValueError(f"min_samples_leaf as a fraction must be in (0, 1), got {value}")
        value = math.ceil(float(value) * n_rows)
    return max(int(value), MIN_SAMPLES_LEAF)
