"""Scoring a decision-tree forest (`Forest`, trees.py) on a site's rows: P(positive) of every tree
on every row, as BOFRF needs it (docs/algorithms.md: every site scores every tree on its own rows).

Rules of this module
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
* The evaluator caches what it builds per Forest object (weakly; a Forest's arrays are read-only
  views, so the cache cannot go stale), so scoring the same forest on several row sets builds once.
* Pure: no I/O, no logging, no global state but that cache.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fedpeer.ml.forest.trees import Forest, _forest, _validate

__all__ = ["evaluator", "predict_trees"]

THREADS_MAX = 8
PAIRS_PER_TASK = 1 << 18           # (tree, row) pairs per evaluation task: bounds memory, feeds threads
SMALL_WORK_PAIRS = 1 << 14         # below this, threads cost more than they save
SORT_ROWS_MIN = 256                # sorting rows for branch prediction pays from about here
SORT_TREES_MIN = 8


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
