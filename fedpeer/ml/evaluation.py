"""Federated evaluation without sharing predictions (docs/algorithms.md): additive counts —
pure functions on arrays.

Federated evaluation (§3): `score_histograms`, `auc_from_histograms`, `logloss_sums`,
`accuracy_counts` return non-negative integer counts (or a float sum with an integer count), so
sites can secure-sum them: counts with `fixedpoint.encode_counts`, the log-loss sum with
`FixedPoint.encode` (its per-row loss is at most -log(LOGLOSS_EPS) ≈ 34.5). `site_counts` packs
them for one secure sum and `metrics` reads the federation's figures from the summed packs (the
xgboost, logreg and mlp jobs all evaluate this way). `check_counts` and `check_errors` say whether
summed packs can come from honest sites (ValueError naming the check): every histogram holds each
row once, the correct predictions are those the histograms allow around 0.5, and the log-loss
lies within what each bin's scores give; a regression's errors satisfy Cauchy–Schwarz.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedpeer.ml.moments import exact_sum

__all__ = ["LOGLOSS_EPS", "accuracy_counts", "auc_from_histograms", "check_counts", "check_errors", "check_loss",
           "local_auc",
           "logloss_sums", "metrics", "score_histograms", "site_counts"]

LOGLOSS_EPS = 1e-15           # probabilities are clipped to [eps, 1 - eps] before the log
LOSS_RTOL = 1e-9              # relative slack of the log-loss bracket (float and fixed-point rounding)
LOSS_ATOL_PER_ROW = 1e-6      # its absolute slack per row


def _proba(y: Any, proba: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """(labels int64 (rows,), proba float64 (rows,) or (rows, K), K) with checks."""
    p = np.asarray(proba, dtype=np.float64)
    if p.ndim == 1:
        groups = 1
    elif p.ndim == 2 and p.shape[1] >= 2:
        groups = p.shape[1]
    else:
        raise ValueError(f"proba must be (rows,) for binary or (rows, K>=2), got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError("probabilities must be finite and in [0, 1]")
    y_arr = np.asarray(y)
    if y_arr.shape != (p.shape[0],) or y_arr.dtype.kind not in "biu":
        raise ValueError(f"y must be integer labels of shape ({p.shape[0]},), got {y_arr.dtype} {y_arr.shape}")
    labels = y_arr.astype(np.int64)
    top = 1 if groups == 1 else groups - 1
    if len(labels) and (labels.min() < 0 or labels.max() > top):
        raise ValueError(f"labels must be in [0, {top}]")
    return labels, p, groups


def _bins(p: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum(np.floor(p * bins).astype(np.int64), bins - 1)


def score_histograms(y: Any, proba: Any, bins: int = 1000) -> np.ndarray:
    """Counts of predicted scores per bin, negatives and positives apart — additive over sites.

    Binary (proba (rows,) = P(positive)): int64 (2, bins); row 0 counts negatives, row 1
    positives; bin b holds scores in [b/bins, (b+1)/bins) (1.0 in the last bin).
    Multi-class (proba (rows, K)): one-vs-rest, int64 (K, 2, bins): entry k is the binary
    histogram of P(class k) with class k as the positive. Secure-sum with
    `encode_counts(h.ravel(), n_parties, count_max=rows)`."""
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= 1 << 24:
        raise ValueError(f"bins must be an integer in [1, 2^24], got {bins!r}")
    labels, p, groups = _proba(y, proba)
    if groups == 1:
        return _binary_histogram(labels, p, bins)
    return np.stack([_binary_histogram((labels == k).astype(np.int64), p[:, k], bins) for k in range(groups)])


def _binary_histogram(labels: np.ndarray, p: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(labels * bins + _bins(p, bins), minlength=2 * bins).reshape(2, bins).astype(np.int64)


def auc_from_histograms(hist: Any) -> Any:
    """AUC from (summed) score histograms: exact up to ties inside a bin, which count 1/2 (as
    ties do in the AUC). (2, bins) -> float; (K, 2, bins) -> float64 (K,) one-vs-rest AUCs (their
    mean is scikit-learn's macro "ovr" AUC). NaN where a class has no positives or no negatives.
    Integer arithmetic throughout, one correctly rounded division at the end."""
    h = np.asarray(hist)
    if h.dtype.kind not in "iu" or h.ndim not in (2, 3) or h.shape[-2] != 2 or h.shape[-1] < 1:
        raise ValueError(f"hist must be integer counts of shape (2, bins) or (K, 2, bins), got {h.dtype} {h.shape}")
    if (h < 0).any():
        raise ValueError("hist holds negative counts")
    if h.ndim == 3:
        return np.array([_auc(h[k]) for k in range(h.shape[0])])
    return _auc(h)


def _auc(h: np.ndarray) -> float:
    neg, pos = [int(v) for v in h[0]], [int(v) for v in h[1]]
    n_neg, n_pos = sum(neg), sum(pos)
    if n_neg == 0 or n_pos == 0:
        return math.nan
    below, twice = 0, 0
    for n_b, p_b in zip(neg, pos):
        twice += p_b * (2 * below + n_b)        # pairs with the negative lower: 1, in the same bin: 1/2
        below += n_b
    return twice / (2 * n_pos * n_neg)


def local_auc(y: Any, proba: Any) -> float | None:
    """The AUC of a site's own rows (its [data] test_csv): binary, or the macro one-vs-rest mean of
    the classes that occur in y with rows of another class beside them (scikit-learn's
    `roc_auc_score(multi_class="ovr")` where every class occurs). None when y holds one class.
    Exact: pairs ordered right plus half the tied pairs, from average ranks (one sort per class;
    scikit-learn's checks and its curve cost ~5x more at 6,000 rows, on the event loop of every
    iteration that records a test AUC)."""
    labels, p, groups = _proba(y, proba)
    if groups == 1:
        return _rank_auc(labels == 1, p)
    aucs = [_rank_auc(labels == k, p[:, k]) for k in range(groups)]
    kept = [a for a in aucs if a is not None]
    return float(np.mean(kept)) if len(kept) >= 1 and len(np.unique(labels)) >= 2 else None


def _rank_auc(positive: np.ndarray, score: np.ndarray) -> float | None:
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(score)       # any order within a tie: ties count as one group below (3.5x a stable sort)
    s = score[order]
    starts = np.concatenate(([0], np.flatnonzero(s[1:] != s[:-1]) + 1))
    ends = np.append(starts[1:], len(s))
    ranks = (starts + ends + 1) / 2.0                       # 1-based average rank of each tie group
    pos_in_group = np.add.reduceat(positive[order].astype(np.int64), starts)
    twice_u = int(np.dot(pos_in_group, (2 * ranks).astype(np.int64))) - n_pos * (n_pos + 1)
    return twice_u / (2 * n_pos * n_neg)


def logloss_sums(y: Any, proba: Any, eps: float = LOGLOSS_EPS) -> tuple[float, int]:
    """(Σ -log p(true class), rows) — additive; mean log-loss = Σ sums / Σ rows. Probabilities
    are clipped to [eps, 1 - eps] first."""
    labels, p, groups = _proba(y, proba)
    if groups == 1:
        p_true = np.where(labels == 1, p, 1.0 - p)
    else:
        p_true = p[np.arange(len(labels)), labels]
    return float(-np.log(np.clip(p_true, eps, 1.0 - eps)).sum()), len(labels)


def accuracy_counts(y: Any, proba: Any) -> tuple[int, int]:
    """(correct, rows) — additive. Binary predicts positive iff P > 0.5 (XGBClassifier's rule);
    multi-class predicts the argmax (the lowest class on a tie)."""
    labels, p, groups = _proba(y, proba)
    predicted = (p > 0.5).astype(np.int64) if groups == 1 else np.argmax(p, axis=1)
    return int((predicted == labels).sum()), len(labels)


def site_counts(y: Any, proba: Any, bins: int) -> tuple[np.ndarray, float]:
    """One site's additive evaluation of a classifier: (int64 counts = the score histograms
    raveled ++ [correct, rows], the log-loss sum)."""
    hist = score_histograms(y, proba, bins)
    correct, rows = accuracy_counts(y, proba)
    loss, _ = logloss_sums(y, proba)
    return np.concatenate([hist.ravel(), [correct, rows]]).astype(np.int64), loss


def coarsen(counts: Any, groups: int, bins: int, to_bins: int) -> np.ndarray | None:
    """Summed `site_counts` at `bins` as they would be at `to_bins` (a divisor of bins): bin b of
    `bins` lies inside bin b // (bins / to_bins) of `to_bins`. None when to_bins does not divide bins."""
    if to_bins <= 0 or bins % to_bins:
        return None
    counts = np.asarray(counts)
    hist = counts[:-2].reshape(max(groups, 1) * 2, to_bins, bins // to_bins).sum(axis=2)
    return np.concatenate([hist.ravel(), counts[-2:]]).astype(counts.dtype)


def metrics(counts: Any, loss: float, groups: int, bins: int) -> dict:
    """The federation's AUC (exact up to ties inside a bin; macro one-vs-rest over the classes
    with both labels present for multi-class), log-loss and accuracy from summed `site_counts`
    (`counts`) and log-loss sums (`loss`): {"auc", "logloss", "accuracy", "rows"}."""
    counts = np.asarray(counts)
    hist = counts[:-2].reshape((2, bins) if groups == 1 else (groups, 2, bins))
    correct, rows = int(counts[-2]), int(counts[-1])
    auc = auc_from_histograms(hist)
    if groups > 1:
        finite = auc[np.isfinite(auc)]
        auc = float(finite.mean()) if len(finite) else math.nan
    return {"auc": None if math.isnan(auc) else round(float(auc), 6), "logloss": round(loss / rows, 6),
            "accuracy": round(correct / rows, 6), "rows": rows}


def check_counts(counts: Any, loss: float, groups: int, bins: int) -> None:
    """ValueError unless summed `site_counts` (`counts`) and log-loss sums (`loss`) can be honest:
    non-negative counts; every class's one-vs-rest histogram holding every row once (multi-class:
    each row the positive of exactly one class); binary, the correct predictions between what the
    histogram allows (bin floor(bins/2) holds 0.5); the log-loss within the sum over bins of each
    row's least and most loss in its bin (clipped as `logloss_sums` clips)."""
    counts = np.asarray(counts)
    hist = counts[:-2].reshape((1, 2, bins) if groups == 1 else (groups, 2, bins))
    correct, rows = int(counts[-2]), int(counts[-1])
    # each count bounded by the rows first, every sum in Python integers: poisoned entries near
    # 2^63 cannot wrap a histogram's sum back to the rows
    if (counts < 0).any() or (counts > rows).any() or (exact_sum(hist, axis=(1, 2)) != rows).any():
        raise ValueError("every evaluation histogram holds each row once")
    positives = hist[:, 1, :]
    if groups > 1 and exact_sum(positives) != rows:
        raise ValueError("every row is the positive of one class")
    if groups == 1:
        half = bins // 2
        neg, pos = hist[0, 0], hist[0, 1]
        least = exact_sum(neg[:half]) + exact_sum(pos[half + 1:])
        most = exact_sum(neg[:half + 1]) + exact_sum(pos[half:])
        if not least <= correct <= most:
            raise ValueError("the correct predictions are those the score histogram allows")
    edges = np.arange(bins + 1) / bins
    low_p, high_p = np.clip(edges[:-1], LOGLOSS_EPS, 1 - LOGLOSS_EPS), np.clip(edges[1:], LOGLOSS_EPS, 1 - LOGLOSS_EPS)
    least = float((positives * -np.log(high_p)).sum())
    most = float((positives * -np.log(low_p)).sum())
    if groups == 1:                     # the negatives' true class is 1 - p
        least += float((hist[0, 0] * -np.log(1 - low_p)).sum())
        most += float((hist[0, 0] * -np.log(1 - high_p)).sum())
    room = LOSS_RTOL * most + LOSS_ATOL_PER_ROW * (1 + rows)
    if not (np.isfinite(loss) and least - room <= loss <= most + room):
        raise ValueError("the log-loss lies within what the score histogram allows")


def check_loss(rows: int, loss: float, rows_max: int) -> None:
    """ValueError unless a summed log-loss over `rows` rows (a training loss, which no histogram
    brackets) can be honest: 1 <= rows <= rows_max (exact integers) and 0 <= loss <= rows x
    -log(LOGLOSS_EPS), the most a row clipped as `logloss_sums` clips can lose."""
    if not 1 <= rows <= rows_max:
        raise ValueError("the training loss rests on at least one and at most the federation's training rows")
    most = rows * -math.log(LOGLOSS_EPS)
    room = LOSS_RTOL * most + LOSS_ATOL_PER_ROW * (1 + rows)
    if not (math.isfinite(loss) and -room <= loss <= most + room):
        raise ValueError("the training log-loss lies between 0 and -log(1e-15) per row")


def check_errors(rows: int, squared: float, absolute: float) -> None:
    """ValueError unless a regression's summed [rows] and [Σ e², Σ |e|] can be honest: rows >= 0,
    both sums >= 0, (Σ |e|)² <= rows Σ e² (Cauchy–Schwarz)."""
    room = LOSS_ATOL_PER_ROW * (1 + abs(rows))
    if rows < 0 or not (np.isfinite(squared) and np.isfinite(absolute)) or squared < -room or absolute < -room \
            or absolute * absolute > rows * (squared * (1 + LOSS_RTOL) + room):
        raise ValueError("the errors' sums are non-negative and (Σ|e|)² is at most rows × Σe²")
