"""Growing one tree from summed histograms, level by level, exactly as xgboost's hist updater
does (docs/algorithms.md, "Exact histogram mode, the formulas"; xgboost src/tree/param.h and
hist/evaluate_splits.h) — pure functions: every member runs them on the same summed histograms
and derives the same tree.

Per node with sums G, H (xgboost's CalcWeight / CalcGain, reg_alpha = 0):
  weight w = -G / (H + lambda), clipped to [-max_delta_step, max_delta_step] if that is > 0;
  gain(G, H) = G^2 / (H + lambda), or -(2 G w + (H + lambda) w^2) with max_delta_step > 0;
  both are 0 when H < min_child_weight or H <= 0.
A split's loss_chg = gain(left) + gain(right) - gain(node) (xgboost stores it so, without the
1/2 of the paper's eq. 7; gamma = min_split_loss is compared with this same number). A split is
made iff loss_chg > 1e-6 (xgboost's kRtEps), loss_chg >= gamma, both sides have H >=
min_child_weight and H > 0, both sides have >= `min_leaf_rows` rows federation-wide (fedpeer's
privacy floor: no leaf describes one person), and the node's depth < max_depth.
Candidates: every cut k of every feature (left iff bin < k), missing values right, then missing
values left (xgboost's learned default direction). Ties: the lowest feature, then the lowest
cut, then missing-right — one fixed rule, so every member picks the same split. Leaf value =
eta * w as float32.

Level order (depthwise, xgboost's default grow_policy): `start_tree` asks for the root's
histogram; `grow_level(growth, summed)` takes the summed histograms of `growth.build` (the
smaller child of every pair, by federation-wide rows, the left one on a tie; the sibling is
parent - built, exactly, since histograms are integers), decides every frontier node, and asks
for the next level — or is done. Nodes are numbered breadth-first as the trees document wants
(the k-th internal node has children 2k+1, 2k+2). At most max_depth sums per tree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedpeer.ml.xgb.hist import CHANNELS
from fedpeer.ml.xgb.kernels import best_splits_kernel, route_kernel
from fedpeer.ml.xgb.sketch import Cuts
from fedpeer.ml.xgb.tree import _f32, _Tree

__all__ = ["CANDIDATE_FIELDS", "Growth", "SplitParams", "best_splits", "block_candidates", "decide_level",
           "finish_tree", "grow_level", "route_rows", "start_tree", "tree_leaf_values"]

RT_EPS = 1e-6     # xgboost's kRtEps: a split must gain more than this


def _scaled(values: np.ndarray, bits: int) -> np.ndarray:
    """np.ldexp(values as float64, -bits): while 2^-bits is a normal float, the product with it is
    that value exactly, in one pass (an ldexp of the converted array takes ~20x as long)."""
    if bits <= 1000:
        return values * 2.0 ** -bits
    return np.ldexp(values.astype(np.float64), -bits)


@dataclass(frozen=True)
class SplitParams:
    """xgboost's tree parameters (same names) plus fedpeer's min_leaf_rows and the fixed-point
    scales of the summed g and h (hist.scale_bits of the declared bounds)."""

    grad_bits: int
    hess_bits: int
    eta: float = 0.3
    max_depth: int = 6
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    max_delta_step: float = 0.0
    min_leaf_rows: int = 2

    def sums(self, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Integer channel sums (..., 3) -> float64 G, H (exact while below 2^53)."""
        return _scaled(totals[..., 0], self.grad_bits), _scaled(totals[..., 1], self.hess_bits)

    def weight(self, G: np.ndarray, H: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            w = -G / (H + self.reg_lambda)
        if self.max_delta_step > 0:
            w = np.clip(w, -self.max_delta_step, self.max_delta_step)
        return np.where((H < self.min_child_weight) | (H <= 0), 0.0, w)

    def gain(self, G: np.ndarray, H: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.max_delta_step > 0:
                w = self.weight(G, H)
                g = -(2.0 * G * w + (H + self.reg_lambda) * w * w)
            else:
                g = G * G / (H + self.reg_lambda)
        return np.where((H < self.min_child_weight) | (H <= 0), 0.0, g)


@dataclass(frozen=True, eq=False)
class Splits:
    """The best split of each node (arrays over nodes); `made` False where none is allowed."""

    made: np.ndarray          # bool
    feature: np.ndarray       # int64
    cut: np.ndarray           # int64 k >= 1: left iff bin < k
    default_left: np.ndarray  # int64 0/1
    loss_chg: np.ndarray      # float64
    left: np.ndarray          # int64 (n, 3) left child's sums
    right: np.ndarray         # int64 (n, 3)


def best_splits(hist: np.ndarray, cut_counts: np.ndarray, p: SplitParams) -> Splits:
    """The best split of every node (`_best`), and whether it is made: it gains more than
    RT_EPS and at least gamma."""
    chg, f, cut, d, left, totals = _best(hist, cut_counts, p)
    return _splits(chg, f, cut, d, left, totals[:, 0], p)


def _splits(chg: np.ndarray, f: np.ndarray, cut: np.ndarray, d: np.ndarray, left: np.ndarray, total: np.ndarray,
            p: SplitParams) -> Splits:
    made = (chg > RT_EPS) & (chg >= p.gamma)
    return Splits(made=made, feature=f, cut=cut, default_left=d, loss_chg=np.where(made, chg, 0.0), left=left,
                  right=total - left)


def _scale(bits: int) -> float:
    """2^-bits as a float64 that multiplies exactly (`_scaled`'s fast case)."""
    if bits > 1000:
        raise ValueError(f"a gradient bound needs {bits} fraction bits: too small a bound for the split search")
    return 2.0 ** -bits


def _best(hist: np.ndarray, cut_counts: np.ndarray, p: SplitParams) -> tuple[np.ndarray, ...]:
    """xgboost's split enumeration over summed histograms int64 (n, F, S, 3), in one compiled
    pass per node (kernels.best_splits_kernel). Candidates are ordered (feature, cut,
    direction: missing right, then missing left where the node has missing rows of the feature)
    and the first maximum wins. A candidate's change is G_L^2/(H_L+lambda) + G_R^2/(H_R+lambda)
    - G^2/(H+lambda), the float64 operations in xgboost's order. Returns, per node, the best
    candidate's loss change (-inf if none is allowed), feature, cut, direction (1: missing
    left), the left child's integer sums, and each feature's integer totals (n, F, 3) (the
    node's sums: those of feature 0). ValueError if a hessian or row count is negative."""
    hist = np.ascontiguousarray(hist, dtype=np.int64)
    if hist.ndim != 4 or hist.shape[1] == 0 or hist.shape[2] < 2 or hist.shape[3] != CHANNELS:
        raise ValueError(f"the split search needs (nodes, F >= 1, S >= 2, 3) histograms, got {hist.shape}")
    if len(cut_counts) != hist.shape[1]:
        raise ValueError(f"{len(cut_counts)} cut counts for {hist.shape[1]} features")
    n, n_features = hist.shape[:2]
    chg = np.empty(n, dtype=np.float64)
    best = np.empty((n, 3), dtype=np.int64)
    left = np.empty((n, CHANNELS), dtype=np.int64)
    totals = np.empty((n, n_features, CHANNELS), dtype=np.int64)
    if not best_splits_kernel(hist, np.ascontiguousarray(cut_counts, dtype=np.int64), _scale(p.grad_bits),
                              _scale(p.hess_bits), float(p.reg_lambda), float(p.min_child_weight),
                              float(p.max_delta_step), int(p.min_leaf_rows), chg, best, left, totals):
        raise ValueError("summed histograms hold a negative hessian or row count")
    return chg, best[:, 0], best[:, 1], best[:, 2], left, totals


@dataclass(frozen=True, eq=False)
class Growth:
    """One tree being grown; identical at every member. Node arrays grow breadth-first."""

    params: SplitParams
    cut_counts: np.ndarray       # int64 (F,)
    left: np.ndarray             # int64 (nodes,), -1 at a leaf or an undecided node
    feature: np.ndarray          # int64
    cut: np.ndarray              # int64 (0 at a leaf)
    default_left: np.ndarray     # int64
    loss_chg: np.ndarray         # float64
    sums: np.ndarray             # int64 (nodes, 3) Σ gq, Σ hq, rows
    depth: np.ndarray            # int64
    frontier: np.ndarray         # node ids decided by the next grow_level
    build: np.ndarray            # the frontier nodes whose histograms the sites build and sum
    parent_hist: np.ndarray      # int64 (pairs, F, S, 3): the histograms of the frontier's parents
    done: bool

    @property
    def n_nodes(self) -> int:
        return len(self.left)


def start_tree(cut_counts: np.ndarray, params: SplitParams, features: np.ndarray | None = None) -> Growth:
    """A tree with one undecided root: the first level asks for the root's histogram. `features`
    (bool (F,), histboost.tree_features): only these may be split on (the others' cuts are no
    candidates; their histograms still travel, so every level has one shape)."""
    one = np.zeros(1, dtype=np.int64)
    counts = np.asarray(cut_counts, dtype=np.int64)
    if features is not None:
        counts = np.where(np.asarray(features, dtype=bool), counts, 0)
    return Growth(params=params, cut_counts=counts, left=one - 1, feature=one,
                  cut=one, default_left=one, loss_chg=np.zeros(1), sums=np.zeros((1, CHANNELS), dtype=np.int64),
                  depth=one, frontier=one, build=one, parent_hist=np.zeros((0,), dtype=np.int64),
                  done=params.max_depth == 0)


def _frontier_hists(g: Growth, summed: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Histograms of every frontier node: the built ones as summed, each sibling = parent - built.
    The frontier is pairs of siblings in order and `build` holds one of each pair, ascending, so
    summed[i] belongs to pair i."""
    if len(g.frontier) == 1:
        return summed
    right_built = ((g.build - g.frontier[0]) % 2 == 1)[:, None, None, None]
    out = np.empty((len(g.build), 2) + summed.shape[1:], dtype=np.int64)
    np.subtract(parent, summed, out=out[:, 1])
    out[:, 0] = summed
    np.copyto(out[:, 0], out[:, 1], where=right_built)         # a right child built: the left is derived
    np.copyto(out[:, 1], summed, where=right_built)
    return out.reshape((len(g.frontier),) + summed.shape[1:])


def _check_totals(totals: np.ndarray, expected: np.ndarray | None) -> None:
    """Summed histograms a member can prove wrong (besides negative hessians or rows, which
    `_best` refuses): features that disagree on a node's totals (`totals`: each feature's, (n,
    F, 3)), or totals that differ from what the parent's split said."""
    if (totals != totals[:, :1]).any():
        raise ValueError("summed histograms: features disagree on a node's totals")
    if expected is not None and (totals[:, 0] != expected).any():
        raise ValueError("summed histograms: a node's totals differ from its parent's split")


def grow_level(g: Growth, summed: np.ndarray) -> Growth:
    """Decide every frontier node from the summed histograms of `g.build` (int64
    (len(build), F, S, 3), from hist.decode_histograms) and ask for the next level."""
    if g.done:
        raise ValueError("the tree is done")
    summed = np.asarray(summed)
    if summed.ndim != 4 or summed.shape[0] != len(g.build) or summed.shape[1] != len(g.cut_counts):
        raise ValueError(f"summed histograms must be ({len(g.build)}, {len(g.cut_counts)}, S, 3), got {summed.shape}")
    candidates, hist = block_candidates(g, summed, g.parent_hist, 0)
    grown = decide_level(g, [(candidates, 0, len(g.cut_counts))])
    return replace(grown, parent_hist=hist[np.flatnonzero(grown.left[g.frontier] >= 0)])


CANDIDATE_FIELDS = 10     # per node: loss change (float64 bits), feature, cut, default_left, left sums (3), sums (3)


def block_candidates(g: Growth, summed: np.ndarray, parent: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """The best split of every frontier node among the features first .. first + F_b - 1, from
    their summed histograms of `g.build` (int64 (len(build), F_b, S, 3)) and their histograms
    of the frontier's parents (`parent`, as block_candidates returned them a level up, the nodes
    that split): int64 (frontier, CANDIDATE_FIELDS), and the frontier's histograms of the block
    (the next level's `parent`, once decide_level says which nodes split). ValueError on
    histograms a member can prove wrong."""
    if g.done:
        raise ValueError("the tree is done")
    if summed.ndim != 4 or summed.shape[0] != len(g.build) or first + summed.shape[1] > len(g.cut_counts):
        raise ValueError(f"summed histograms of a block must be ({len(g.build)}, F_b, S, 3), got {summed.shape}")
    hist = _frontier_hists(g, summed.astype(np.int64), parent)
    root = len(g.frontier) == 1 and g.frontier[0] == 0
    chg, f, cut, d, left, totals = _best(hist, g.cut_counts[first:first + hist.shape[1]], g.params)
    _check_totals(totals, None if root else g.sums[g.frontier])
    total = totals[:, 0]
    out = np.empty((len(g.frontier), CANDIDATE_FIELDS), dtype=np.int64)
    out[:, 0] = chg.view(np.int64)
    out[:, 1], out[:, 2], out[:, 3] = f + first, cut, d
    out[:, 4:7], out[:, 7:10] = left, total
    return out, hist


def decide_level(g: Growth, blocks: list[tuple[np.ndarray, int, int]]) -> Growth:
    """Every frontier node's split from its blocks' candidates (block_candidates of features
    [f0, f1), in feature order; empty arrays for blocks without features): the largest loss
    change, the first block on a tie — the full search's order (feature, cut, direction), so
    the split is the one grow_level picks over all features. ValueError on candidates no honest
    owner gives: a wrong shape, a feature outside its block, a cut beyond the feature's cut
    points, node sums that differ between blocks or from the parent's split."""
    n = len(g.frontier)
    best: np.ndarray | None = None
    for cands, f0, f1 in blocks:
        cands = np.asarray(cands)
        if f0 == f1:
            if cands.size:
                raise ValueError("a block without features sent split candidates")
            continue
        if cands.dtype != np.int64 or cands.shape != (n, CANDIDATE_FIELDS):
            raise ValueError(f"split candidates must be int64 ({n}, {CANDIDATE_FIELDS}), got {cands.shape}")
        chg, f, cut, d = cands[:, 0].view(np.float64), cands[:, 1], cands[:, 2], cands[:, 3]
        beyond = cut > g.cut_counts[np.clip(f, 0, len(g.cut_counts) - 1)]
        if (np.isnan(chg).any() or (f < f0).any() or (f >= f1).any() or ((d != 0) & (d != 1)).any()
                or (cut < 1).any() or (beyond & (chg > -np.inf)).any()):
            raise ValueError("a split candidate names no cut of its block's features")
        left, total = cands[:, 4:7], cands[:, 7:10]
        if (left[:, 1:] < 0).any() or (left[:, 1:] > total[:, 1:]).any():
            raise ValueError("a split candidate's left child holds more than its node")
        if best is None:
            best = cands.copy()
            continue
        if (total != best[:, 7:10]).any():
            raise ValueError("summed histograms: features disagree on a node's totals")
        better = chg > best[:, 0].view(np.float64)
        best[better] = cands[better]
    if best is None:
        raise ValueError("no block holds a feature")
    root = n == 1 and g.frontier[0] == 0
    if not root and (best[:, 7:10] != g.sums[g.frontier]).any():
        raise ValueError("summed histograms: a node's totals differ from its parent's split")
    s = _splits(best[:, 0].view(np.float64), best[:, 1], best[:, 2], best[:, 3], best[:, 4:7], best[:, 7:10], g.params)
    return _decide(g, s, best[:, 7:10], root)


def _decide(g: Growth, s: Splits, totals: np.ndarray, root: bool) -> Growth:
    """The tree after the frontier's splits `s` (and its nodes' sums `totals`): the children, and
    which of them the next level builds."""
    sums = g.sums.copy()
    if root:
        sums[0] = totals[0]
    split = np.flatnonzero(s.made & (g.depth[g.frontier] < g.params.max_depth))
    nodes = g.frontier[split]
    first = g.n_nodes
    children = first + 2 * np.arange(len(split), dtype=np.int64)        # left ids; right = left + 1
    left, feature, cut, dleft, chg = (a.copy() for a in (g.left, g.feature, g.cut, g.default_left, g.loss_chg))
    left[nodes], feature[nodes], cut[nodes] = children, s.feature[split], s.cut[split]
    dleft[nodes], chg[nodes] = s.default_left[split], s.loss_chg[split]
    new = 2 * len(split)
    child_sums = np.stack([s.left[split], s.right[split]], axis=1).reshape(new, CHANNELS)
    child_depth = np.repeat(g.depth[nodes] + 1, 2)
    pad = np.zeros(new, dtype=np.int64)
    frontier = np.arange(first, first + new, dtype=np.int64)
    done = new == 0 or int(child_depth[0]) >= g.params.max_depth
    smaller_right = child_sums[1::2, 2] < child_sums[0::2, 2]           # tie: build the left one
    build = children + smaller_right.astype(np.int64)
    return replace(g, left=np.concatenate((left, pad - 1)), feature=np.concatenate((feature, pad)),
                   cut=np.concatenate((cut, pad)), default_left=np.concatenate((dleft, pad)),
                   loss_chg=np.concatenate((chg, pad.astype(np.float64))), sums=np.concatenate((sums, child_sums)),
                   depth=np.concatenate((g.depth, child_depth)), frontier=frontier if not done else pad[:0],
                   build=build if not done else pad[:0], parent_hist=np.zeros((0,), dtype=np.int64), done=done)


def route_rows(g: Growth, bins: np.ndarray, positions: np.ndarray, missing_bin: int) -> np.ndarray:
    """Each row's node after the splits made so far: a row at a split node moves down until it
    reaches a node without one (kernels.route_kernel, one compiled pass over the rows)."""
    pos = np.array(positions, dtype=np.int64)          # a copy
    if len(pos) != len(bins):
        raise ValueError(f"{len(pos)} positions for {len(bins)} rows")
    if len(pos) and (pos.min() < 0 or pos.max() >= g.n_nodes):
        raise ValueError("a row's position is not a node of the tree")
    route_kernel(g.left, g.feature, g.cut, g.default_left, np.ascontiguousarray(bins), pos, int(missing_bin))
    return pos


def finish_tree(g: Growth, cuts: Cuts) -> _Tree:
    """The grown tree as the trees document's canonical arrays (fedpeer.ml.xgb.tree): split
    condition = the cut value (left iff x < it), leaf value = eta * weight as float32,
    loss_changes = loss_chg, sum_hessian = H."""
    if not g.done:
        raise ValueError("the tree is not done")
    leaf = g.left < 0
    G, H = g.params.sums(g.sums)
    leaf_value = _f32(g.params.eta * g.params.weight(G, H))
    threshold = np.zeros(g.n_nodes)
    internal = ~leaf
    threshold[internal] = cuts.values[cuts.ptr[g.feature[internal]] + g.cut[internal] - 1]
    right = np.where(leaf, -1, g.left + 1)
    return _Tree(left=g.left.copy(), right=right, feature=np.where(leaf, 0, g.feature),
                 value=np.where(leaf, leaf_value, threshold), default_left=np.where(leaf, 0, g.default_left),
                 gain=np.where(leaf, 0.0, _f32(g.loss_chg)), cover=_f32(H), depth=int(g.depth.max()))


def tree_leaf_values(tree: _Tree, X: np.ndarray) -> np.ndarray:
    """Each row's leaf value in a finished tree, from raw features as xgboost reads them (float32
    x < split_condition goes left, NaN follows default_left): float64 (rows,). Routing by bins
    gives the same leaves (sketch module docstring); this one needs no cuts, so a member can
    rebuild its margins from committed trees alone."""
    X32 = np.asarray(X, dtype=np.float32)
    pos = np.zeros(X32.shape[0], dtype=np.int64)
    for _ in range(tree.depth):
        moving = np.flatnonzero(tree.left[pos] >= 0)
        if len(moving) == 0:
            break
        at = pos[moving]
        x = X32[moving, tree.feature[at]]
        go_left = np.where(np.isnan(x), tree.default_left[at] == 1, x < tree.value[at].astype(np.float32))
        pos[moving] = np.where(go_left, tree.left[at], tree.right[at])
    return tree.value[pos]
