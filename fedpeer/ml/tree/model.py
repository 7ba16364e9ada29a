"""One grown CART tree as scikit-learn's arrays (`Cart`): thresholds, node order, cost-complexity
pruning, prediction, rules an operator reads, and the canonical model file (docs/algorithms.md,
"One exact federated CART tree") — pure functions.

scikit-learn's convention (sklearn.tree._tree.Tree): nodes in depth-first order, left child
first; a row goes left iff x[feature] <= threshold (x as float32, compared in float64); a leaf has
left = right = -1, feature = -2, threshold = -2.0; value holds every node's class shares (or, for
regression, its mean), impurity its criterion, n_node_samples its federation-wide rows.

Thresholds (`BinValues`): a split at cut k sends bins < k left. When every bin of the feature
holds one value — the sketch located every value: max_bin above the feature's federation-wide
rows (fedpeer/ml/xgb/sketch.py's ranks ceil(q n / max_bin) then cover 1..n) — the threshold is
scikit-learn's, the midpoint v_lo / 2 + v_hi / 2 of the node's largest left value and smallest
right value (both known: each is its bin's one value). Otherwise a bin's values are unknown and
the threshold is the largest float32 below cut k: every row goes where the histograms sent it.

Pruning (`prune`): scikit-learn's minimal cost-complexity pruning (ccp_alpha), the same weakest
link order and float64 arithmetic on the same node impurities, ties to the lowest node index.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedpeer.ml.tree.cart import CRITERIA, REGRESSION, Growth, impurity, node_rows, node_value

__all__ = ["BinValues", "Cart", "check_cart", "finish_tree", "in_preorder", "load_model", "model_bytes",
           "predict_value", "prune", "rules", "to_sklearn"]

MODEL_FORMAT = "fedpeer.tree"
MODEL_VERSION = 1
MODEL_BYTES_MAX = 256 << 20          # a stored tree file fedpeer reads
NODES_MAX = 1 << 22                  # nodes of a stored tree
FEATURES_MAX = 1_000_000
LEAF, UNDEFINED = -1, -2             # scikit-learn's TREE_LEAF and TREE_UNDEFINED
THRESHOLD_DIGITS = 6                 # significant digits of a threshold in the rules text


@dataclass(frozen=True, eq=False)
class BinValues:
    """The federated cut points (sketch.Cuts' layout: feature f's ascending float32 cuts are
    values[ptr[f]:ptr[f+1]]), and per feature whether each of its bins holds one value (`exact`)
    with its lowest value (its federation-wide minimum, the one value of bin 0) when it does."""

    values: np.ndarray     # float32 (cuts,)
    ptr: np.ndarray        # int64 (F + 1,)
    exact: np.ndarray      # bool (F,)
    floor: np.ndarray      # float32 (F,), NaN where not exact

    def threshold(self, f: int, k: int, lower: int, upper: int) -> float:
        """The float64 threshold of a split at cut k of feature f (module docstring)."""
        def value(b: int) -> np.float64:
            return np.float64(self.floor[f] if b == 0 else self.values[self.ptr[f] + b - 1])
        if self.exact[f]:
            return float(value(lower) / 2.0 + value(upper) / 2.0)
        return float(np.nextafter(self.values[self.ptr[f] + k - 1], np.float32(-np.inf)))


@dataclass(frozen=True, eq=False)
class Cart:
    """One tree in scikit-learn's arrays (module docstring); value is (nodes, K), K = 1 for regression."""

    criterion: str
    n_features: int
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    n_node_samples: np.ndarray
    impurity: np.ndarray

    @property
    def regression(self) -> bool:
        return self.criterion == REGRESSION

    @property
    def n_nodes(self) -> int:
        return len(self.left)

    @property
    def n_leaves(self) -> int:
        return int((self.left == LEAF).sum())

    @property
    def depth(self) -> int:
        depth = np.zeros(self.n_nodes, dtype=np.int64)
        for i in range(self.n_nodes):              # preorder: a parent comes before its children
            if self.left[i] != LEAF:
                depth[self.left[i]] = depth[self.right[i]] = depth[i] + 1
        return int(depth.max())


def _preorder(left: np.ndarray, right: np.ndarray, keep_leaf: np.ndarray | None = None) -> list[int]:
    """Node ids in depth-first order, left first (scikit-learn's); `keep_leaf` nodes' subtrees cut."""
    order, stack = [], [0]
    while stack:
        i = stack.pop()
        order.append(i)
        if left[i] != LEAF and not (keep_leaf is not None and keep_leaf[i]):
            stack += [int(right[i]), int(left[i])]
    return order


def _reindex(cart: Cart, order: list[int], leaf: np.ndarray) -> Cart:
    """The nodes `order` (a preorder) as a new Cart; `leaf` nodes become leaves."""
    old = np.asarray(order, dtype=np.int64)
    new_of = np.full(cart.n_nodes, LEAF, dtype=np.int64)
    new_of[old] = np.arange(len(old))
    is_leaf = leaf[old] | (cart.left[old] == LEAF)
    return replace(cart, feature=np.where(is_leaf, UNDEFINED, cart.feature[old]),
                   threshold=np.where(is_leaf, float(UNDEFINED), cart.threshold[old]),
                   left=np.where(is_leaf, LEAF, new_of[np.maximum(cart.left[old], 0)]),
                   right=np.where(is_leaf, LEAF, new_of[np.maximum(cart.right[old], 0)]),
                   value=cart.value[old], n_node_samples=cart.n_node_samples[old], impurity=cart.impurity[old])


def finish_tree(g: Growth, bins: BinValues, ccp_alpha: float = 0.0) -> Cart:
    """The grown tree as scikit-learn's arrays, in its node order, pruned with `ccp_alpha` > 0."""
    if not g.done:
        raise ValueError("the tree is not done")
    p = g.params
    internal = g.left >= 0
    threshold = np.full(g.n_nodes, float(UNDEFINED))
    for i in np.flatnonzero(internal):
        threshold[i] = bins.threshold(int(g.feature[i]), int(g.cut[i]), int(g.lower[i]), int(g.upper[i]))
    grown = Cart(criterion=p.criterion, n_features=g.layout.n_features,
                 feature=np.where(internal, g.feature, UNDEFINED), threshold=threshold,
                 left=np.where(internal, g.left, LEAF), right=np.where(internal, g.left + 1, LEAF),
                 value=node_value(g.sums, p), n_node_samples=node_rows(g.sums, p).astype(np.int64),
                 impurity=impurity(g.sums, p))
    return in_preorder(grown, ccp_alpha)


def in_preorder(grown: Cart, ccp_alpha: float = 0.0) -> Cart:
    """A tree grown breadth-first (a split's children at left, left + 1) in scikit-learn's node
    order, pruned with `ccp_alpha` > 0."""
    cart = _reindex(grown, _preorder(grown.left, grown.right), np.zeros(grown.n_nodes, dtype=bool))
    return prune(cart, ccp_alpha) if ccp_alpha > 0 else cart


def prune(cart: Cart, ccp_alpha: float) -> Cart:
    """scikit-learn's minimal cost-complexity pruning (sklearn/tree/_tree.pyx, _cost_complexity_prune):
    repeatedly cut the internal node of smallest effective alpha (R(t) - R(T_t)) / (|T_t| - 1)
    while it is at most ccp_alpha."""
    n = cart.n_nodes
    r_node = cart.n_node_samples.astype(np.float64) * cart.impurity / float(cart.n_node_samples[0])
    parent = np.full(n, UNDEFINED, dtype=np.int64)
    for i in range(n):
        if cart.left[i] != LEAF:
            parent[cart.left[i]] = parent[cart.right[i]] = i
    is_leaf = cart.left == LEAF
    r_branch, n_leaves = np.zeros(n), np.zeros(n, dtype=np.int64)
    for leaf in np.flatnonzero(is_leaf):          # the same order of float additions as scikit-learn
        r_branch[leaf] = r_node[leaf]
        i = leaf
        while i != 0:
            i = parent[i]
            r_branch[i] += r_node[leaf]
            n_leaves[i] += 1
    candidate, cut = ~is_leaf, np.zeros(n, dtype=bool)
    while candidate[0]:
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(candidate, (r_node - r_branch) / (n_leaves - 1), np.finfo(np.float64).max)
        node = int(np.argmin(alpha))             # the first minimum: scikit-learn's strict <
        if ccp_alpha < alpha[node]:
            break
        under = [int(cart.left[node]), int(cart.right[node])]
        while under:                                # every node under `node` is no candidate now
            i = under.pop()
            candidate[i] = False
            if cart.left[i] != LEAF:
                under += [int(cart.left[i]), int(cart.right[i])]
        candidate[node], cut[node] = False, True
        pruned, diff = n_leaves[node] - 1, r_node[node] - r_branch[node]
        n_leaves[node], r_branch[node] = 0, r_node[node]
        i = parent[node]
        while i != UNDEFINED:
            n_leaves[i] -= pruned
            r_branch[i] += diff
            i = parent[i]
    return _reindex(cart, _preorder(cart.left, cart.right, cut), cut)


def predict_value(cart: Cart, X: Any) -> np.ndarray:
    """Each row's leaf value: float64 (rows, K) class shares, or (rows,) for regression. X is read
    as float32, as scikit-learn reads it; a missing value (NaN) follows the child with more rows
    (scikit-learn's rule for a tree trained without missing values)."""
    X32 = np.asarray(X, dtype=np.float32)
    if X32.ndim != 2 or X32.shape[1] != cart.n_features:
        raise ValueError(f"X must be (rows, {cart.n_features}), got {X32.shape}")
    pos = np.zeros(X32.shape[0], dtype=np.int64)
    nan_left = cart.n_node_samples[np.maximum(cart.left, 0)] > cart.n_node_samples[np.maximum(cart.right, 0)]
    while True:
        moving = np.flatnonzero(cart.left[pos] != LEAF)
        if len(moving) == 0:
            break
        at = pos[moving]
        x = X32[moving, cart.feature[at]].astype(np.float64)
        go_left = np.where(np.isnan(x), nan_left[at], x <= cart.threshold[at])
        pos[moving] = np.where(go_left, cart.left[at], cart.right[at])
    out = cart.value[pos]
    return out[:, 0] if cart.regression else out


def _bound(name: str, low: float | None, high: float | None) -> str:
    def num(v: float) -> str:
        return f"{v:.{THRESHOLD_DIGITS}g}"
    if low is None:
        return f"{name} <= {num(high)}" if high is not None else ""
    return f"{name} > {num(low)}" if high is None else f"{num(low)} < {name} <= {num(high)}"


def rules(cart: Cart, features: Sequence[str], classes: Sequence[str], min_leaf_rows: int) -> list[str]:
    """One if-then rule per leaf, in node order: the path's bounds on each feature (in the order the
    path first tests it), the prediction, the leaf's rows and federated share, and (classification)
    its class mix — not shown where some class has from 1 to min_leaf_rows - 1 rows in the leaf
    (the leaf's total would give the hidden count away)."""
    out: list[str] = []
    total = int(cart.n_node_samples[0])

    def walk(i: int, bounds: dict[int, tuple[float | None, float | None]]) -> None:
        if cart.left[i] != LEAF:
            f, t = int(cart.feature[i]), float(cart.threshold[i])
            low, high = bounds.get(f, (None, None))
            walk(int(cart.left[i]), {**bounds, f: (low, t if high is None else min(high, t))})
            walk(int(cart.right[i]), {**bounds, f: (t if low is None else max(low, t), high)})
            return
        path = " and ".join(_bound(features[f], *b) for f, b in bounds.items())     # in the path's order
        rows = int(cart.n_node_samples[i])
        where = f"{rows} row{'s' * (rows != 1)}, {rows / total:.1%} of the federation's"
        if cart.regression:
            then = f"{float(cart.value[i, 0]):.{THRESHOLD_DIGITS}g} ({where})"
        else:
            counts = np.rint(cart.value[i] * rows).astype(np.int64)
            mix = ("class mix not shown: a class has fewer than "
                   f"{min_leaf_rows} rows here") if ((counts > 0) & (counts < min_leaf_rows)).any() else \
                ", ".join(f"{c} {int(n)}" for c, n in zip(classes, counts))
            then = f"{classes[int(np.argmax(cart.value[i]))]} ({where}; {mix})"
        out.append(f"if {path} then {then}" if path else f"always {then}")

    walk(0, {})
    return out


# -- the model file: canonical JSON, checked when read ------------------------------------------

def model_doc(cart: Cart, features: Sequence[str], classes: Sequence[str]) -> dict:
    """The tree and its names as JSON-able arrays (scikit-learn's convention, module docstring)."""
    return {"format": MODEL_FORMAT, "version": MODEL_VERSION, "criterion": cart.criterion,
            "features": list(features), "classes": list(classes), "feature": cart.feature.tolist(),
            "threshold": cart.threshold.tolist(), "left": cart.left.tolist(), "right": cart.right.tolist(),
            "value": cart.value.tolist(), "n_node_samples": cart.n_node_samples.tolist(),
            "impurity": cart.impurity.tolist()}


def model_bytes(cart: Cart, features: Sequence[str], classes: Sequence[str]) -> bytes:
    """The canonical model file: `model_doc` as sorted, compact JSON (floats round-trip exactly)."""
    return json.dumps(model_doc(cart, features, classes), sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


def load_model(data: bytes) -> tuple[Cart, list[str], list[str]]:
    """(tree, features, classes) from `model_bytes`; ValueError naming what is wrong otherwise:
    the structure is checked as scikit-learn's (preorder, children in range, every node reached
    once), features in range, values finite (class shares in [0, 1])."""
    if len(data) > MODEL_BYTES_MAX:
        raise ValueError(f"larger than {MODEL_BYTES_MAX} bytes")
    try:
        doc = json.loads(data)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT or doc.get("version") != MODEL_VERSION:
        raise ValueError(f"not a {MODEL_FORMAT} version {MODEL_VERSION} document")
    features, classes, criterion = doc.get("features"), doc.get("classes"), doc.get("criterion")
    if criterion not in CRITERIA or not isinstance(features, list) or not isinstance(classes, list) \
            or not all(isinstance(s, str) for s in features + classes) or not 0 < len(features) <= FEATURES_MAX:
        raise ValueError("criterion, features or classes")
    if (criterion == REGRESSION) != (len(classes) == 0) or len(classes) == 1:
        raise ValueError("classes do not fit the criterion")
    try:
        ints = {k: np.asarray(doc[k], dtype=np.int64) for k in ("feature", "left", "right", "n_node_samples")}
        floats = {k: np.asarray(doc[k], dtype=np.float64) for k in ("threshold", "value", "impurity")}
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ValueError("node arrays missing or not numbers") from None
    cart = Cart(criterion=criterion, n_features=len(features), **ints, **floats)
    _check(cart, max(1, len(classes)))
    return cart, features, classes


def check_cart(cart: Cart, width: int) -> None:
    """ValueError naming what is wrong unless `cart` is a well-formed tree in scikit-learn's arrays
    with `width` values per node (as `load_model` checks a stored tree)."""
    _check(cart, width)


def _check(cart: Cart, width: int) -> None:
    n = cart.n_nodes
    arrays = (cart.feature, cart.threshold, cart.right, cart.n_node_samples, cart.impurity)
    if not 1 <= n <= NODES_MAX or any(a.shape != (n,) for a in arrays) or cart.value.shape != (n, width):
        raise ValueError("node arrays of different lengths or shapes")
    if not (np.isfinite(cart.threshold).all() and np.isfinite(cart.value).all() and np.isfinite(cart.impurity).all()):
        raise ValueError("a threshold, value or impurity is not finite")
    if (cart.n_node_samples < 1).any() or (not cart.regression and ((cart.value < 0) | (cart.value > 1)).any()):
        raise ValueError("a node's rows or class shares are out of range")
    leaf = cart.left == LEAF
    if (cart.right[leaf] != LEAF).any() or (cart.feature[leaf] != UNDEFINED).any():
        raise ValueError("a leaf with a child or a feature")
    inner = np.flatnonzero(~leaf)
    if ((cart.feature[inner] < 0) | (cart.feature[inner] >= cart.n_features)).any():
        raise ValueError("a split on a feature out of range")
    if (cart.left[inner] != inner + 1).any() or (cart.right[inner] <= cart.left[inner]).any() \
            or (cart.right[inner] >= n).any():
        raise ValueError("children out of scikit-learn's depth-first order")
    if _preorder(cart.left, cart.right) != list(range(n)):
        raise ValueError("nodes not each reached once in depth-first order")


def to_sklearn(cart: Cart, classes: Sequence[str] = ()) -> Any:
    """A fitted scikit-learn DecisionTreeClassifier / DecisionTreeRegressor holding this tree
    (sklearn.tree._tree.Tree's own state), for scikit-learn's predict, plot_tree, export_text."""
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor
    from sklearn.tree._tree import NODE_DTYPE, Tree

    k = cart.value.shape[1]
    nodes = np.zeros(cart.n_nodes, dtype=NODE_DTYPE)
    nodes["left_child"], nodes["right_child"], nodes["feature"] = cart.left, cart.right, cart.feature
    nodes["threshold"], nodes["impurity"], nodes["n_node_samples"] = cart.threshold, cart.impurity, cart.n_node_samples
    nodes["weighted_n_node_samples"] = cart.n_node_samples.astype(np.float64)
    left, right = np.maximum(cart.left, 0), np.maximum(cart.right, 0)
    nodes["missing_go_to_left"] = (cart.left != LEAF) & (cart.n_node_samples[left] > cart.n_node_samples[right])
    tree = Tree(cart.n_features, np.array([k], dtype=np.intp), 1)
    tree.__setstate__({"max_depth": cart.depth, "node_count": cart.n_nodes, "nodes": nodes,
                       "values": np.ascontiguousarray(cart.value[:, None, :])})
    model = DecisionTreeRegressor() if cart.regression else DecisionTreeClassifier(criterion=cart.criterion)
    model.tree_, model.n_features_in_, model.n_outputs_ = tree, cart.n_features, 1
    model.max_features_ = cart.n_features
    if not cart.regression:
        model.classes_, model.n_classes_ = np.asarray(list(classes) or list(range(k))), k
    return model
