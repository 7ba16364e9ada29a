"""The stats job's checks on the secure sums (fedpeer/ml/moments.py): what honest sites' sums always satisfy."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.kinds import stats
from fedpeer.ml import moments


def honest(seed: int = 0) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(n, Σx, Σx², Σ(x - mean)², edges, histograms) of 50 rows."""
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=3.0, size=(50, 3))
    mean = X.mean(axis=0)
    edges = stats.bin_edges(mean, X.std(axis=0, ddof=1), 4)
    return 50, X.sum(axis=0), (X * X).sum(axis=0), ((X - mean) ** 2).sum(axis=0), edges, \
        stats.local_histograms(X, edges)


def test_honest_totals_pass() -> None:
    n, s1, s2, centred, edges, counts = honest()
    assert moments.check_moments(np.concatenate([[n, 20.0], s1, s2]), 3) == (50, 20)
    moments.check_spread(n, s1, s2, centred, edges, counts)


@pytest.mark.parametrize("lie, words", [
    (lambda t: t + np.eye(1, len(t), 0).ravel() * 0.5, "row count is a whole number"),
    (lambda t: t + np.eye(1, len(t), 1).ravel() * 40, "positives are a whole number between 0 and the rows"),
    (lambda t: t + np.eye(1, len(t), 2).ravel() * 1e4, "(Σx)² is at most rows × Σx²"),
    (lambda t: t - np.eye(1, len(t), 6).ravel() * 1e4, "(Σx)² is at most rows × Σx²"),
])
def test_impossible_moments_fail_naming_the_check(lie, words) -> None:
    n, s1, s2, *_ = honest(1)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        moments.check_moments(lie(np.concatenate([[n, 20.0], s1, s2])), 3)


@pytest.mark.parametrize("lie, words", [
    (lambda c, h: (c + 1e3, h), "equals Σx² - "),
    (lambda c, h: (-c, h), "equals Σx² - "),
    (lambda c, h: (c, h + np.eye(h.shape[0], h.shape[1], dtype=np.int64)), "holds each row once"),
    (lambda c, h: (c, h - 2 * (h == h.max())), "holds each row once"),
    (lambda c, h: (c, np.column_stack([h[:, :1] + h[:, 1:3].sum(axis=1, keepdims=True), np.zeros_like(h[:, 1:3]),
                                       h[:, 3:]])), "tails hold no more rows"),
])
def test_an_inconsistent_spread_fails_naming_the_check(lie, words) -> None:
    n, s1, s2, centred, edges, counts = honest(2)
    centred, counts = lie(centred, counts)
    with pytest.raises(ValueError, match=words):
        moments.check_spread(n, s1, s2, centred, edges, counts)


def test_histograms_count_as_numpy_does() -> None:
    """local_histograms against np.histogram per column (below, bins, above): rows on the edges,
    NaN (in no count), ±inf, integers, a constant column, edges that rounding collapsed."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        n, d, bins = int(rng.integers(1, 200)), int(rng.integers(1, 5)), int(rng.integers(1, 12))
        X = rng.normal(size=(n, d)) if trial % 4 else rng.integers(-3, 4, size=(n, d))
        if trial % 4 == 1:
            X[rng.random((n, d)) < 0.1] = np.nan
            X[rng.random((n, d)) < 0.05] = np.inf
            X[rng.random((n, d)) < 0.05] = -np.inf
        finite = np.nan_to_num(X.astype(float), nan=0.0, posinf=0.0, neginf=0.0)
        edges = stats.bin_edges(finite.mean(axis=0), finite.std(axis=0) * (trial % 5 != 0), bins)
        if trial % 3 == 0 and X.dtype.kind == "f":
            X[:min(n, bins + 1), 0] = edges[0, :min(n, bins + 1)]
        if trial % 11 == 0:
            edges = np.full_like(edges, 1e20)
        want = np.array([[(X[:, j] < e[0]).sum(), *np.histogram(X[:, j], bins=e)[0], (X[:, j] > e[-1]).sum()]
                         for j, e in enumerate(edges)])
        np.testing.assert_array_equal(stats.local_histograms(X, edges), want)
