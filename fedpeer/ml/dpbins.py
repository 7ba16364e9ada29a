"""Bins from public bounds, for the differentially private trees (histogram XGBoost's,
fedpeer/ml/xgb/dpboost.py, and CART's, fedpeer/ml/tree/dpcart.py): cut points evenly between each
feature's public [low, high] ([data] bounds), never the rows' quantiles (exact pooled quantiles
leak), and each value's bin by the float32 test the models apply (bin < k iff x < cut k - 1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

BINS_MAX = 1024            # uniform bins per feature a DP job takes (more only spreads the noise)


def uniform_cuts(bounds: np.ndarray, bins: int) -> np.ndarray:
    """float32 (F, bins - 1): the thresholds of `bins` equal bins over each feature's [lo, hi]
    (`bounds` (F, 2)); ValueError if float32 cannot keep them strictly increasing."""
    bounds = np.asarray(bounds, dtype=np.float64)
    if not 2 <= bins <= BINS_MAX:
        raise ValueError(f"max_bin must be in [2, {BINS_MAX}] with dp_epsilon, got {bins}")
    lo, hi = bounds[:, :1], bounds[:, 1:]
    cuts = (lo + (hi - lo) * np.arange(1, bins)[None, :] / bins).astype(np.float32)
    if bins > 2 and np.any(np.diff(cuts, axis=1) <= 0):
        raise ValueError(f"{bins} bins are too many for a feature's bounds in float32; use fewer (max_bin)")
    return cuts


def bin_rows(X: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """uint8 or uint16 (rows, F): each value's bin, the number of thresholds <= it compared in float32 —
    so `bin < k` iff x < cuts[k - 1], the test xgboost's model applies to a split condition."""
    X32 = np.asarray(X, dtype=np.float32)
    out = np.empty(X32.shape, dtype=np.uint8 if cuts.shape[1] < 255 else np.uint16)
    for f in range(X32.shape[1]):
        out[:, f] = np.searchsorted(cuts[f], X32[:, f], side="right")
    return out


def bounds_matrix(bounds: Mapping[str, tuple[float, float]], features: Sequence[str]) -> np.ndarray:
    """float64 (F, 2) of the features' bounds; KeyError naming the first feature without any."""
    return np.array([bounds[f] for f in features], dtype=np.float64)
