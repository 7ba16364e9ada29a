"""Every check of a poisonable total of counts sums in exact integers and bounds each entry
(issue 38, finding 2): a member adds offsets near 2^63 or 2^64 to several counts of one row of a
secure sum's total, chosen so that the row's sum modulo 2^64 — what an int64 or uint64 sum gives —
is the honest one. Each check refuses the poisoned total (and passes the honest one).

The kinds these checks serve: bofrf (confusion), stats and vertical stats (histograms), every
evaluation (logreg, FedAvg, bagging and histogram xgboost, tree), kmeans, gmm, dbscan (sizes),
tree's icdta (scores, rule counts) and cart (class-count histograms). Histogram xgboost's cells
(fedpeer/ml/xgb/hist.py `check_plausible`), its label counts and bagging's label counts were bounded
per entry before any sum already; sumcheck compares modulo 2^64 by design (its test vectors wrap)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.ml import evaluation
from fedpeer.ml.cluster import dbscan, kmeans, mixture
from fedpeer.ml.forest import bofrf
from fedpeer.ml.moments import bin_edges, check_spread, local_histograms, whole_counts
from fedpeer.ml.tree import cart, icdta

TWO64 = 1 << 64
LARGE = st.one_of(st.integers(2**63 - 2**20, 2**63 + 2**20),         # near 2^63
                  st.integers(2**62 - 2**20, 2**62 + 2**20))         # four of these make 2^64
NEAR = st.one_of(LARGE, st.integers(2**64 - 2**20, 2**64 - 1))        # or near 2^64: a small negative
SETTINGS = settings(max_examples=60, deadline=None)


def wrapped(total: np.ndarray, where: np.ndarray, offsets: list[int]) -> np.ndarray:
    """`total` (uint64) with offsets added at the flat indices `where`, the last chosen so that
    the offsets sum to 0 modulo 2^64: every wrapping sum over those entries is unchanged."""
    offsets = [o % TWO64 for o in offsets[:len(where) - 1]]
    offsets.append(-sum(offsets) % TWO64)
    out = np.array(total, dtype=np.uint64, copy=True).ravel()
    for i, o in zip(where, offsets):
        out[i] = np.uint64((int(out[i]) + o) % TWO64)
    assert int(out.view(np.int64)[where].sum()) == int(np.asarray(total).ravel().view(np.int64)[where].sum())
    return out.reshape(np.shape(total))


def refused(check, *args) -> None:  # noqa: ANN001
    with pytest.raises(ValueError):
        check(*args)


def poisoned_counts(honest: np.ndarray, where: np.ndarray, offsets: list[int]) -> np.ndarray | None:
    """The decoded counts a check sees (None: `whole_counts` already refuses an entry at 2^63)."""
    total = wrapped(np.asarray(honest, dtype=np.int64).astype(np.uint64), where, offsets)
    try:
        return whole_counts(total)
    except ValueError:
        return None


# the first offset large, so the poisoned entries' exact sum is not the honest one: a real wrap
OFFSETS = st.tuples(LARGE, NEAR, NEAR).map(list)


@SETTINGS
@given(offsets=OFFSETS)
def test_bofrf_confusion(offsets: list[int]) -> None:
    honest = np.array([[40, 30, 5, 5], [35, 35, 6, 4]], dtype=np.int64)
    bofrf.check_confusion(honest, 3, 100)
    counts = poisoned_counts(honest, np.arange(4), [*offsets, 0])
    if counts is not None:
        refused(bofrf.check_confusion, counts.reshape(-1, 4), 3, 100)
    four = poisoned_counts(honest, np.arange(4), [1 << 62] * 3)       # the reported attack exactly
    assert four is not None
    refused(bofrf.check_confusion, four.reshape(-1, 4), 3, 100)


def _stats_site() -> tuple:
    X = np.random.default_rng(1).normal(size=(200, 2))
    n, sums, squares = 200, X.sum(axis=0), (X * X).sum(axis=0)
    mean = sums / n
    edges = bin_edges(mean, X.std(axis=0, ddof=1), 6)
    return n, sums, squares, ((X - mean) ** 2).sum(axis=0), edges, local_histograms(X, edges)


@SETTINGS
@given(offsets=OFFSETS, column=st.integers(0, 1))
def test_stats_histograms(offsets: list[int], column: int) -> None:
    n, sums, squares, centred, edges, hist = _stats_site()
    check_spread(n, sums, squares, centred, edges, hist)
    width = hist.shape[1]
    counts = poisoned_counts(hist, column * width + np.array([2, 3, 4]), offsets)   # middle bins
    if counts is not None:
        refused(check_spread, n, sums, squares, centred, edges, counts.reshape(hist.shape))


@SETTINGS
@given(offsets=OFFSETS, groups=st.sampled_from([1, 3]))
def test_evaluation_histograms(offsets: list[int], groups: int) -> None:
    rng = np.random.default_rng(2)
    bins = 8
    if groups == 1:
        y, pred = rng.integers(0, 2, 100), rng.random(100)
    else:
        y, pred = rng.integers(0, 3, 100), rng.dirichlet(np.ones(3), 100)
    honest, loss = evaluation.site_counts(y, pred, bins)
    evaluation.check_counts(honest, loss, groups, bins)
    counts = poisoned_counts(honest, np.array([1, 2, bins + 1]), offsets)
    if counts is not None:
        refused(evaluation.check_counts, counts, loss, groups, bins)


FUZZY = SimpleNamespace(fuzziness=2.0, z_sums=None, z_squares=None, z_magnitude=None)


@SETTINGS
@given(offsets=OFFSETS)
def test_kmeans_sizes(offsets: list[int]) -> None:
    n, centres = 90, np.zeros((3, 2))
    weights, honest = np.array([20.0, 20.0, 20.0]), np.array([30, 30, 30])
    kmeans.check_block(FUZZY, centres, np.zeros((3, 2)), weights, 1.0, honest, 0, n)
    sizes = poisoned_counts(honest, np.arange(3), offsets)
    if sizes is not None:
        refused(kmeans.check_block, FUZZY, centres, np.zeros((3, 2)), weights, 1.0, sizes, 0, n)


@SETTINGS
@given(offsets=OFFSETS)
def test_gmm_sizes(offsets: list[int]) -> None:
    """The cluster sizes of an E-step round: refused at that check, before any other."""
    n, k, d = 90, 3, 1
    floats = np.zeros(mixture.stat_sizes(k, d, "diag")[0])
    floats[:k] = 30.0
    honest = np.array([30, 30, 30])
    sizes = poisoned_counts(honest, np.arange(3), offsets)
    if sizes is not None:
        with pytest.raises(ValueError, match="cluster sizes add up"):
            mixture.check_block(n, floats, sizes, np.zeros((k, d)), "diag", object())


@SETTINGS
@given(offsets=OFFSETS)
def test_dbscan_sizes(offsets: list[int]) -> None:
    honest = np.array([10, 40, 40])
    dbscan.check_sizes(honest, 90)
    sizes = poisoned_counts(honest, np.arange(3), offsets)
    if sizes is not None:
        refused(dbscan.check_sizes, sizes, 90)


@SETTINGS
@given(offsets=OFFSETS)
def test_icdta_scores_and_rule_counts(offsets: list[int]) -> None:
    n = 50
    trees = np.array([[3, 0, 20, 5, 5, 20], [2, 10, 15, 5, 5, 15]])      # held, own, 2x2 confusion
    honest = np.concatenate([trees.ravel(), [n]]).astype(np.int64)
    icdta.read_scores(honest.astype(np.uint64), 2, 2, 3)
    total = wrapped(honest.astype(np.uint64), np.array([2, 3, 4]), offsets)
    refused(icdta.read_scores, total, 2, 2, 3)
    rules = np.array([30, 0, 0, 20, 30, 20], dtype=np.int64)              # two rules, then the classes
    icdta.read_rule_counts(rules.astype(np.uint64), 2, 2)
    refused(icdta.read_rule_counts, wrapped(rules.astype(np.uint64), np.array([4, 5, 0]), offsets), 2, 2)


@SETTINGS
@given(offsets=OFFSETS)
def test_cart_class_histograms(offsets: list[int]) -> None:
    """A classification tree's class-count channels: the node's rows are their sum."""
    p = SimpleNamespace(regression=False)
    layout = cart.Layout.of([1])                                          # one feature, two bins
    honest = np.array([[[10, 5, 5], [10, 5, 5]]], dtype=np.int64)         # (node, slot, class)
    cart.check_level(honest, layout, p, 40, None)
    hist = wrapped(honest.astype(np.uint64), np.array([0, 1, 2]), offsets).view(np.int64)
    refused(cart.check_level, hist, layout, p, 40, None)
