"""The mathematics of BOFRF (ALGORITHMS.md §1; thesis seeds/001 ch. 3–5) and of its baseline
BOPPID (thesis §2.3.1.3, Alg. 4), as pure functions on numpy arrays.

Rules of this module: no networking, no clock, no logging, no global random state (every seed is
an argument), no mutation of the caller's arrays. Labels are int 0/1 (1 = positive); internally
the boosting code uses -1/+1 as the thesis does (eq. 3.1).

BOFRF, per tree i of site n (the job moves the arrays, this module does the arithmetic):
- `confusion_per_tree`: c_i^n(q) = (tp, tn, fp, fn) on a site's rows (eq. 3.3–3.4); a tree that
  abstains (NaN probabilities: it splits on a feature the site lacks) counts nothing (§3.1).
- the job secure-sums the matrices: C_i^n = Σ_q c_i^n(q) (eq. 3.5, ALGORITHMS.md §1.3).
- `mcc`: M(C) (eq. 3.6), 0 where the denominator is 0; `tree_weights`: eq. 3.7 / 3.14.
- `ensemble_score`: F(x) = Σ_i α_i (2 p_i(x) − 1) (eq. 3.8–3.10 with the trees' class
  probabilities instead of ±1 votes, so that AUC is defined; sign = prediction).
- `select_final`: eq. 3.11; `choose_tau`: personalized BOFRF (§3.3, eq. 3.14–3.18) on the
  site's validation rows (ALGORITHMS.md; the thesis does not say which rows it tuned on).
- `characteristic_vector`, `farthest_first_clusters`: clustered BOFRF (ch. 5, eq. 5.3–5.6).
- `train_local_forest`: the site's random forest (§3.1, §3.5, §6.3; min_samples_leaf >= 2).

Tie rules (all chosen to agree with scikit-learn, which predicts class 0 on a probability tie):
a tree predicts positive iff p > 0.5; an ensemble predicts positive iff its score > 0.

Boosting (further down): `Stumps` and the per-round functions `boost_*` (AdaBoost, thesis
Alg. 2, with additive per-round statistics, so a federation can run it round by round over secure
sums — `fedboost_reference`); and BOPPID (`boppid_*`, Alg. 4), the thesis' baseline, whose local
AdaBoost uses the same functions on one site's rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CONFUSION_FIELDS", "TAU_GRID", "confusion_per_tree", "mcc", "tree_weights", "ensemble_score",
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


def _as_labels(y: Any, rows: int | None = None) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if rows is not None and y.shape[0] != rows:
        raise ValueError(f"{y.shape[0]} labels for {rows} rows")
    if y.size and not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    return y.astype(np.int8, copy=False)


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

    The thesis picks the argmax without naming the rows (eq. 3.17–3.18); ALGORITHMS.md requires
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


# ---------------------------------------------------------------------------------------------
# BOPPID (thesis §2.3.1.3, Alg. 4) — the baseline the thesis compares BOFRF with (§6.3, ch. 7)
# ---------------------------------------------------------------------------------------------
#
# As implemented, for M sites p = 0..M-1 with n^p training rows each:
#  1. every site trains a local AdaBoost H^p = {(h^{p(t)}, α^{p(t)})}, t <= T, on its own rows
#     (Alg. 4 line 2, eq. 2.10; AdaBoost as Alg. 2 with exact stumps, see above)    `boppid_local`
#  2. every site sends H^p and n^p to every other site (line 4; "shares its local AdaBoost
#     classifier and sample size") — no secure sum is involved: the models travel like BOFRF's
#     forests and n^p is sent in the clear, as in the thesis;
#  3. site p evaluates every H^q on its own rows: ε_p^q = (1/n^p) Σ I(H^q(x) != y) (line 9), its
#     own ε_p = ε_p^p (line 3, training error; H(x) = sign(Σ α h), 0 -> negative)  `boppid_errors`
#  4. S = {p} ∪ {q : |ε_p − ε_p^q| <= τ} (lines 7–13)                                `boppid_select`
#     DEVIATION/reading: line 10 literally reads (ε_p − ε_p^q) <= τ (signed), which admits every
#     model worse than H^p however bad and rejects only much better ones; the text says "if the
#     difference between ε_p and ε_p^q is less than τ … assuming that these two participants
#     have a similar data distribution", i.e. the absolute difference — the default here.
#     rule="signed" gives the literal line. τ is not given in the thesis: BOPPID_TAU = 0.1.
#  5. λ_q = n^q / Σ_{s∈S} n^s, σ_p^p = λ_p / λ_max² · ⌈λ_max² / λ_min⌉, σ_q^p = 1 for q != p
#     (lines 14–23); the ceiling is computed exactly in integers (λ_max²/λ_min = n_max² /
#     (n_min Σ_S n)), so a float rounding cannot push an integer ratio up by one. `boppid_coefficients`
#  6. H_p(x) = Σ_{q∈S} Σ_t σ_q^p λ_q α^{q(t)} h^{q(t)}(x) (Output line): site p's own model, one
#     Stumps with every selected stump's α scaled.                      `boppid_combine`, `boppid_score`
# Every site ends with ITS OWN integrated model (BOPPID is personalized by construction).
# The local AdaBoost runs its rounds on the site's rows only, so nothing is exchanged per round;
# the per-round secure-sum loop (`fedboost_reference` and the boost_* functions) is a different
# algorithm (exact federated AdaBoost) and is provided for that purpose.

BOPPID_TAU = 0.1


def boppid_local(X: np.ndarray, y: np.ndarray, rounds: int, *, seed: int = 0) -> Stumps:
    """H^p: the site's local AdaBoost of `rounds` stumps on its own rows (Alg. 4 line 2).
    Deterministic: the exact stump search involves no randomness; `seed` is accepted for the
    job's uniform signature and not used."""
    del seed
    return adaboost(X, y, rounds)


def _predict(model: Stumps, X: np.ndarray) -> np.ndarray:
    return (stumps_score(model, X) > 0).astype(np.int8)


def boppid_errors(models: Sequence[Stumps], X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ε_p^q for every received model q (own model included) on this site's rows (Alg. 4 lines 3
    and 9): float64 (M,). Stays at the site."""
    X = _finite_matrix(X)
    y = _as_labels(y, X.shape[0])
    if y.size == 0:
        raise ValueError("no rows to evaluate on")
    return np.array([float(np.mean(_predict(m, X) != y)) for m in models], dtype=np.float64)


def boppid_select(errors: np.ndarray, me: int, tau: float = BOPPID_TAU, rule: str = "abs") -> np.ndarray:
    """S as a bool mask (M,): this site `me` always, and q with |ε_p − ε_p^q| <= τ (rule "abs")
    or (ε_p − ε_p^q) <= τ (rule "signed", Alg. 4 line 10 literally). errors = `boppid_errors`."""
    e = np.asarray(errors, dtype=np.float64)
    if not 0 <= me < e.size:
        raise ValueError(f"me must index errors, got {me} for {e.size} models")
    diff = e[me] - e
    if rule == "abs":
        sel = np.abs(diff) <= tau
    elif rule == "signed":
        sel = diff <= tau
    else:
        raise ValueError(f"rule must be 'abs' or 'signed', got {rule!r}")
    sel[me] = True
    return sel


def boppid_coefficients(n_rows: Sequence[int], selected: np.ndarray, me: int) -> np.ndarray:
    """σ_q^p · λ_q for every model q (0 for q not in S) — Alg. 4 lines 14–23."""
    n = np.asarray(n_rows)
    sel = np.asarray(selected, dtype=bool)
    if n.shape != sel.shape or not sel[me]:
        raise ValueError("one row count per model, and this site must be selected")
    counts = [int(v) for v in n]
    if any(c < 1 for c in counts):
        raise ValueError("row counts must be >= 1")
    idx = [q for q in range(len(counts)) if sel[q]]
    total = sum(counts[q] for q in idx)
    n_max = max(counts[q] for q in idx)
    n_min = min(counts[q] for q in idx)
    ceil_ratio = -(-(n_max * n_max) // (n_min * total))       # ⌈λ_max²/λ_min⌉, exact
    lam = np.zeros(len(counts), dtype=np.float64)
    for q in idx:
        lam[q] = counts[q] / total
    lam_max = n_max / total
    coef = lam.copy()                                         # σ_q^p = 1 for q != p
    coef[me] = lam[me] / (lam_max * lam_max) * ceil_ratio * lam[me]
    return coef


def boppid_combine(models: Sequence[Stumps], coefficients: np.ndarray) -> Stumps:
    """H_p = Σ_q coef_q · H^q as one Stumps (models with coefficient 0 are left out)."""
    coef = np.asarray(coefficients, dtype=np.float64)
    if coef.shape != (len(models),):
        raise ValueError("one coefficient per model")
    parts = [m.scaled(c) for m, c in zip(models, coef) if c != 0 and m.size]
    if not parts:
        return Stumps.empty()
    return Stumps(np.concatenate([m.feature for m in parts]), np.concatenate([m.threshold for m in parts]),
                  np.concatenate([m.polarity for m in parts]), np.concatenate([m.alpha for m in parts]))


def boppid_score(model: Stumps, X: np.ndarray) -> np.ndarray:
    """Centred BOPPID score Σ σλα h(x); > 0 = positive prediction."""
    return stumps_score(model, X)


def boppid_reference(sites: Sequence[tuple[np.ndarray, np.ndarray]], rounds: int, seed: int = 0, *,
                     tau: float = BOPPID_TAU, rule: str = "abs") -> list[Stumps]:
    """BOPPID in one process: sites[p] = (X_train, y_train) of site p; returns every site's own
    integrated model H_p (list, index = site), composed from the same pure steps a job runs."""
    locals_ = [boppid_local(X, y, rounds, seed=seed) for X, y in sites]
    n = [int(np.asarray(y).shape[0]) for _, y in sites]
    out = []
    for p, (X, y) in enumerate(sites):
        errors = boppid_errors(locals_, X, y)
        coef = boppid_coefficients(n, boppid_select(errors, p, tau, rule), p)
        out.append(boppid_combine(locals_, coef))
    return out
