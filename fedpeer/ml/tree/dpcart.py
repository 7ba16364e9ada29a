"""One CART tree with differential privacy, the arithmetic: pure functions every member runs on the
same noised totals (fedpeer/kinds/tree/dp.py moves the vectors through the noised secure sums;
docs/algorithms.md, "One tree with differential privacy").

- Cut points: uniform from public bounds (fedpeer/ml/dpbins.py `uniform_cuts`, `bin_rows`:
  the same float32 test, bin < k iff x < cut k - 1), never the rows' quantiles.
- Releases: per level of the tree (max_depth of them), the class counts of every frontier node per
  (feature, bin, class) — one row adds 1 to one bin of each of the F features, for its one class, at
  its one node: L1 sensitivity F, L2 √F (`plan`). Nothing else is released: the leaves' class
  distributions are the noised counts of the last level's split sides, or of the node's own noised
  histograms; the training rows are never counted on their own.
- Node counts: per node, each feature's histogram summed over its bins is one noised estimate of
  the node's class counts (variance B·v per class, v the noise's variance in one cell, B bins); the
  F of them are averaged (variance B·v/F), and below the root combined by inverse variance with the
  side of the parent's split that made the node (an independent estimate from the level above).
- The split rule, on the noised counts only: per node, feature and cut k, the left side's counts
  L = Σ of bins < k, the right side's R = that feature's total less L; counts are floored at 0 for
  the impurity. Weighted impurity n·I(c/n) with I the job's criterion; for gini n - Σc²/n with Σc²
  less its noise's expectation (K·v per bin summed: E[(c + e)²] = c² + Var e), for entropy as it is.
  A candidate counts only when both sides' noised rows reach max(min_leaf_rows, SIZE_SIGMAS · the
  standard deviation of that side's noised row count) — no side is noise alone. The best candidate
  (the largest impurity decrease over the node's own, computed from the same feature's totals;
  lowest feature, then cut, on a tie) splits when its decrease exceeds DECREASE_MIN rows' worth and
  the node is above max_depth.
- The tree: scikit-learn's arrays (fedpeer/ml/tree/model.py `Cart`), a split's threshold the largest
  float32 below its cut (left iff x <= threshold, as the model file's convention), a node's value its
  noised class shares (counts floored at 0; uniform when none is left), n_node_samples its noised
  rows rounded (at least 1), impurity the criterion's of the floored counts; ccp_alpha prunes it
  as the exact tree is pruned (post-processing: no privacy cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedpeer.ml.tree.cart import CartParams, Layout, impurity, level_histograms
from fedpeer.ml.tree.model import UNDEFINED, BinValues, Cart, in_preorder
from fedpeer.protocols import dp

SIZE_SIGMAS = 2.0          # a side's noised rows must exceed this many standard deviations of their noise
DECREASE_MIN = 1e-6        # a split must lower the weighted impurity by more than this (rows' worth)


def plan(n_features: int, max_depth: int, n_bins: int, n_classes: int) -> list[dp.DpSum]:
    """Every release of a job (module docstring): one per level, of its largest size."""
    return [dp.DpSum(f"d{d}", float(n_features), math.sqrt(n_features), (2 ** d) * n_features * n_bins * n_classes)
            for d in range(max_depth)]


def level_counts(bins: np.ndarray, labels: np.ndarray, positions: np.ndarray, frontier: np.ndarray, n_bins: int,
                 n_classes: int) -> np.ndarray:
    """int64 (nodes, F, bins, K): this member's rows of each class at each frontier node, per
    feature and bin (the exact mode's pass, cart.level_histograms, on the uniform bins)."""
    F = bins.shape[1]
    layout = Layout.of(np.full(F, n_bins - 1))
    hist = level_histograms(bins, labels, positions, frontier, layout, CartParams(n_classes=n_classes))
    return hist.reshape(len(frontier), F, n_bins, n_classes)


@dataclass
class DpCart:
    """One tree being grown, identical at every member: nodes breadth-first (the k-th split node's
    children appended in frontier order)."""

    left: list[int] = field(default_factory=lambda: [-1])
    feature: list[int] = field(default_factory=lambda: [0])
    cut: list[int] = field(default_factory=lambda: [0])
    counts: list[np.ndarray] = field(default_factory=lambda: [np.zeros(0)])   # noised class counts
    var: list[float] = field(default_factory=lambda: [math.inf])              # their noise's variance (public)
    depth: list[int] = field(default_factory=lambda: [0])
    frontier: list[int] = field(default_factory=lambda: [0])


def weighted_impurity(counts: np.ndarray, var: np.ndarray | float, criterion: str) -> np.ndarray:
    """n·I of noised class counts (..., K), floored at 0 (module docstring); `var` the noise's
    variance in each count (gini takes its expectation out of Σc²)."""
    c = np.maximum(counts, 0.0)
    n = c.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if criterion == "gini":
            sq = np.maximum((c * c).sum(axis=-1) - c.shape[-1] * np.asarray(var), 0.0)
            out = n - sq / n
        else:
            p = c / n[..., None]
            out = -n * np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
    return np.where(n > 0, np.maximum(out, 0.0), 0.0)


def decide(tree: DpCart, C: np.ndarray, var_cell: float, criterion: str, min_leaf_rows: int, last: bool) -> None:
    """Split every frontier node of `tree` from its noised counts C (float64 (nodes, F, B, K)) by
    the split rule (module docstring), appending the children; `last`: the children are at
    max_depth and become leaves with their side's counts. `var_cell`: the noise's variance in one
    cell of C (public)."""
    nodes, nf, n_bins, k = C.shape
    T = C.sum(axis=2)                                            # (nodes, F, K): each feature's totals
    mean, var_mean = T.mean(axis=1), var_cell * n_bins / nf
    L = np.cumsum(C, axis=2)[:, :, :-1, :]
    R = T[:, :, None, :] - L
    cuts = np.arange(1, n_bins, dtype=np.float64)
    floor_l = np.maximum(min_leaf_rows, SIZE_SIGMAS * np.sqrt(var_cell * k * cuts))
    floor_r = np.maximum(min_leaf_rows, SIZE_SIGMAS * np.sqrt(var_cell * k * (n_bins - cuts)))
    ok = (L.sum(axis=-1) >= floor_l) & (R.sum(axis=-1) >= floor_r)
    var_l, var_r = var_cell * cuts, var_cell * (n_bins - cuts)
    decrease = (weighted_impurity(T, var_cell * n_bins, criterion)[:, :, None]
                - weighted_impurity(L, var_l, criterion) - weighted_impurity(R, var_r, criterion))
    decrease = np.where(ok, decrease, -np.inf).reshape(nodes, -1)
    best = np.argmax(decrease, axis=1)                           # the first maximum: lowest feature, cut
    split = decrease[np.arange(nodes), best] > DECREASE_MIN
    fi, kk = best // (n_bins - 1), best % (n_bins - 1) + 1
    new_frontier = []
    for i, node in enumerate(tree.frontier):
        before, v = tree.counts[node], tree.var[node]
        if math.isfinite(v) and before.size:                    # the parent's side, an independent estimate
            both = v + var_mean
            w = v / both if both > 0 else 0.5
            tree.counts[node], tree.var[node] = w * mean[i] + (1 - w) * before, v * var_mean / both if both > 0 else 0.0
        else:
            tree.counts[node], tree.var[node] = mean[i].astype(np.float64), var_mean
        if not split[i]:
            continue
        f, c = int(fi[i]), int(kk[i])
        first = len(tree.left)
        tree.left[node], tree.feature[node], tree.cut[node] = first, f, c
        for side, side_var in ((L[i, f, c - 1], var_cell * c), (R[i, f, c - 1], var_cell * (n_bins - c))):
            tree.left.append(-1)
            tree.feature.append(0)
            tree.cut.append(0)
            tree.counts.append(np.asarray(side, dtype=np.float64))
            tree.var.append(float(side_var))
            tree.depth.append(tree.depth[node] + 1)
        if not last:
            new_frontier += [first, first + 1]
    tree.frontier = new_frontier


def route(tree: DpCart, bins: np.ndarray, positions: np.ndarray) -> None:
    """Move this member's rows down to the tree's undecided nodes and leaves (in place): a row at a
    split goes left iff its bin < the cut, one level a step (a tree of max_depth levels: as many
    vectorised steps), over the same breadth-first layout histogram XGBoost's DP pass uses."""
    left = np.asarray(tree.left, dtype=np.int64)
    feature = np.asarray(tree.feature, dtype=np.int64)
    cut = np.asarray(tree.cut, dtype=np.int64)
    moving = np.flatnonzero(left[positions] >= 0)
    while moving.size:
        p = positions[moving]
        go_left = bins[moving, feature[p]] < cut[p]
        positions[moving] = np.where(go_left, left[p], left[p] + 1)
        moving = moving[left[positions[moving]] >= 0]


def finish(tree: DpCart, cuts: np.ndarray, criterion: str, n_classes: int, ccp_alpha: float = 0.0) -> Cart:
    """The grown tree as scikit-learn's arrays in its node order (module docstring)."""
    n_features, n_cuts = cuts.shape
    bv = BinValues(values=cuts.ravel(), ptr=np.arange(n_features + 1, dtype=np.int64) * n_cuts,
                   exact=np.zeros(n_features, dtype=bool), floor=np.full(n_features, np.nan, dtype=np.float32))
    left = np.asarray(tree.left, dtype=np.int64)
    internal = left >= 0
    counts = np.maximum(np.stack([np.asarray(c, dtype=np.float64) for c in tree.counts]), 0.0)
    rows = counts.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(rows[:, None] > 0, counts / rows[:, None], 1.0 / n_classes)
    value = np.clip(value, 0.0, 1.0)
    threshold = np.full(len(left), float(UNDEFINED))
    for i in np.flatnonzero(internal):
        threshold[i] = bv.threshold(int(tree.feature[i]), int(tree.cut[i]), 0, 0)
    imp = impurity(np.where(rows[:, None] > 0, counts, 1.0), CartParams(criterion=criterion, n_classes=n_classes))
    grown = Cart(criterion=criterion, n_features=n_features,
                 feature=np.where(internal, np.asarray(tree.feature, dtype=np.int64), UNDEFINED), threshold=threshold,
                 left=np.where(internal, left, -1), right=np.where(internal, left + 1, -1), value=value,
                 n_node_samples=np.maximum(np.rint(rows), 1).astype(np.int64), impurity=np.maximum(imp, 0.0))
    return in_preorder(grown, ccp_alpha)
