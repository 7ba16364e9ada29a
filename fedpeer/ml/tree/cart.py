"""One exact CART tree from summed histograms, level by level (docs/algorithms.md, "One exact
federated CART tree") — pure functions: every member runs them on the same summed histograms and
derives the same tree.

Histograms. A node's histogram holds, per feature and bin of the federated cut points
(fedpeer/ml/xgb/sketch.py: bin #{cuts <= x}), integer channels:
  classification: the rows of each class (K channels);
  regression: (Σ yq, Σ y2q, rows), yq = round(y * 2^label_bits), y2q = round(y² * 2^square_bits),
  the bits from the declared bound on |y| (`label_abs_max`, `scale_bits`) so that one row's value
  is at most 2^ROW_Q_BITS and a site's float64 bincount stays exact (histogram XGBoost's fixed
  point, fedpeer/ml/xgb/hist.py).
Bins are packed: feature f has (its cuts + 1) slots, so a feature with few distinct values costs
few slots whatever max_bin is (`Layout`); no missing-value slot (the job refuses missing values).
Every sum is a sum of integers: the sites' summed histograms are bit for bit the pooled rows' own.

Splits, as scikit-learn's best splitter (sklearn/tree/_splitter.pyx, _criterion.pyx) scores them,
with the same float64 formulas on the same (exact) counts:
  gini: proxy = -n_R (1 - Σ c_R² / n_R²) - n_L (1 - Σ c_L² / n_L²);
  entropy: proxy = -n_R H_R - n_L H_L, H = -Σ p log2 p (log2 as ln x / ln 2);
  squared_error (variance reduction): proxy = S_L² / n_L + S_R² / n_R with S = Σ y
  (Σ y² cancels between the children; it gives the nodes' impurity: Σ y² / n - (S / n)²).
Candidates: every cut k of every feature (left iff bin < k) with both children at least
`min_leaf_rows` rows, federation-wide. Ties: the lowest feature, then the lowest cut (scikit-learn
also takes the lowest threshold within a feature, but visits features in a random order). A node
is split iff its depth < max_depth, its impurity > EPSILON (scikit-learn's "pure" tolerance) and
some candidate exists — any such split, as scikit-learn does with min_impurity_decrease = 0.

Level order: `start_tree` asks for the root's histogram; `grow_level(growth, summed)` takes the
summed histograms of `growth.build` (the smaller child of each pair by rows, the left one on a
tie; its sibling is parent - built, exactly), decides the frontier, and asks for the next level or
is done. Nodes are numbered breadth-first; fedpeer/ml/tree/model.py turns the grown tree into
scikit-learn's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.protocols.fixedpoint import fraction_bits

__all__ = ["CRITERIA", "EPSILON", "CartParams", "Growth", "Layout", "TreeParams", "decode_level", "encode_level",
           "grow_level", "impurity", "label_channels", "level_histograms", "node_rows", "node_value", "route_rows",
           "scale_bits", "start_tree"]

CRITERIA = ("gini", "entropy", "squared_error")
REGRESSION = "squared_error"
EPSILON = float(np.finfo(np.float64).eps)    # scikit-learn's: a node whose impurity is at most this is pure
DEPTH_MAX = 32                               # levels of one tree (one secure sum each)
CLASSES_MAX = 1000                           # class-count channels of a histogram
MIN_LEAF_ROWS_MAX = 1 << 40
REG_CHANNELS = 3                             # Σ yq, Σ y2q, rows
ROW_Q_BITS = 28                              # |one row's fixed-point label (or its square)| <= 2^28
SITE_ROWS_MAX = 1 << 24                      # rows of one site: its cell sums stay <= 2^52, exact in float64
MAX_BIN_MAX = 65535                          # the sketch's own bound (bins fit a uint16)
CCP_ALPHA_MAX = 1e12
SCORED_CELLS_MAX = 1 << 22                   # (candidate, channel) cells a split search scores at once: ~32 MiB
_INT_SUM_LIMIT = 1 << 63                     # a secure-summed int64 cell stays below this in magnitude
_LN2 = float(np.log(2.0))


def scale_bits(bound: float) -> int:
    """Fraction bits for values bounded by `bound`: the largest b with bound * 2^b <= 2^ROW_Q_BITS."""
    try:
        return fraction_bits(bound, ROW_Q_BITS)
    except ValueError:
        raise ValueError(f"a label bound must be positive and finite, got {bound!r}") from None


@dataclass(frozen=True)
class CartParams:
    """What growing needs: the criterion, the classes (0 for regression), the stopping rules and,
    for regression, the fixed-point scales of Σy and Σy² (from the declared bound on |y|)."""

    criterion: str = "gini"
    n_classes: int = 2
    max_depth: int = 5
    min_leaf_rows: int = 1
    label_abs_max: float = 1000.0

    def __post_init__(self) -> None:
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if not self.regression and not 2 <= self.n_classes <= CLASSES_MAX:
            raise ValueError(f"n_classes must be in [2, {CLASSES_MAX}], got {self.n_classes!r}")
        if not 1 <= self.max_depth <= DEPTH_MAX:
            raise ValueError(f"max_depth must be in [1, {DEPTH_MAX}], got {self.max_depth!r}")
        if not 1 <= self.min_leaf_rows <= MIN_LEAF_ROWS_MAX:
            raise ValueError(f"min_leaf_rows must be in [1, 2^40], got {self.min_leaf_rows!r}")
        scale_bits(self.label_abs_max)        # positive and finite, or ValueError

    @property
    def regression(self) -> bool:
        return self.criterion == REGRESSION

    @property
    def channels(self) -> int:
        return REG_CHANNELS if self.regression else self.n_classes

    @property
    def label_bits(self) -> int:
        return scale_bits(self.label_abs_max)

    @property
    def square_bits(self) -> int:
        return scale_bits(self.label_abs_max * self.label_abs_max)


@dataclass(frozen=True)
class TreeParams:
    """A tree job's parameters as the core takes them (scikit-learn's names where it has them)."""

    criterion: str = "gini"
    n_classes: int = 2              # ignored for regression
    max_depth: int = 5
    min_leaf_rows: int = 1          # scikit-learn's min_samples_leaf, counted federation-wide
    max_bin: int = 256              # bins per feature of the federated cut points
    ccp_alpha: float = 0.0
    label_abs_max: float = 1000.0   # regression: the declared bound on |y|

    def __post_init__(self) -> None:
        self.cart()
        if not 2 <= self.max_bin <= MAX_BIN_MAX:
            raise ValueError(f"max_bin must be in [2, {MAX_BIN_MAX}], got {self.max_bin!r}")
        if not 0.0 <= self.ccp_alpha <= CCP_ALPHA_MAX:
            raise ValueError(f"ccp_alpha must be in [0, {CCP_ALPHA_MAX:g}], got {self.ccp_alpha!r}")

    def cart(self) -> CartParams:
        return CartParams(criterion=self.criterion, n_classes=0 if self.criterion == REGRESSION else self.n_classes,
                          max_depth=self.max_depth, min_leaf_rows=self.min_leaf_rows,
                          label_abs_max=self.label_abs_max)


# -- node statistics: rows, impurity, value, split proxy (scikit-learn's float64 formulas) -------

def node_rows(sums: np.ndarray, p: CartParams) -> np.ndarray:
    """Rows of each node (or candidate child) from its integer channel sums (..., C)."""
    return sums[..., 2] if p.regression else sums.sum(axis=-1)


def _reg_sums(sums: np.ndarray, p: CartParams) -> tuple[np.ndarray, np.ndarray]:
    """Σy, Σy² as float64 (exact scaling of integers below 2^53)."""
    return (np.ldexp(sums[..., 0].astype(np.float64), -p.label_bits),
            np.ldexp(sums[..., 1].astype(np.float64), -p.square_bits))


def impurity(sums: np.ndarray, p: CartParams) -> np.ndarray:
    """Each node's impurity as scikit-learn's node_impurity computes it (float64)."""
    w = node_rows(sums, p).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if p.regression:
            s, sq = _reg_sums(sums, p)
            mean = s / w
            return sq / w - mean * mean
        counts = sums.astype(np.float64)
        if p.criterion == "gini":
            sq = np.zeros(w.shape)
            for c in range(p.n_classes):
                sq = sq + counts[..., c] * counts[..., c]
            return 1.0 - sq / (w * w)
        ent = np.zeros(w.shape)
        for c in range(p.n_classes):
            share = counts[..., c] / w
            ent = np.where(counts[..., c] > 0.0, ent - share * (np.log(share) / _LN2), ent)
        return ent


def node_value(sums: np.ndarray, p: CartParams) -> np.ndarray:
    """Each node's value as scikit-learn stores it: class shares (..., K), or the mean (..., 1)."""
    w = node_rows(sums, p).astype(np.float64)[..., None]
    if p.regression:
        return _reg_sums(sums, p)[0][..., None] / w
    return sums.astype(np.float64) / w


def _proxy(left: np.ndarray, right: np.ndarray, p: CartParams) -> np.ndarray:
    """scikit-learn's proxy_impurity_improvement of candidate splits (larger is better)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if p.regression:
            sl, sr = _reg_sums(left, p)[0], _reg_sums(right, p)[0]
            return sl * sl / left[..., 2] + sr * sr / right[..., 2]
        wl = node_rows(left, p).astype(np.float64)
        wr = node_rows(right, p).astype(np.float64)
        return -(wr * impurity(right, p)) - wl * impurity(left, p)


# -- the packed layout, a site's histograms, their encoding -------------------------------------

@dataclass(frozen=True, eq=False)
class Layout:
    """Packed bins: feature f's bins 0..cuts_f occupy slots offsets[f]..offsets[f+1]-1."""

    cut_counts: np.ndarray     # int64 (F,)
    offsets: np.ndarray        # int64 (F + 1,)

    @classmethod
    def of(cls, cut_counts: Any) -> Layout:
        """The layout of features with these many cut points each (sketch.Cuts.counts())."""
        counts = np.asarray(cut_counts, dtype=np.int64)
        return cls(cut_counts=counts, offsets=np.concatenate(([0], np.cumsum(counts + 1))).astype(np.int64))

    @property
    def n_features(self) -> int:
        return len(self.cut_counts)

    @property
    def slots(self) -> int:
        return int(self.offsets[-1])

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (feature, cut k >= 1), feature-major, cut ascending: the order of the tie rule."""
        feature = np.repeat(np.arange(self.n_features, dtype=np.int64), self.cut_counts)
        first = np.repeat(np.cumsum(self.cut_counts) - self.cut_counts, self.cut_counts)
        return feature, np.arange(len(feature), dtype=np.int64) - first + 1


def label_channels(y: Any, p: CartParams) -> np.ndarray:
    """A site's labels as histogram inputs: class indices int64 (rows,), or for regression int64
    (rows, 3) of (yq, y2q, 1). DataError naming the bound for a label beyond label_abs_max."""
    y = np.asarray(y)
    if y.ndim != 1 or y.dtype.kind not in "biuf" or not np.isfinite(y.astype(np.float64)).all():
        raise DataError(f"tree: labels must be finite numbers (rows,), got {y.dtype} {y.shape}")
    if len(y) > SITE_ROWS_MAX:
        raise DataError(f"tree: {len(y)} rows at one site exceed SITE_ROWS_MAX={SITE_ROWS_MAX}")
    if not p.regression:
        if (y != np.round(y)).any() or (len(y) and (y.min() < 0 or y.max() >= p.n_classes)):
            raise DataError(f"tree: class labels must be integers in [0, {p.n_classes - 1}]")
        return y.astype(np.int64)
    y = y.astype(np.float64)
    bad = np.flatnonzero(np.abs(y) > p.label_abs_max)
    if len(bad):
        raise DataError(f"tree: label {float(y[bad[0]])!r} of row {int(bad[0])} is outside the declared bound "
                        f"label_abs_max={p.label_abs_max!r} (the job's fixed-point scale; raise it for every member)")
    yq = np.rint(np.ldexp(y, p.label_bits)).astype(np.int64)
    y2q = np.rint(np.ldexp(y * y, p.square_bits)).astype(np.int64)
    return np.stack([yq, y2q, np.ones(len(y), dtype=np.int64)], axis=1)


def level_histograms(bins: np.ndarray, labels: np.ndarray, positions: np.ndarray, build: Any, layout: Layout,
                     p: CartParams) -> np.ndarray:
    """This site's histograms of the nodes `build`: int64 (len(build), slots, C). `bins` from
    sketch.bin_matrix (column-major), `labels` from `label_channels`, `positions` each row's node.
    Per feature one bincount over (node, bin[, class]) cells; float64 sums of integers below
    2^52 are exact (module docstring)."""
    build = np.asarray(build, dtype=np.int64)
    out = np.zeros((len(build), layout.slots, p.channels), dtype=np.int64)
    if len(build) == 0 or len(positions) == 0:
        return out
    slot_of = np.full(int(max(positions.max(), build.max())) + 1, -1, dtype=np.int64)
    slot_of[build] = np.arange(len(build))
    slot = slot_of[positions]
    rows = slice(None) if bool((slot >= 0).all()) else np.flatnonzero(slot >= 0)
    slot, lab = slot[rows], labels[rows]
    for f in range(layout.n_features):
        width = int(layout.cut_counts[f]) + 1
        cells = slot * width + bins[rows, f]
        size = len(build) * width
        if p.regression:
            h = np.stack([np.rint(np.bincount(cells, weights=lab[:, c].astype(np.float64), minlength=size))
                          for c in range(2)] + [np.bincount(cells, minlength=size)], axis=-1).astype(np.int64)
        else:
            h = np.bincount(cells * p.n_classes + lab, minlength=size * p.n_classes)
        out[:, layout.offsets[f]:layout.offsets[f + 1], :] = h.reshape(len(build), width, p.channels)
    return out


def encode_level(hist: np.ndarray, n_parties: int) -> np.ndarray:
    """int64 histograms (or any int64 counts) -> the uint64 vector of the secure sum (two's
    complement: the sum mod 2^64 is the exact signed sum). DataError unless every |cell| *
    n_parties < 2^63, so that no sum of n_parties such vectors can wrap."""
    flat = np.ascontiguousarray(hist, dtype=np.int64).ravel()
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise ValueError(f"n_parties must be a positive integer, got {n_parties!r}")
    limit = (_INT_SUM_LIMIT - 1) // int(n_parties)
    if len(flat) and int(np.abs(flat).max()) > limit:
        raise DataError(f"tree: a histogram cell holds {int(flat[np.argmax(np.abs(flat))])}, beyond the secure "
                        f"sum's bound |cell| * {n_parties} parties < 2^63")
    return flat.view(np.uint64)


def decode_level(total: Any, n_nodes: int, layout: Layout, p: CartParams) -> np.ndarray:
    """The secure sum of `encode_level` vectors -> int64 (n_nodes, slots, C); ValueError on a wrong shape."""
    total = np.asarray(total)
    want = int(n_nodes) * layout.slots * p.channels
    if total.dtype != np.uint64 or total.shape != (want,):
        raise ValueError(f"expected uint64 ({want},) summed histograms, got {total.dtype} {total.shape}")
    return total.view(np.int64).reshape(int(n_nodes), layout.slots, p.channels)


def _segment_totals(hist: np.ndarray, layout: Layout) -> np.ndarray:
    """(n, F, C): every feature's sum over its bins (each must equal the node's totals)."""
    cum = np.concatenate([np.zeros_like(hist[:, :1]), np.cumsum(hist, axis=1)], axis=1)
    return cum[:, layout.offsets[1:]] - cum[:, layout.offsets[:-1]]


def check_level(hist: np.ndarray, layout: Layout, p: CartParams, rows: int, expected: np.ndarray | None) -> None:
    """ValueError unless summed histograms are what honest members can give: row counts in [0,
    the federation's rows], regression sums within rows x 2^28 (Σy² not negative), every feature
    agreeing on each node's totals, and those equal to what the parent's split said (`expected`)."""
    if not p.regression and ((hist < 0).any() or (hist > rows).any()):   # before node_rows sums them
        raise ValueError(f"a histogram cell counts rows outside [0, the federation's {rows}]")
    n = node_rows(hist, p)
    if (n < 0).any() or (n > rows).any():
        raise ValueError(f"a histogram cell counts rows outside [0, the federation's {rows}]")
    if p.regression:
        limit = n << ROW_Q_BITS
        if (np.abs(hist[..., 0]) > limit).any() or (hist[..., 1] < 0).any() or (hist[..., 1] > limit).any():
            raise ValueError("a histogram cell's label sums exceed its rows times the per-row bound")
    totals = _segment_totals(hist, layout)
    if (totals != totals[:, :1]).any():
        raise ValueError("summed histograms: features disagree on a node's totals")
    if expected is not None and (totals[:, 0] != expected).any():
        raise ValueError("summed histograms: a node's totals differ from its parent's split")


# -- growing ------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Growth:
    """One tree being grown; identical at every member. Node arrays grow breadth-first."""

    params: CartParams
    layout: Layout
    rows: int                    # the federation's training rows
    left: np.ndarray             # int64 (nodes,): left child, -1 at a leaf or an undecided node
    feature: np.ndarray          # int64
    cut: np.ndarray              # int64 k: left iff bin < k
    lower: np.ndarray            # int64: the node's highest non-empty bin below k (its left rows' top)
    upper: np.ndarray            # int64: its lowest non-empty bin from k (its right rows' bottom)
    sums: np.ndarray             # int64 (nodes, C)
    depth: np.ndarray            # int64
    frontier: np.ndarray         # node ids decided by the next grow_level
    build: np.ndarray            # the frontier nodes whose histograms the sites build and sum
    parent_hist: np.ndarray      # int64 (pairs, slots, C): the histograms of the frontier's parents
    done: bool

    @property
    def n_nodes(self) -> int:
        return len(self.left)


def start_tree(layout: Layout, params: CartParams, rows: int) -> Growth:
    """A tree with one undecided root: the first level asks for the root's histogram."""
    one = np.zeros(1, dtype=np.int64)
    return Growth(params=params, layout=layout, rows=int(rows), left=one - 1, feature=one.copy(), cut=one.copy(),
                  lower=one.copy(), upper=one.copy(), sums=np.zeros((1, params.channels), dtype=np.int64),
                  depth=one.copy(), frontier=one.copy(), build=one.copy(),
                  parent_hist=np.zeros((0, layout.slots, params.channels), dtype=np.int64), done=False)


def _frontier_hists(g: Growth, summed: np.ndarray) -> np.ndarray:
    """Histograms of every frontier node: the built ones as summed, each sibling = parent - built."""
    if g.n_nodes == 1:
        return summed
    at = np.arange(len(g.frontier))
    pair = at // 2                                      # the frontier is pairs of siblings, left first
    is_built = np.isin(g.frontier, g.build)
    sibling = np.where(at % 2 == 0, g.frontier + 1, g.frontier - 1)
    out = np.empty((len(g.frontier),) + summed.shape[1:], dtype=np.int64)
    out[is_built] = summed[np.searchsorted(g.build, g.frontier[is_built])]
    derived = ~is_built
    out[derived] = g.parent_hist[pair[derived]] - summed[np.searchsorted(g.build, sibling[derived])]
    return out


def _best_split(hist: np.ndarray, g: Growth) -> tuple[int, int, int, int] | None:
    """(feature, cut, lower bin, upper bin) of one node's best split, or None when no candidate
    leaves both children min_leaf_rows rows. Vectorised over every candidate; the first maximum
    is the tie rule."""
    p, layout = g.params, g.layout
    feature, k = layout.candidates()
    if len(feature) == 0:
        return None
    cum = np.concatenate([np.zeros_like(hist[:1]), np.cumsum(hist, axis=0)])     # (slots + 1, C)
    total = cum[layout.offsets[1]] - cum[0]
    best, best_score, step = -1, -np.inf, max(1, SCORED_CELLS_MAX // p.channels)
    for lo in range(0, len(feature), step):         # bounded memory: candidates in chunks, in order
        start, end = layout.offsets[feature[lo:lo + step]], k[lo:lo + step]
        left = cum[start + end] - cum[start]
        right = total[None, :] - left
        ok = (node_rows(left, p) >= p.min_leaf_rows) & (node_rows(right, p) >= p.min_leaf_rows)
        if not ok.any():
            continue
        score = np.where(ok, _proxy(left, right, p), -np.inf)
        at = int(np.argmax(score))                  # the first maximum, and across chunks only a larger one
        if score[at] > best_score:
            best, best_score = lo + at, float(score[at])
    if best < 0:
        return None
    f, cut = int(feature[best]), int(k[best])
    seg = node_rows(hist[layout.offsets[f]:layout.offsets[f + 1]], p)
    full = np.flatnonzero(seg > 0)
    return f, cut, int(full[full < cut].max()), int(full[full >= cut].min())


def grow_level(g: Growth, summed: np.ndarray) -> Growth:
    """Decide every frontier node from the summed histograms of `g.build` (decode_level) and ask
    for the next level; ValueError for histograms no honest members can give (check_level)."""
    if g.done:
        raise ValueError("the tree is done")
    summed = np.asarray(summed)
    if summed.ndim != 3 or summed.shape != (len(g.build), g.layout.slots, g.params.channels):
        raise ValueError(f"summed histograms must be ({len(g.build)}, {g.layout.slots}, {g.params.channels}), "
                         f"got {summed.shape}")
    hist = _frontier_hists(g, summed.astype(np.int64))
    root = g.n_nodes == 1
    check_level(hist, g.layout, g.params, g.rows, None if root else g.sums[g.frontier])
    sums = g.sums.copy()
    if root:
        sums[0] = _segment_totals(hist[:1], g.layout)[0, 0]
        if int(node_rows(sums[0], g.params)) != g.rows:
            raise ValueError(f"the root's histogram counts {int(node_rows(sums[0], g.params))} rows, "
                             f"the cut points {g.rows}")
    p = g.params
    splittable = (g.depth[g.frontier] < p.max_depth) & (impurity(sums[g.frontier], p) > EPSILON) \
        & (node_rows(sums[g.frontier], p) >= 2 * p.min_leaf_rows)
    made = [(i, s) for i in np.flatnonzero(splittable) if (s := _best_split(hist[i], g)) is not None]
    nodes = np.array([g.frontier[i] for i, _ in made], dtype=np.int64)
    first, new = g.n_nodes, 2 * len(made)
    children = first + 2 * np.arange(len(made), dtype=np.int64)
    left, feature, cut, lower, upper = (a.copy() for a in (g.left, g.feature, g.cut, g.lower, g.upper))
    child_sums = np.zeros((new, p.channels), dtype=np.int64)
    for j, (i, (f, k, lo, hi)) in enumerate(made):
        node = g.frontier[i]
        left[node], feature[node], cut[node], lower[node], upper[node] = children[j], f, k, lo, hi
        start = g.layout.offsets[f]
        child_sums[2 * j] = hist[i, start:start + k].sum(axis=0)
        child_sums[2 * j + 1] = sums[node] - child_sums[2 * j]
    child_depth = np.repeat(g.depth[nodes] + 1, 2) if len(made) else np.zeros(0, dtype=np.int64)
    pad = np.zeros(new, dtype=np.int64)
    may_split = (child_depth < p.max_depth) & (node_rows(child_sums, p) >= 2 * p.min_leaf_rows) \
        & (impurity(child_sums, p) > EPSILON)
    pairs = np.flatnonzero(may_split[0::2] | may_split[1::2])        # pairs with a child that may split
    smaller_right = node_rows(child_sums[1::2], p) < node_rows(child_sums[0::2], p)   # tie: build the left one
    frontier = np.stack([children[pairs], children[pairs] + 1], axis=1).ravel()
    return replace(g, left=np.concatenate((left, pad - 1)), feature=np.concatenate((feature, pad)),
                   cut=np.concatenate((cut, pad)), lower=np.concatenate((lower, pad)),
                   upper=np.concatenate((upper, pad)), sums=np.concatenate((sums, child_sums)),
                   depth=np.concatenate((g.depth, child_depth)), frontier=frontier,
                   build=children[pairs] + smaller_right[pairs].astype(np.int64),
                   parent_hist=hist[[i for i, _ in made]][pairs] if len(made) else g.parent_hist[:0],
                   done=len(pairs) == 0)


def route_rows(g: Growth, bins: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Each row's node after the splits made so far (rows at a split node move down, repeatedly:
    at most depth steps, each vectorised over rows)."""
    pos = np.asarray(positions, dtype=np.int64).copy()
    for _ in range(int(g.depth.max()) + 1):
        node_left = g.left[pos]
        moving = np.flatnonzero(node_left >= 0)
        if len(moving) == 0:
            break
        at = pos[moving]
        go_left = bins[moving, g.feature[at]].astype(np.int64) < g.cut[at]
        pos[moving] = np.where(go_left, node_left[moving], node_left[moving] + 1)
    return pos
