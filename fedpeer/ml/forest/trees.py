"""Decision-tree forests as plain arrays: built from scikit-learn, checked, sent, scored.

BOFRF (docs/algorithms.md) sends every site's trees to every other site, and every site scores
every tree on its own rows. A tree from a peer is data, not code (docs/security.md): it travels and is
stored as a handful of numpy arrays, never as a pickle, and nothing reads those arrays before
`validate` has accepted them.

The format (`Forest`): T trees, N nodes in all; tree t owns nodes [tree_offsets[t],
tree_offsets[t+1]) and its root is the first of them. Per node: `left`, `right` (child index
local to its tree, both -1 at a leaf), `feature` (index into `features`, -1 at a leaf),
`threshold` (0 at a leaf) and `value`, P(positive class) among the training rows that reached
the node. A row goes left iff x[feature] <= threshold.

Rules of this module
* `validate` is the gate for peers' trees: exact dtypes and shapes, offsets strictly increasing
  from 0 to N, children both -1 or both inside their own tree, every child after its parent
  (scikit-learn's depth-first order — so no walk can loop and acyclicity costs nothing), every
  node but a root with exactly one parent (a tree: no shared nodes), depth, trees, nodes per tree
  and features bounded, features of internal nodes in range, names unique, thresholds finite,
  values in [0, 1]. Any failure is RemoteProtocolError("tree", ...). It is O(N) numpy work,
  with O(log depth) passes for the depth (pointer jumping), whatever a peer sends.
* A Forest's arrays are read-only views, so the evaluator's per-Forest cache cannot go stale.
* Pure: no I/O except `save`/`load`, no logging, no global state.

Layout: scoring (`predict_trees`, `evaluator`: scikit-learn's compiled traversal and the numpy
fallback) is in treepredict.py; its names are importable from here.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.base.store import atomic_write
from fedpeer.errors import DataError, LocalProtocolError, RemoteProtocolError
from fedpeer.wire import frame as wire

__all__ = ["Forest", "concat", "from_sklearn", "from_wire", "load", "save", "take", "to_wire", "validate"]

TREES_MAX = 10_000
NODES_PER_TREE_MAX = 1_000_000
DEPTH_MAX = 64
FEATURES_MAX = 100_000
FEATURE_NAME_BYTES_MAX = 1024
WIRE_NODES_MAX = 1 << 24           # a 64 MiB frame holds ~2.4 M nodes (28 bytes each): far below

_ARRAYS = {"tree_offsets": np.dtype("<i8"), "left": np.dtype("<i4"), "right": np.dtype("<i4"),
           "feature": np.dtype("<i4"), "threshold": np.dtype("<f8"), "value": np.dtype("<f8")}
_NODE_ARRAYS = ("left", "right", "feature", "threshold", "value")


@dataclass(frozen=True, eq=False)
class Forest:
    """T decision trees as flat arrays (module docstring). Construct through `from_sklearn`,
    `from_wire`, `load`, `concat` or `take`; anything else must pass `validate` before use."""

    features: tuple[str, ...]       # feature names; `feature` indices refer to these
    tree_offsets: np.ndarray        # int64 (T+1,): tree t owns nodes [tree_offsets[t], tree_offsets[t+1])
    left: np.ndarray                # int32 (N,): child index local to its tree, -1 at a leaf
    right: np.ndarray               # int32 (N,)
    feature: np.ndarray             # int32 (N,): index into features; -1 at a leaf
    threshold: np.ndarray           # float64 (N,): go left iff x <= threshold; 0 at a leaf
    value: np.ndarray               # float64 (N,): P(positive class) at the node, in [0, 1]

    def __post_init__(self) -> None:
        for name in _ARRAYS:        # read-only views: the evaluator's cache must not go stale
            array = getattr(self, name)
            if isinstance(array, np.ndarray) and array.flags.writeable:
                view = array.view()
                view.flags.writeable = False
                object.__setattr__(self, name, view)

    @property
    def n_trees(self) -> int:
        return len(self.tree_offsets) - 1

    @property
    def n_nodes(self) -> int:
        return len(self.left)


def _forest(features: Sequence[str], offsets: Any, left: Any, right: Any, feature: Any, threshold: Any,
            value: Any) -> Forest:
    """A Forest with every array in its exact dtype (copies only where the dtype differs)."""
    raw = {"tree_offsets": offsets, "left": left, "right": right, "feature": feature, "threshold": threshold,
           "value": value}
    return Forest(features=tuple(features),
                  **{k: np.ascontiguousarray(v, dtype=_ARRAYS[k]) for k, v in raw.items()})


# ---------------------------------------------------------------------------------------------
# From scikit-learn; combining forests
# ---------------------------------------------------------------------------------------------

def from_sklearn(model: Any, features: Sequence[str], positive_index: int = 1, *,
                 classes: Sequence[Any] | None = None) -> Forest:
    """The trees of a fitted RandomForestClassifier, or of a list of DecisionTreeClassifier.

    `value` is the probability of class `classes[positive_index]`, computed as `predict_proba`
    does. For a forest, `classes` is `model.classes_`; for a list of trees it defaults to the
    sorted union of their `classes_`. A tree that never saw the positive class has value 0."""
    features = tuple(features)
    if hasattr(model, "estimators_"):
        estimators = list(model.estimators_)
        classes = np.asarray(model.classes_)
        # A forest's trees are fitted on class indices (0..n-1), not on the labels.
        labels = [positive_index] * len(estimators)
        _check_feature_names(model, features)
    else:
        estimators = list(model)
        if classes is None:
            classes = np.unique(np.concatenate([np.asarray(e.classes_) for e in estimators])) if estimators else []
        labels = None
    classes = np.asarray(classes)
    if not 0 <= positive_index < len(classes):
        raise DataError(f"the model knows {len(classes)} class(es); there is no class number {positive_index} "
                        "(was it trained on rows of a single class?)")
    if labels is None:
        labels = [classes[positive_index]] * len(estimators)
    parts = [_tree_arrays(est, len(features), label) for est, label in zip(estimators, labels)]
    sizes = [len(p[0]) for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    cols = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0) for i in range(5)]
    return _forest(features, offsets, *cols)


def _check_feature_names(model: Any, features: tuple[str, ...]) -> None:
    names = getattr(model, "feature_names_in_", None)
    if names is not None and tuple(map(str, names)) != features:
        raise ValueError("the model was fitted with other feature names than `features`")


def _tree_arrays(estimator: Any, n_features: int, label: Any) -> tuple[np.ndarray, ...]:
    tree = estimator.tree_
    if tree.n_outputs != 1:
        raise ValueError("only single-output trees can be converted")
    if tree.n_features != n_features:
        raise ValueError(f"a tree was fitted on {tree.n_features} features, `features` names {n_features}")
    left = tree.children_left.astype(np.int32)
    leaf = left == -1
    # Exactly the operations of DecisionTreeClassifier.predict_proba, so values match bit for bit.
    n_classes = int(np.asarray(estimator.n_classes_).reshape(-1)[0])
    proba = np.array(tree.value[:, 0, :n_classes], dtype=np.float64)
    normalizer = proba.sum(axis=1)[:, np.newaxis]
    normalizer[normalizer == 0.0] = 1.0
    proba /= normalizer
    column = np.flatnonzero(np.asarray(estimator.classes_) == label)
    value = proba[:, column[0]] if len(column) else np.zeros(len(left))
    return (left, tree.children_right.astype(np.int32), np.where(leaf, -1, tree.feature).astype(np.int32),
            np.where(leaf, 0.0, tree.threshold), value)


def concat(forests: Sequence[Forest]) -> Forest:
    """All trees of `forests`, in order. Every forest must name the same features in the same order."""
    if not forests:
        raise ValueError("concat needs at least one forest")
    features = forests[0].features
    if any(f.features != features for f in forests):
        raise ValueError("forests name different features")
    sizes = np.array([f.n_nodes for f in forests], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    offsets = np.concatenate([[0]] + [f.tree_offsets[1:] + s for f, s in zip(forests, starts)])
    return _forest(features, offsets, *(np.concatenate([getattr(f, k) for f in forests]) for k in _NODE_ARRAYS))


def take(forest: Forest, tree_indices: Any) -> Forest:
    """The trees at `tree_indices` (integers, in that order; or a boolean mask over the trees)."""
    index = np.asarray(tree_indices)
    if index.dtype == bool:
        if index.shape != (forest.n_trees,):
            raise ValueError("a boolean mask must have one entry per tree")
        index = np.flatnonzero(index)
    index = index.reshape(-1).astype(np.int64, casting="same_kind") if index.size else np.zeros(0, np.int64)
    if len(index) and (index.min() < 0 or index.max() >= forest.n_trees):
        raise ValueError(f"tree index out of range [0, {forest.n_trees})")
    starts = forest.tree_offsets[index]
    sizes = forest.tree_offsets[index + 1] - starts
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    nodes = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
    return _forest(forest.features, offsets, *(getattr(forest, k)[nodes] for k in _NODE_ARRAYS))


# ---------------------------------------------------------------------------------------------
# Validation: the gate for trees from peers
# ---------------------------------------------------------------------------------------------

def _bad(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError("tree", detail)


def validate(forest: Forest, *, trees_max: int = TREES_MAX, nodes_per_tree_max: int = NODES_PER_TREE_MAX,
             depth_max: int = DEPTH_MAX, features_max: int = FEATURES_MAX) -> None:
    """Raise RemoteProtocolError("tree", ...) unless `forest` is well formed (module docstring)."""
    _validate(forest, trees_max, nodes_per_tree_max, depth_max, features_max)


def _validate(forest: Forest, trees_max: int, nodes_per_tree_max: int, depth_max: int,
              features_max: int) -> np.ndarray:
    """As `validate`; returns the depth of every tree (int64, (T,))."""
    n_features = _check_features(forest.features, features_max)
    _check_arrays(forest)
    offsets = forest.tree_offsets
    if len(offsets) < 1 or len(offsets) - 1 > trees_max:
        raise _bad(f"tree_offsets must hold T+1 entries with 0 <= T <= {trees_max}")
    n = forest.n_nodes
    if offsets[0] != 0 or offsets[-1] != n:
        raise _bad(f"tree_offsets must run from 0 to the node count {n}")
    sizes = np.diff(offsets)
    if len(sizes) and (sizes.min() < 1 or sizes.max() > nodes_per_tree_max):
        raise _bad(f"every tree must hold 1 to {nodes_per_tree_max} nodes, in order")
    if not (np.isfinite(forest.threshold).all() and np.isfinite(forest.value).all()):
        raise _bad("non-finite threshold or value")
    if not ((forest.value >= 0.0) & (forest.value <= 1.0)).all():
        raise _bad("value outside [0, 1]")
    base = np.repeat(offsets[:-1], sizes)                   # global index of each node's root
    local = np.arange(n, dtype=np.int64) - base
    size = np.repeat(sizes, sizes)
    left, right = forest.left.astype(np.int64), forest.right.astype(np.int64)
    leaf = left == -1
    if (leaf != (right == -1)).any():
        raise _bad("a node with exactly one child")
    internal = ~leaf
    for child, side in ((left, "left"), (right, "right")):
        c, loc = child[internal], local[internal]
        if ((c <= loc) | (c >= size[internal])).any():
            raise _bad(f"{side} child out of range or not after its parent")
    feature = forest.feature
    if (feature[leaf] != -1).any() or (forest.threshold[leaf] != 0.0).any():
        raise _bad("a leaf must have feature -1 and threshold 0")
    if len(feature) and internal.any() and ((feature[internal] < 0) | (feature[internal] >= n_features)).any():
        raise _bad(f"feature index out of range [0, {n_features})")
    parent = np.arange(n, dtype=np.int64)
    children = np.concatenate([(base + left)[internal], (base + right)[internal]])
    if not np.array_equal(np.bincount(children, minlength=n), (local != 0).astype(np.int64)):
        raise _bad("every node but the root must have exactly one parent")
    parent[children] = np.concatenate([np.flatnonzero(internal)] * 2)
    return _depths(parent, offsets, depth_max)


def _check_features(features: Any, features_max: int) -> int:
    if not isinstance(features, tuple) or len(features) > features_max:
        raise _bad(f"features must be a tuple of at most {features_max} names")
    for name in features:
        if not isinstance(name, str) or len(name.encode("utf-8", "surrogatepass")) > FEATURE_NAME_BYTES_MAX:
            raise _bad(f"feature names must be strings of at most {FEATURE_NAME_BYTES_MAX} bytes")
    if len(set(features)) != len(features):
        raise _bad("duplicate feature names")
    return len(features)


def _check_arrays(forest: Forest) -> None:
    for name, dtype in _ARRAYS.items():
        array = getattr(forest, name)
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
            raise _bad(f"{name} must be a 1-D {dtype} array")
    n = forest.n_nodes
    if any(len(getattr(forest, k)) != n for k in _NODE_ARRAYS):
        raise _bad("node arrays of different lengths")


def _depths(parent: np.ndarray, offsets: np.ndarray, depth_max: int) -> np.ndarray:
    """Depth of every tree by pointer jumping: after k passes each node knows its 2^k-th ancestor,
    so a tree of depth D takes log2(D) + 1 passes (a malicious 1 M-node chain: 21)."""
    dist = (parent != np.arange(len(parent))).astype(np.int64)   # distance to `parent`; roots point to themselves
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            break
        dist += dist[parent]
        parent = up
    depth = np.maximum.reduceat(dist, offsets[:-1]) if len(dist) else np.zeros(0, dtype=np.int64)
    if len(depth) and depth.max() > depth_max:
        raise _bad(f"a tree deeper than {depth_max}")
    return depth


# ---------------------------------------------------------------------------------------------
# Wire and files
# ---------------------------------------------------------------------------------------------

def to_wire(forest: Forest) -> dict:
    """A msgpack-able document. The forest must pass `validate` (a peer would refuse it otherwise)."""
    try:
        validate(forest)
    except RemoteProtocolError as exc:
        raise LocalProtocolError("tree", f"refusing to send an invalid forest: {exc.detail}") from None
    return {"features": list(forest.features), **{k: wire.encode_array(getattr(forest, k)) for k in _ARRAYS}}


_WIRE_SCHEMA = wire.v_map({
    "features": wire.v_list(wire.v_str(FEATURE_NAME_BYTES_MAX), FEATURES_MAX),
    "tree_offsets": wire.v_array(TREES_MAX + 1, frozenset({"<i8"})),
    **{k: wire.v_array(WIRE_NODES_MAX, frozenset({_ARRAYS[k].str})) for k in _NODE_ARRAYS},
})


def from_wire(doc: Any, where: str = "forest") -> Forest:
    """A validated Forest from an untrusted document; RemoteProtocolError for anything else."""
    raw = _WIRE_SCHEMA(doc, where)
    forest = Forest(features=tuple(raw.pop("features")), **raw)
    validate(forest)
    return forest


def save(path: Path, forest: Forest, **arrays: np.ndarray) -> None:
    """One .npz file (atomically replaced): the forest's arrays, its features as a JSON string,
    and the caller's `arrays` (plain dtypes: object arrays are refused, nothing is pickled)."""
    clash = set(arrays) & ({"features"} | set(_ARRAYS))
    if clash:
        raise ValueError(f"array names {sorted(clash)} are reserved")
    validate(forest, trees_max=2**62, nodes_per_tree_max=2**62, depth_max=2**62, features_max=2**62)
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, features=np.array(json.dumps(list(forest.features))),
             **{k: getattr(forest, k) for k in _ARRAYS}, **{k: np.asarray(v) for k, v in arrays.items()})
    atomic_write(Path(path), buffer.getvalue())


def load(path: Path) -> tuple[Forest, dict[str, np.ndarray]]:
    """The forest and the extra arrays written by `save`. DataError if the file is not one."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            stored = {k: npz[k] for k in npz.files}
        features = json.loads(str(stored.pop("features")[()]))
        if not isinstance(features, list):
            raise TypeError("features is not a list")
        forest = Forest(features=tuple(features), **{k: stored.pop(k) for k in _ARRAYS})
        validate(forest, trees_max=2**62, nodes_per_tree_max=2**62, depth_max=2**62, features_max=2**62)
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError, zipfile.BadZipFile,
            RemoteProtocolError) as exc:
        raise DataError(f"{path}: not a valid stored forest: {exc}") from None
    return forest, stored

