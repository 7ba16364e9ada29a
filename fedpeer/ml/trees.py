"""Decision-tree forests as plain arrays: built from scikit-learn, checked, sent, scored.

BOFRF (ALGORITHMS.md §1) sends every site's trees to every other site, and every site scores
every tree on its own rows. A tree from a peer is data, not code (DESIGN §5): it travels and is
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
* Scoring semantics are scikit-learn's exactly: X is rounded to float32 (as `predict_proba`
  does) and compared with the float64 threshold, so `predict_trees` equals each estimator's
  `predict_proba(X)[:, positive_index]` bit for bit — the tests check it. Columns are matched by
  name, in any order. A tree that splits anywhere on a feature the scoring site lacks abstains:
  its whole output row is NaN (ALGORITHMS §1 step 2). X must not hold NaN (fedpeer's data never
  does; scikit-learn would route NaN by a per-node rule this format does not carry).
* Two evaluators, identical results. The fast one rebuilds scikit-learn's compiled `Tree`
  objects from the validated arrays (plain arrays through `Tree.__setstate__`, no pickle) and
  calls `Tree.apply` from a thread pool: the Cython traversal releases the GIL and takes a
  few ns per node step, ~5x less than a step of numpy gathers. Rows are first sorted by the
  leaves they reach in two of the trees, so that neighbouring rows take the same branches and
  the CPU predicts them (~20 % less time). `Tree` is a private scikit-learn API: its node layout
  is read from a live `Tree` at run time, a canary tree is checked once per process, and if
  anything differs the pure-numpy evaluator takes over (level-synchronous over all (tree, row)
  pairs, dropping finished pairs at every level). The compiled traversal does no bounds
  checks, so it only ever sees arrays that passed the structural checks of `validate` (run
  again, once per Forest object, before the first build), and an X holding exactly the columns
  the trees use.
* A Forest's arrays are read-only views; the evaluator caches what it builds per Forest object
  (weakly), so scoring the same forest on several row sets builds once.
* Pure: no I/O except `save`/`load`, no logging, no global state but that cache.
"""

from __future__ import annotations

import io
import json
import os
import threading
import weakref
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import wire
from ..errors import DataError, LocalProtocolError, RemoteProtocolError
from ..store import atomic_write

__all__ = ["Forest", "concat", "evaluator", "from_sklearn", "from_wire", "load", "predict_trees", "save", "take",
           "to_wire", "validate"]

TREES_MAX = 10_000
NODES_PER_TREE_MAX = 1_000_000
DEPTH_MAX = 64
FEATURES_MAX = 100_000
FEATURE_NAME_BYTES_MAX = 1024
WIRE_NODES_MAX = 1 << 24           # a 64 MiB frame holds ~2.4 M nodes (28 bytes each): far below
THREADS_MAX = 8
PAIRS_PER_TASK = 1 << 18           # (tree, row) pairs per evaluation task: bounds memory, feeds threads
SMALL_WORK_PAIRS = 1 << 14         # below this, threads cost more than they save
SORT_ROWS_MIN = 256                # sorting rows for branch prediction pays from about here
SORT_TREES_MIN = 8

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


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def predict_trees(forest: Forest, X: Any, features: Sequence[str], *, engine: str = "auto",
                  threads: int | None = None) -> np.ndarray:
    """P(positive) of every tree on every row: float64 (T, rows); NaN rows for abstaining trees.

    `features` names the columns of X (any order, a superset or a subset of forest.features).
    engine: "auto" (scikit-learn's compiled traversal, else numpy), "sklearn" or "numpy"."""
    X = np.asarray(X)
    features = tuple(features)
    if X.ndim != 2 or X.shape[1] != len(features) or X.dtype.kind not in "biuf":
        raise ValueError(f"X must be a numeric (rows, {len(features)}) array, got {X.dtype} {X.shape}")
    if len(set(features)) != len(features):
        raise ValueError("duplicate column names")
    if X.dtype.kind == "f" and np.isnan(X).any():
        raise ValueError("X holds NaN")
    if engine not in ("auto", "sklearn", "numpy"):
        raise ValueError(f"unknown engine {engine!r}")
    plan = _plan(forest)
    out = np.full((forest.n_trees, X.shape[0]), np.nan)
    where = {name: i for i, name in enumerate(features)}
    have = np.array([name in where for name in forest.features], dtype=bool)
    evaluated = np.flatnonzero(~_abstains(plan, have))
    if not len(evaluated) or not X.shape[0]:
        return out
    # One float32 C-contiguous copy holding only the used columns (missing ones stay 0: every tree
    # reading them abstains), rounded exactly as scikit-learn rounds X.
    Xc = np.zeros((X.shape[0], max(len(plan.used), 1)), dtype=np.float32)
    present = np.flatnonzero(have[plan.used])
    with np.errstate(over="ignore"):        # beyond float32: +-inf, as in scikit-learn's own cast
        Xc[:, present] = X[:, [where[forest.features[plan.used[j]]] for j in present]]
    run = _run_numpy
    if engine != "numpy":
        built = plan.sklearn_trees()
        if built is not None:
            run = _run_sklearn
        elif engine == "sklearn":
            raise RuntimeError(f"scikit-learn's Tree cannot be rebuilt here: {plan.sklearn_error}")
    order = None
    if run is _run_sklearn and X.shape[0] >= SORT_ROWS_MIN and len(evaluated) >= SORT_TREES_MIN:
        order = _row_order(plan, Xc, evaluated)
        Xc = Xc[order]
    tasks = _tasks(plan, evaluated, X.shape[0])
    workers = min(threads or _cpus(), THREADS_MAX, len(tasks))
    if workers <= 1 or len(evaluated) * X.shape[0] < SMALL_WORK_PAIRS:
        for task in tasks:
            run(plan, Xc, task, out, order)
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="trees") as pool:
            list(pool.map(lambda task: run(plan, Xc, task, out, order), tasks))
    return out


def evaluator() -> str:
    """The engine "auto" uses in this process: "sklearn" or "numpy"."""
    return "sklearn" if _node_dtype() is not None else "numpy"


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _abstains(plan: _Plan, have: np.ndarray) -> np.ndarray:
    """(T,) bool: the trees that split on a feature missing from `have` (ALGORITHMS §1 step 2)."""
    missing = plan.internal_nodes[~have[plan.internal_feature]]
    flags = np.zeros(plan.n_trees, dtype=bool)
    flags[plan.tree_of_node[missing]] = True
    return flags


def _tasks(plan: _Plan, trees: np.ndarray, rows: int) -> list[tuple[np.ndarray, int, int]]:
    """(trees, first row, end row) blocks of about PAIRS_PER_TASK pairs."""
    row_block = max(1, min(rows, PAIRS_PER_TASK))
    per_task = max(1, PAIRS_PER_TASK // row_block)
    return [(trees[i:i + per_task], r, min(rows, r + row_block))
            for i in range(0, len(trees), per_task) for r in range(0, rows, row_block)]


class _Plan:
    """What the evaluators derive from one validated Forest, built lazily and kept (weakly) per Forest."""

    def __init__(self, forest: Forest) -> None:
        unlimited = 2**62   # structure only: the policy limits belong to from_wire, not to our own trees
        self.depth = _validate(forest, unlimited, unlimited, unlimited, unlimited)
        self.forest_ref = weakref.ref(forest)
        self.n_trees = forest.n_trees
        self.offsets = forest.tree_offsets
        sizes = np.diff(self.offsets)
        self.tree_of_node = np.repeat(np.arange(self.n_trees), sizes)
        internal = forest.left >= 0
        self.internal_nodes = np.flatnonzero(internal)
        self.internal_feature = forest.feature[internal]
        self.used = np.unique(self.internal_feature)             # forest feature index of each Xc column
        compact = np.zeros(len(forest.features) + 1, dtype=np.int32)
        compact[self.used] = np.arange(len(self.used), dtype=np.int32)
        self.compact_feature = np.where(internal, compact[forest.feature], 0).astype(np.int32)
        self.value = forest.value
        self.root_value = forest.value[self.offsets[:-1]]
        self.stump = sizes == 1
        self._lock = threading.Lock()
        self._sklearn: list | None = None
        self.sklearn_error = ""
        self._numpy: tuple | None = None

    def sklearn_trees(self) -> list | None:
        with self._lock:
            if self._sklearn is None and not self.sklearn_error:
                forest = self.forest_ref()
                assert forest is not None, "a plan outlived its forest"
                try:
                    self._sklearn = _build_sklearn(forest, self)
                except (ImportError, TypeError, ValueError, AttributeError, KeyError) as exc:
                    self.sklearn_error = f"{type(exc).__name__}: {exc}"
            return self._sklearn

    def numpy_tables(self) -> tuple:
        with self._lock:
            if self._numpy is None:
                forest = self.forest_ref()
                assert forest is not None, "a plan outlived its forest"
                self._numpy = _numpy_tables(forest, self)
            return self._numpy


_PLANS: weakref.WeakKeyDictionary[Forest, _Plan] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def _plan(forest: Forest) -> _Plan:
    with _PLANS_LOCK:
        plan = _PLANS.get(forest)
    if plan is None:
        plan = _Plan(forest)                 # outside the lock: validation of a big forest takes a while
        with _PLANS_LOCK:
            plan = _PLANS.setdefault(forest, plan)
    return plan


# scikit-learn's compiled trees ----------------------------------------------------------------

_KNOWN_NODE_FIELDS = frozenset({"left_child", "right_child", "feature", "threshold", "impurity",
                                "n_node_samples", "weighted_n_node_samples", "missing_go_to_left"})
_NEEDED_NODE_FIELDS = frozenset({"left_child", "right_child", "feature", "threshold"})
_node_dtype_cache: list = []


def _node_dtype() -> np.dtype | None:
    """scikit-learn's Node layout, if its Tree can be rebuilt from arrays and passes a canary; else None."""
    if not _node_dtype_cache:
        try:
            dtype = _probe_node_dtype()
        except (ImportError, TypeError, ValueError, AttributeError, KeyError):
            dtype = None
        _node_dtype_cache.append(dtype)
    return _node_dtype_cache[0]


def _probe_node_dtype() -> np.dtype | None:
    from sklearn.tree._tree import Tree

    dtype = Tree(1, np.array([2], dtype=np.intp), 1).__getstate__()["nodes"].dtype
    names = frozenset(dtype.names or ())
    if not _NEEDED_NODE_FIELDS <= names <= _KNOWN_NODE_FIELDS:
        return None
    # Canary: x0 <= 0.5 ? (x1 <= -1.0 ? leaf 2 : leaf 3) : leaf 4, with an x0 exactly on the threshold.
    left = np.array([1, 2, -1, -1, -1], dtype=np.int32)
    right = np.array([4, 3, -1, -1, -1], dtype=np.int32)
    canary = _forest(("a", "b"), [0, 5], left, right, [0, 1, -1, -1, -1], [0.5, -1.0, 0, 0, 0],
                     [0.5, 0.5, 0.0, 0.25, 1.0])
    tree = _build_sklearn_with(canary, _Plan(canary), dtype)[0]
    X = np.array([[0.5, -1.0], [0.5, -0.5], [0.50001, -9.0], [-3.0, 7.0]], dtype=np.float32)
    return dtype if tree.apply(X).tolist() == [2, 3, 4, 3] else None


def _build_sklearn(forest: Forest, plan: _Plan) -> list | None:
    dtype = _node_dtype()
    if dtype is None:
        raise ValueError("scikit-learn's Tree layout is not the one this module knows")
    return _build_sklearn_with(forest, plan, dtype)


def _build_sklearn_with(forest: Forest, plan: _Plan, dtype: np.dtype) -> list:
    """One sklearn Tree per non-stump tree (None for stumps), from plain arrays: __setstate__ copies
    them into the Tree's own memory; nothing is unpickled."""
    from sklearn.tree._tree import Tree

    nodes = np.zeros(forest.n_nodes, dtype=dtype)
    leaf = forest.left < 0
    nodes["left_child"] = forest.left
    nodes["right_child"] = forest.right
    nodes["feature"] = np.where(leaf, -2, plan.compact_feature)    # -2: sklearn's "undefined"
    nodes["threshold"] = np.where(leaf, -2.0, forest.threshold)
    for name, fill in (("n_node_samples", 1), ("weighted_n_node_samples", 1.0)):
        if name in dtype.names:
            nodes[name] = fill
    values = np.ascontiguousarray(np.stack([1.0 - forest.value, forest.value], axis=1).reshape(-1, 1, 2))
    classes = np.array([2], dtype=np.intp)
    trees: list = []
    for t in range(forest.n_trees):
        a, b = int(forest.tree_offsets[t]), int(forest.tree_offsets[t + 1])
        if plan.stump[t]:
            trees.append(None)
            continue
        tree = Tree(max(len(plan.used), 1), classes, 1)
        tree.__setstate__({"max_depth": int(plan.depth[t]), "node_count": b - a, "nodes": nodes[a:b],
                           "values": values[a:b]})
        trees.append(tree)
    return trees


def _row_order(plan: _Plan, Xc: np.ndarray, evaluated: np.ndarray) -> np.ndarray:
    """Rows sorted by the leaves they reach in two of the trees. Neighbouring rows then tend to
    take the same branches in the other trees too, and the CPU predicts those branches: about
    20 % less time per tree for the price of two trees (bench_trees.py)."""
    built = plan.sklearn_trees()
    probes = [t for t in (evaluated[0], evaluated[len(evaluated) // 2]) if not plan.stump[t]]
    if not probes:
        return np.arange(len(Xc))
    return np.lexsort([built[t].apply(Xc) for t in reversed(probes)])


def _run_sklearn(plan: _Plan, Xc: np.ndarray, task: tuple[np.ndarray, int, int], out: np.ndarray,
                 order: np.ndarray | None) -> None:
    trees, r0, r1 = task
    built = plan.sklearn_trees()
    rows = Xc[r0:r1]
    cols = slice(r0, r1) if order is None else order[r0:r1]     # Xc's rows are X's rows in this order
    for t in trees:
        if plan.stump[t]:
            out[t, cols] = plan.root_value[t]
        else:
            out[t, cols] = plan.value[plan.offsets[t]:plan.offsets[t + 1]][built[t].apply(rows)]


# numpy fallback --------------------------------------------------------------------------------

def _numpy_tables(forest: Forest, plan: _Plan) -> tuple:
    """Per node: compact feature (int32), float32 threshold, and a child table (2 entries per
    node, global indices) in which a leaf j is written ~j (negative), so finished walks are found
    by a sign test instead of another gather; a leaf's own entries are ~itself (a stump's root).

    float32 x <= float64 t  <=>  x <= (largest float32 <= t): rounding the threshold down keeps
    scikit-learn's comparison exact while all arithmetic stays in float32."""
    n = forest.n_nodes
    index_dtype = np.int32 if 2 * n < 2**31 else np.int64
    base = np.repeat(forest.tree_offsets[:-1], np.diff(forest.tree_offsets))
    leaf = forest.left < 0
    me = np.arange(n, dtype=np.int64)
    code = np.where(leaf, ~me, me)
    child = np.empty((n, 2), dtype=index_dtype)
    child[:, 0] = np.where(leaf, ~me, code[np.where(leaf, me, base + forest.left)])
    child[:, 1] = np.where(leaf, ~me, code[np.where(leaf, me, base + forest.right)])
    with np.errstate(over="ignore"):
        thr = forest.threshold.astype(np.float32)
    above = thr.astype(np.float64) > forest.threshold
    thr[above] = np.nextafter(thr[above], np.float32(-np.inf))
    return plan.compact_feature, thr, child.reshape(-1), index_dtype


def _run_numpy(plan: _Plan, Xc: np.ndarray, task: tuple[np.ndarray, int, int], out: np.ndarray,
               order: np.ndarray | None) -> None:
    """Level-synchronous walk of all (tree, row) pairs of the task, dropping finished pairs at
    every level (about 1.3x faster than checking a leaf flag and compacting now and then)."""
    feature, thr, child, index_dtype = plan.numpy_tables()
    trees, r0, r1 = task
    rows, width = r1 - r0, Xc.shape[1]
    flat = Xc[r0:r1].reshape(-1)
    offset_dtype = np.int32 if rows * width < 2**31 and len(trees) * rows < 2**31 else np.int64
    node = np.repeat(plan.offsets[trees].astype(index_dtype), rows)
    row_base = np.tile(np.arange(rows, dtype=offset_dtype) * width, len(trees))
    slot = np.arange(len(node), dtype=offset_dtype)
    result = np.empty(len(node))
    while len(node):
        right = flat[row_base + feature[node]] > thr[node]
        node = child[node * 2 + right]
        done = node < 0
        if done.any():
            finished = np.flatnonzero(done)
            result[slot[finished]] = plan.value[~node[finished]]
            going = np.flatnonzero(~done)
            node, row_base, slot = node[going], row_base[going], slot[going]
    out[trees, r0:r1] = result.reshape(len(trees), rows)
