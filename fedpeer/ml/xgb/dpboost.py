"""Histogram XGBoost with differential privacy, the arithmetic: pure functions every member runs
on the same noised totals (fedpeer/kinds/xgboost/hist_dp.py moves the vectors through the noised
secure sums; docs/algorithms.md, "Histogram mode with differential privacy").

- Cut points: uniform from public bounds ([data] bounds, carried by the proposal as `dp_bounds`):
  feature f in [lo_f, hi_f] gets `bins - 1` thresholds lo_f + k·(hi_f - lo_f)/bins (float32),
  never the rows' quantiles (exact pooled quantiles are a release of single rows). A value outside
  its bounds falls in the first or last bin (the same as clipping it): bounds only place cuts.
- Per-row gradients of binary:logistic, clipped (dp.clip_entries) to g in [-1, 1], h in [0, 1/4]
  (they lie there anyway: g = p - y, h = p(1 - p)) and sent as q = round(g·2^fg), round(h·2^fh)
  with 1·2^fg = 0.25·2^fh = 2^VALUE_BITS: one row adds at most 2^VALUE_BITS to one bin of each
  released feature, so each histogram (G or H) of a level has L1 sensitivity F_r·2^VALUE_BITS and
  L2 sensitivity √F_r·2^VALUE_BITS (F_r: the features the tree may split on, the only ones whose
  histograms are released; every level is one release of G and one of H: a row is in one node).
- The split rule, on the noised sums only: per node and released feature, G_L, H_L = the noised
  bins left of a cut, G_R, H_R = the rest of that feature's bins; xgboost's loss change
  gain(G_L, H_L) + gain(G_R, H_R) - gain(G, H) (histtree.SplitParams: the same formulas), each
  gain less the noise's expected share of it (`debiased_gain`: Var/(H + lambda), Var public);
  a candidate counts only when both sides' noised H reach the hessian floor
  max(min_child_weight, HESS_SIGMAS·σ_H·√(bins on that side)) (σ_H: the noise's standard deviation
  in one bin, public), so no side is noise alone; the best candidate (lowest feature, then cut,
  on a tie) splits when its change exceeds max(1e-6, gamma) and the node is above max_depth.
- Leaf values: -G/(H + lambda)·eta (float32) from the node's own noised sums — the mean over the
  released features of each feature's total (F_r estimates of one number, their noise
  independent) — or, for a leaf at max_depth, the side of its parent's split; G first shrunk by
  its noise's variance (`shrunk`). The hessian histograms carry HESS_NOISE_WEIGHT times the
  gradients' noise variance per unit of sensitivity (dp.calibrate's weights). The base score is 0.5 (margin 0), public:
  nothing is released for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedpeer.ml.xgb.hist import level_histograms
from fedpeer.ml.xgb.histtree import RT_EPS, SplitParams
from fedpeer.ml.xgb.kernels import route_kernel
from fedpeer.ml.xgb.tree import _f32, _Tree

from fedpeer.protocols import dp
from fedpeer.protocols.fixedpoint import fraction_bits

VALUE_BITS = 19           # a row's quantised g or h: at most 2^19 in magnitude (20 bits with its sign)
GRAD_BOUND, HESS_BOUND = 1.0, 0.25          # binary:logistic: |g| <= 1, 0 <= h <= 1/4
GRAD_FRAC, HESS_FRAC = fraction_bits(GRAD_BOUND, VALUE_BITS), fraction_bits(HESS_BOUND, VALUE_BITS)
# H's noise variance per unit of sensitivity over G's (dp.calibrate's weight): H, a sum of positive terms,
# is a large number where G, a sum of signs, is a small one, so H bears noise better. On the synthetic
# benchmark (bench_dp.py, one run each) test error rose over the exact job's by 8.7 / 2.3 points at
# ε 1 / 8 with equal multipliers, 3.0 / 1.3 with this weight.
HESS_NOISE_WEIGHT = 9.0
HESS_SIGMAS = 2.0          # a side's noised H must exceed this many noise standard deviations
BASE_SCORE = 0.5           # public: margin 0, no release


def quantised_derivatives(margins: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """binary:logistic's g, h at `margins`, clipped to their bounds and quantised: int64 of
    magnitude <= 2^VALUE_BITS."""
    p = 1.0 / (1.0 + np.exp(-np.asarray(margins, dtype=np.float64)))
    g = dp.clip_entries(p - np.asarray(y, dtype=np.float64), -GRAD_BOUND, GRAD_BOUND)
    h = dp.clip_entries(p * (1.0 - p), 0.0, HESS_BOUND)
    return np.rint(g * 2.0 ** GRAD_FRAC).astype(np.int64), np.rint(h * 2.0 ** HESS_FRAC).astype(np.int64)


def level_sums(bins: np.ndarray, gq: np.ndarray, hq: np.ndarray, positions: np.ndarray, frontier: np.ndarray,
               n_bins: int, drawn: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """int64 (nodes, F_r, bins) each: Σ gq and Σ hq of this member's rows at each frontier node, per
    feature of `bins` (the tree's released features' columns) and bin — the exact mode's compiled
    pass (hist.level_histograms; its row counts are dropped, never sent). Rows at no frontier
    node, or not `drawn` (subsample), add nothing."""
    hist = level_histograms(bins, gq, hq, positions, frontier, n_bins, drawn)
    return hist[..., 0], hist[..., 1]


def plan(n_released: int, max_depth: int, trees: int, n_bins: int) -> list[dp.DpSum]:
    """Every release of a job (module docstring): per tree and level, G and H."""
    top = float(2 ** VALUE_BITS)
    sums = []
    for t in range(trees):
        for d in range(max_depth):
            entries = (2 ** d) * n_released * n_bins
            for which in ("g", "h"):
                sums.append(dp.DpSum(f"t{t}/d{d}/{which}", n_released * top, math.sqrt(n_released) * top, entries))
    return sums


@dataclass
class DpTree:
    """One tree being grown, identical at every member: nodes breadth-first (the k-th split node's
    children are appended in frontier order, as histtree numbers them)."""

    left: list[int] = field(default_factory=lambda: [-1])
    feature: list[int] = field(default_factory=lambda: [0])
    cut: list[int] = field(default_factory=lambda: [0])
    gain: list[float] = field(default_factory=lambda: [0.0])
    G: list[float] = field(default_factory=lambda: [0.0])      # the node's noised sums (real units)
    H: list[float] = field(default_factory=lambda: [0.0])
    V: list[float] = field(default_factory=lambda: [0.0])      # the noise's variance in G (public)
    depth: list[int] = field(default_factory=lambda: [0])
    frontier: list[int] = field(default_factory=lambda: [0])


def node_totals(G: np.ndarray, H: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per node: each released feature's noised totals (nodes, F_r) and their mean (nodes,)."""
    gt, ht = G.sum(axis=2), H.sum(axis=2)
    return gt, ht, gt.mean(axis=1), ht.mean(axis=1)


def decide(tree: DpTree, G: np.ndarray, H: np.ndarray, features: np.ndarray, sp: SplitParams, sigma_g: float,
           sigma_h: float, last: bool) -> None:
    """Split every frontier node of `tree` from its noised histograms G, H (float64 real units,
    (nodes, F_r, bins)) by the split rule (module docstring), appending the children; `last`: the
    children are at max_depth and become leaves with their side's sums. `sigma_g`, `sigma_h`: the
    noise's standard deviation in one bin of G and of H (public)."""
    nodes, nf, n_bins = G.shape
    gt, ht, g_node, h_node = node_totals(G, H)
    GL, HL = np.cumsum(G, axis=2)[:, :, :-1], np.cumsum(H, axis=2)[:, :, :-1]
    GR, HR = gt[:, :, None] - GL, ht[:, :, None] - HL
    k = np.arange(1, n_bins, dtype=np.float64)
    floor_l = np.maximum(sp.min_child_weight, HESS_SIGMAS * sigma_h * np.sqrt(k))
    floor_r = np.maximum(sp.min_child_weight, HESS_SIGMAS * sigma_h * np.sqrt(n_bins - k))
    ok = (HL >= floor_l) & (HR >= floor_r)
    var = sigma_g * sigma_g
    chg = (debiased_gain(sp, GL, HL, var * k) + debiased_gain(sp, GR, HR, var * (n_bins - k))
           - debiased_gain(sp, gt, ht, var * n_bins)[:, :, None])
    chg = np.where(ok, chg, -np.inf).reshape(nodes, -1)
    best = np.argmax(chg, axis=1)                                  # the first maximum: lowest feature, cut
    best_chg = chg[np.arange(nodes), best]
    split = best_chg > max(RT_EPS, sp.gamma)
    fi, kk = best // (n_bins - 1), best % (n_bins - 1) + 1
    new_frontier = []
    for i, node in enumerate(tree.frontier):
        tree.G[node], tree.H[node], tree.V[node] = float(g_node[i]), float(h_node[i]), var * n_bins / nf
        if not split[i]:
            continue
        f, c = int(fi[i]), int(kk[i])
        first = len(tree.left)
        tree.left[node], tree.feature[node], tree.cut[node] = first, int(features[f]), c
        tree.gain[node] = float(best_chg[i])
        sides = ((GL[i, f, c - 1], HL[i, f, c - 1], var * c), (GR[i, f, c - 1], HR[i, f, c - 1], var * (n_bins - c)))
        for g_side, h_side, v_side in sides:
            tree.left.append(-1)
            tree.feature.append(0)
            tree.cut.append(0)
            tree.gain.append(0.0)
            tree.G.append(float(g_side))
            tree.H.append(float(h_side))
            tree.V.append(float(v_side))
            tree.depth.append(tree.depth[node] + 1)
        if not last:
            new_frontier += [first, first + 1]
    tree.frontier = new_frontier


def debiased_gain(sp: SplitParams, G: np.ndarray, H: np.ndarray, var: np.ndarray | float) -> np.ndarray:
    """xgboost's gain of a node with noised sums G, H, less what the noise adds to it on average:
    E[(G + noise)²] = G² + var, so var/(H + lambda) of G²/(H + lambda) is the noise's (0 where
    the gain is 0: H below min_child_weight)."""
    g = sp.gain(G, H)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(g != 0, g - var / (H + sp.reg_lambda), 0.0)


def shrunk(G: np.ndarray, var: np.ndarray) -> np.ndarray:
    """A leaf's noised G shrunk towards 0 by its noise's variance (positive-part James-Stein:
    G·max(0, 1 - var/G²)): a leaf whose G the noise could explain moves the margin little."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return G * np.maximum(0.0, 1.0 - np.where(G != 0, var / (G * G), np.inf))


def route(tree: DpTree, bins: np.ndarray, positions: np.ndarray) -> None:
    """Move this member's rows down to the tree's undecided nodes and leaves (in place): the exact
    mode's compiled pass (kernels.route_kernel; no value is missing, so no bin is the missing one)."""
    n_bins_max = np.iinfo(bins.dtype).max + 1
    route_kernel(np.asarray(tree.left, dtype=np.int64), np.asarray(tree.feature, dtype=np.int64),
                 np.asarray(tree.cut, dtype=np.int64), np.zeros(len(tree.left), dtype=np.int64),
                 np.ascontiguousarray(bins), positions, n_bins_max)


def finish(tree: DpTree, cuts: np.ndarray, sp: SplitParams) -> _Tree:
    """The grown tree as the trees document's arrays (histtree.finish_tree's layout): a split's
    condition is its cut value (left iff x < it), a leaf's value eta·weight as float32."""
    left = np.asarray(tree.left, dtype=np.int64)
    leaf = left < 0
    G, H = shrunk(np.asarray(tree.G), np.asarray(tree.V)), np.asarray(tree.H)
    feature = np.asarray(tree.feature, dtype=np.int64)
    cut = np.asarray(tree.cut, dtype=np.int64)
    threshold = np.zeros(len(left))
    internal = np.flatnonzero(~leaf)
    threshold[internal] = cuts[feature[internal], cut[internal] - 1]
    value = np.where(leaf, _f32(sp.eta * sp.weight(G, H)), threshold)
    gain = np.where(leaf, 0.0, _f32(np.asarray(tree.gain)))
    return _Tree(left=left, right=np.where(leaf, -1, left + 1), feature=np.where(leaf, 0, feature), value=value,
                 default_left=np.zeros(len(left), dtype=np.int64), gain=gain,
                 cover=_f32(np.maximum(H, 0.0)), depth=int(max(tree.depth)))
