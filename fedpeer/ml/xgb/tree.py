"""One xgboost tree as validated arrays, and the *trees document* a site sends in tree bagging
(docs/algorithms.md) — pure functions: no networking, no clock, no logging, no global random state.

Trees document (what a site sends; bytes, canonical JSON as below):
    {"format": "fedpeer-xgb-trees/1",
     "tree_info": [group of each tree],
     "trees": [{"default_left", "left_children", "loss_changes", "right_children",
                "split_conditions", "split_indices", "sum_hessian"}, ...]}
  n*K trees, K = output groups (1 for binary:logistic, num_class for multi:softprob), in
  xgboost's order: boosting round major, class minor — tree t belongs to class t % K, so
  `tree_info` must be exactly [0, 1, .., K-1, 0, 1, ..]. The per-node arrays keep xgboost's own
  names and meanings (a row goes left iff x[split_indices] < split_conditions, a missing value
  goes left iff default_left; at a leaf split_conditions is the leaf value, learning rate already
  applied; loss_changes = split gain, sum_hessian = cover, used by feature importance and SHAP).
  Nodes are numbered breadth-first from the root: the k-th internal node (by index) has children
  2k+1 and 2k+2, so every tree has exactly one encoding. At a leaf, children are -1 and
  split_indices, default_left, loss_changes are 0. Not carried: xgboost's `base_weights`
  (internal nodes' unshrunk weights; the model writes the leaf value at leaves and 0 at internal
  nodes — predictions and SHAP values, exact and approximate, stay identical, see the tests),
  `parents` and ids (recomputed: xgboost trusts `parents` and can crash on bad ones), categorical
  splits (refused), vector leaves (refused).

Canonical JSON (both documents): `json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=True, allow_nan=False)`; every float is a float32 value (xgboost's precision),
written as Python's repr of that exact value (shortest round-trip of the float64, the same on
every IEEE platform, parsed back by xgboost to the same float32); integers as integers. Same
inputs therefore give byte-identical models on every member, and the readers here accept only
documents whose bytes equal the canonical encoding of what they parsed.

Peers' trees are data, not code: nothing reaches xgboost before the checks here (structure,
ranges, finiteness, canonical bytes) have passed. A malformed document raises `TreesError`,
which is both a RemoteProtocolError (reason "xgb_trees" or "xgb_model", counted like any bad
message) and a ValueError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeer.errors import RemoteProtocolError

__all__ = [
    "CLASSES_MAX",
    "DEPTH_MAX",
    "FEATURES_MAX",
    "MODEL_OBJECTIVES",
    "NODES_PER_TREE_MAX",
    "OBJECTIVES",
    "TREES_FORMAT",
    "TREES_MAX",
    "TreeBatch",
    "TreesError",
    "trees_gain",
    "validate_trees",
]

TREES_FORMAT = "fedpeer-xgb-trees/1"
OBJECTIVES = ("binary:logistic", "multi:softprob")          # the classification objectives
MODEL_OBJECTIVES = OBJECTIVES + ("reg:squarederror",)       # what a model may hold (both modes train each)
CLASSES_MAX = 1000

# Bounds that hold whatever a caller's policy says (the global model is checked with these only).
TREES_MAX = 1_000_000
NODES_PER_TREE_MAX = 1 << 20
DEPTH_MAX = 64
FEATURES_MAX = 1_000_000
MODEL_BYTES_MAX = 1 << 31
_NODE_BYTES_MAX = 160         # generous: 7 numbers of <= 24 characters each, with separators
_TREE_BYTES_MAX = 256
_ROOT_PARENT = 2147483647     # xgboost's "no parent"
_TREE_KEYS = ("default_left", "left_children", "loss_changes", "right_children", "split_conditions",
              "split_indices", "sum_hessian")


class TreesError(RemoteProtocolError, ValueError):
    """A trees document or a global model is malformed. `reason` is "xgb_trees" or "xgb_model"."""


# ---------------------------------------------------------------------------------------------
# Canonical JSON and float32 values
# ---------------------------------------------------------------------------------------------

def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _f32(values: Any) -> np.ndarray:
    """float64 array holding the float32 roundings of `values` (the values xgboost holds)."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float64).astype(np.float32).astype(np.float64)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _loads(data: Any, reason: str, what: str, max_bytes: int) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TreesError(reason, f"{what} must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise TreesError(reason, f"{what} is {len(data)} bytes, more than the {max_bytes} allowed")
    try:
        return json.loads(data.decode("ascii"), parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TreesError(reason, f"{what} is not valid JSON: {exc}") from None


def _require_canonical(data: bytes, obj: Any, reason: str, what: str) -> None:
    canonical = _dumps(obj)
    if bytes(data) != canonical:
        at = next((i for i, (a, b) in enumerate(zip(bytes(data), canonical)) if a != b),
                  min(len(data), len(canonical)))
        raise TreesError(reason, f"{what} is not in canonical encoding (first difference at byte {at}: "
                                 f"{bytes(data)[at:at + 24]!r} instead of {canonical[at:at + 24]!r})")


# ---------------------------------------------------------------------------------------------
# One tree: the validated arrays
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Tree:
    left: np.ndarray          # int64 (n,), -1 at a leaf
    right: np.ndarray         # int64 (n,)
    feature: np.ndarray       # int64 (n,), 0 at a leaf
    value: np.ndarray         # float64 holding float32 values: threshold, or leaf value
    default_left: np.ndarray  # int64 (n,) 0/1, 0 at a leaf
    gain: np.ndarray          # float64 (float32 values) >= 0, 0 at a leaf
    cover: np.ndarray         # float64 (float32 values) >= 0
    depth: int
    # (tree id, num_feature) -> canonical JSON of `xgboost(...)`: a growing model writes its old
    # trees again every round (`xgboost_json`)
    _json: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("left", "right", "feature", "value", "default_left", "gain", "cover"):
            getattr(self, name).flags.writeable = False     # shared through the model cache

    @property
    def n_nodes(self) -> int:
        return len(self.left)

    def wire(self) -> dict:
        return {"default_left": self.default_left.tolist(), "left_children": self.left.tolist(),
                "loss_changes": self.gain.tolist(), "right_children": self.right.tolist(),
                "split_conditions": self.value.tolist(), "split_indices": self.feature.tolist(),
                "sum_hessian": self.cover.tolist()}

    def xgboost(self, tree_id: int, num_feature: int) -> dict:
        n = self.n_nodes
        leaf = self.left < 0
        parents = np.full(n, _ROOT_PARENT, dtype=np.int64)
        internal = np.flatnonzero(~leaf)
        parents[self.left[internal]] = internal
        parents[self.right[internal]] = internal
        return {"base_weights": np.where(leaf, self.value, 0.0).tolist(), "categories": [],
                "categories_nodes": [], "categories_segments": [], "categories_sizes": [],
                "default_left": self.default_left.tolist(), "id": tree_id, "left_children": self.left.tolist(),
                "loss_changes": self.gain.tolist(), "parents": parents.tolist(),
                "right_children": self.right.tolist(), "split_conditions": self.value.tolist(),
                "split_indices": self.feature.tolist(), "split_type": [0] * n, "sum_hessian": self.cover.tolist(),
                "tree_param": {"num_deleted": "0", "num_feature": str(num_feature), "num_nodes": str(n),
                               "size_leaf_vector": "1"}}

    def xgboost_json(self, tree_id: int, num_feature: int) -> bytes:
        """`_dumps(self.xgboost(tree_id, num_feature))`, computed once: the tree's arrays never
        change, and a model of R rounds would otherwise encode its first trees R times."""
        key = (tree_id, num_feature)
        out = self._json.get(key)
        if out is None:
            out = self._json[key] = _dumps(self.xgboost(tree_id, num_feature))
        return out

    def same_as(self, other: _Tree) -> bool:
        return all(np.array_equal(getattr(self, k), getattr(other, k))
                   for k in ("left", "right", "feature", "value", "default_left", "gain", "cover"))


def _int_list(value: Any, n: int | None, where: str, reason: str) -> np.ndarray:
    if not isinstance(value, list) or (n is not None and len(value) != n):
        raise TreesError(reason, f"{where} must be a list of {n if n is not None else 'some'} integers")
    if not all(type(v) is int for v in value):
        raise TreesError(reason, f"{where} must hold integers only")
    try:
        return np.array(value, dtype=np.int64)
    except OverflowError:
        raise TreesError(reason, f"{where} holds an integer outside int64") from None


def _float_list(value: Any, n: int, where: str, reason: str) -> np.ndarray:
    if not isinstance(value, list) or len(value) != n:
        raise TreesError(reason, f"{where} must be a list of {n} numbers")
    if not all(type(v) is float for v in value):
        raise TreesError(reason, f"{where} must hold floats only (written with a '.' or an exponent)")
    array = np.array(value, dtype=np.float64)
    bad = ~np.isfinite(array)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TreesError(reason, f"{where}[{i}] is not finite ({array[i]})")
    not32 = _f32(array) != array
    if not32.any():
        i = int(np.flatnonzero(not32)[0])
        raise TreesError(reason, f"{where}[{i}] = {array[i]!r} is not a float32 value")
    return array


def _parse_tree(raw: Any, where: str, reason: str, *, num_feature: int, nodes_max: int, depth_max: int,
                leaf_abs_max: float) -> _Tree:
    """One untrusted tree (wire dict) -> _Tree, or TreesError naming tree, node and rule."""
    if not isinstance(raw, dict):
        raise TreesError(reason, f"{where} must be a JSON object")
    if set(raw) != set(_TREE_KEYS):
        extra, missing = sorted(set(raw) - set(_TREE_KEYS)), sorted(set(_TREE_KEYS) - set(raw))
        raise TreesError(reason, f"{where} has unexpected keys {extra[:5]} / lacks keys {missing}")
    left_raw = raw["left_children"]
    if not isinstance(left_raw, list) or not 1 <= len(left_raw) <= nodes_max:
        raise TreesError(reason, f"{where}: left_children must be a list of 1 to {nodes_max} node entries")
    n = len(left_raw)
    left = _int_list(left_raw, n, f"{where}.left_children", reason)
    right = _int_list(raw["right_children"], n, f"{where}.right_children", reason)
    feature = _int_list(raw["split_indices"], n, f"{where}.split_indices", reason)
    default_left = _int_list(raw["default_left"], n, f"{where}.default_left", reason)
    value = _float_list(raw["split_conditions"], n, f"{where}.split_conditions", reason)
    gain = _float_list(raw["loss_changes"], n, f"{where}.loss_changes", reason)
    cover = _float_list(raw["sum_hessian"], n, f"{where}.sum_hessian", reason)

    leaf = left == -1
    one_child = leaf != (right == -1)
    if one_child.any():
        i = int(np.flatnonzero(one_child)[0])
        raise TreesError(reason, f"{where} node {i}: exactly one child is -1 (left {left[i]}, right {right[i]})")
    internal = np.flatnonzero(~leaf)
    for child, side in ((left, "left"), (right, "right")):
        c = child[internal]
        out = (c < 1) | (c >= n)
        if out.any():
            i = int(internal[np.flatnonzero(out)[0]])
            raise TreesError(reason, f"{where} node {i}: {side} child {child[i]} out of range [1, {n})")
        back = c <= internal
        if back.any():
            i = int(internal[np.flatnonzero(back)[0]])
            raise TreesError(reason, f"{where} node {i}: {side} child {child[i]} is not after its parent "
                                     "(a cycle or a shared node)")
    k = np.arange(len(internal), dtype=np.int64)
    wrong = (left[internal] != 2 * k + 1) | (right[internal] != 2 * k + 2)
    if wrong.any():
        j = int(np.flatnonzero(wrong)[0])
        i = int(internal[j])
        raise TreesError(reason, f"{where} node {i}: children ({left[i]}, {right[i]}) are not the canonical "
                                 f"breadth-first ({2 * j + 1}, {2 * j + 2}) (a shared node, an unreachable node "
                                 "or another numbering)")
    if n != 2 * len(internal) + 1:
        raise TreesError(reason, f"{where}: {n} nodes with {len(internal)} splits; a binary tree has "
                                 f"{2 * len(internal) + 1} (unreachable nodes)")
    depth = np.zeros(n, dtype=np.int64)
    for i in internal.tolist():                   # children come after parents: one forward pass
        d = depth[i] + 1
        depth[left[i]] = d
        depth[right[i]] = d
    tree_depth = int(depth.max())
    if tree_depth > depth_max:
        raise TreesError(reason, f"{where}: depth {tree_depth} exceeds max_depth {depth_max}")

    f_in = feature[internal]
    bad = (f_in < 0) | (f_in >= num_feature)
    if bad.any():
        i = int(internal[np.flatnonzero(bad)[0]])
        raise TreesError(reason, f"{where} node {i}: split feature {feature[i]} out of range [0, {num_feature})")
    bad = ~np.isin(default_left, (0, 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TreesError(reason, f"{where} node {i}: default_left must be 0 or 1, got {default_left[i]}")
    leaves = np.flatnonzero(leaf)
    for array, name in ((feature, "split_indices"), (default_left, "default_left"), (gain, "loss_changes")):
        bad = array[leaves] != 0
        if bad.any():
            i = int(leaves[np.flatnonzero(bad)[0]])
            raise TreesError(reason, f"{where} leaf {i}: {name} must be 0 at a leaf, got {array[i]}")
    big = np.abs(value[leaves]) > leaf_abs_max
    if big.any():
        i = int(leaves[np.flatnonzero(big)[0]])
        raise TreesError(reason, f"{where} leaf {i}: |value| {abs(value[i])!r} exceeds leaf_abs_max {leaf_abs_max!r}")
    for array, name in ((gain, "loss_changes"), (cover, "sum_hessian")):
        neg = array < 0
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise TreesError(reason, f"{where} node {i}: {name} {array[i]!r} is negative")
    return _Tree(left=left, right=right, feature=feature, value=value, default_left=default_left, gain=gain,
                 cover=cover, depth=tree_depth)



# ---------------------------------------------------------------------------------------------
# Objectives
# ---------------------------------------------------------------------------------------------

def _groups(objective: str, num_class: int) -> int:
    """Output groups K: 1 for binary:logistic and reg:squarederror (num_class 0 or 1), num_class
    for multi:softprob."""
    if objective not in MODEL_OBJECTIVES:
        raise ValueError(f"objective must be one of {MODEL_OBJECTIVES}, got {objective!r}")
    if isinstance(num_class, bool) or not isinstance(num_class, (int, np.integer)):
        raise ValueError(f"num_class must be an integer, got {num_class!r}")
    if objective != "multi:softprob":
        if num_class not in (0, 1):
            raise ValueError(f"{objective} has one output: num_class must be 0 or 1, got {num_class}")
        return 1
    if not 2 <= num_class <= CLASSES_MAX:
        raise ValueError(f"multi:softprob needs num_class in [2, {CLASSES_MAX}], got {num_class}")
    return int(num_class)



# ---------------------------------------------------------------------------------------------
# Trees documents
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class TreeBatch:
    """A parsed, validated trees document."""

    trees: tuple[_Tree, ...]
    groups: int

    @property
    def n_trees(self) -> int:
        return len(self.trees)

    @property
    def num_local_round(self) -> int:
        return len(self.trees) // self.groups

    @property
    def gain(self) -> float:
        """Summed split gain of all trees (the "gain" normalisation of `normalized_eta`)."""
        return float(sum(t.gain.sum() for t in self.trees))

    @property
    def max_depth(self) -> int:
        return max((t.depth for t in self.trees), default=0)


def _trees_doc(trees: Sequence[_Tree], groups: int) -> bytes:
    return _dumps({"format": TREES_FORMAT, "tree_info": [t % groups for t in range(len(trees))],
                   "trees": [t.wire() for t in trees]})


def _parse_trees(doc: Any, *, num_feature: int, groups: int, expected: int | None, trees_max: int,
                 nodes_max: int, depth_max: int, leaf_abs_max: float) -> TreeBatch:
    reason = "xgb_trees"
    limit = 256 + trees_max * (_TREE_BYTES_MAX + nodes_max * _NODE_BYTES_MAX)
    raw = _loads(doc, reason, "trees document", limit)
    if not isinstance(raw, dict) or set(raw) != {"format", "tree_info", "trees"}:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise TreesError(reason, f"trees document must be an object with keys format, tree_info, trees; got {keys}")
    if raw["format"] != TREES_FORMAT:
        raise TreesError(reason, f"format must be {TREES_FORMAT!r}, got {raw['format']!r}")
    items = raw["trees"]
    if not isinstance(items, list):
        raise TreesError(reason, "trees must be a list")
    if expected is not None and len(items) != expected:
        raise TreesError(reason, f"expected exactly {expected} trees (num_local_round x {groups} classes), "
                                 f"got {len(items)}")
    if len(items) > trees_max or len(items) % groups:
        raise TreesError(reason, f"got {len(items)} trees: must be a multiple of {groups} classes, at most {trees_max}")
    info = _int_list(raw["tree_info"], len(items), "tree_info", reason)
    want = np.arange(len(items)) % groups
    if not np.array_equal(info, want):
        i = int(np.flatnonzero(info != want)[0])
        raise TreesError(reason, f"tree_info[{i}] = {info[i]}: tree {i} must belong to class {want[i]} "
                                 f"(round major, class minor, {groups} classes)")
    trees = tuple(_parse_tree(t, f"tree {i}", reason, num_feature=num_feature, nodes_max=nodes_max,
                              depth_max=depth_max, leaf_abs_max=leaf_abs_max) for i, t in enumerate(items))
    _require_canonical(bytes(doc), raw, reason, "trees document")
    return TreeBatch(trees=trees, groups=groups)


def validate_trees(trees_doc: Any, *, num_feature: int, num_class: int, num_local_round: int, max_depth: int,
                   max_nodes: int, leaf_abs_max: float, objective: str | None = None) -> TreeBatch:
    """Check a member's trees document (bytes) against the round's policy; TreesError (a
    ValueError) with tree, node and rule named, else the parsed batch.

    Checked: size before parsing, strict JSON (no NaN/Infinity, no duplicate keys), exact keys,
    format tag, exactly num_local_round * K trees (K = num_class for multi-class, 1 for binary:
    num_class 0 or 1 — `objective` may be given to make that explicit), tree_info = class of
    each tree, per tree: 1..max_nodes nodes, children in range and after their parent, canonical
    breadth-first numbering (so: a tree, no cycles, no shared or unreachable nodes), depth <=
    max_depth, split features in [0, num_feature), integers and float32-exact finite floats,
    |leaf value| <= leaf_abs_max, gain and cover >= 0, zeros where a leaf has no split, and the
    bytes equal to the canonical encoding.

    A hard leaf bound comes from the training parameters: with `max_delta_step` d > 0 xgboost
    clips every leaf weight to [-d, d] before the learning rate, so |leaf| <= eta_i * d and
    leaf_abs_max = eta * d is safe for every member. Without it, binary:logistic leaves stay
    below eta_i * (max |g| / min h per leaf) — no fixed bound: pick one with room (e.g. 10 * eta)."""
    if objective is None:
        objective = "multi:softprob" if num_class >= 2 else "binary:logistic"
    groups = _groups(objective, num_class)
    for name, v, hi in (("num_feature", num_feature, FEATURES_MAX), ("num_local_round", num_local_round, 100_000),
                        ("max_depth", max_depth, DEPTH_MAX), ("max_nodes", max_nodes, NODES_PER_TREE_MAX)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= hi:
            raise ValueError(f"{name} must be an integer in [1, {hi}], got {v!r}")
    leaf_abs_max = float(leaf_abs_max)
    if not leaf_abs_max > 0:
        raise ValueError(f"leaf_abs_max must be positive, got {leaf_abs_max}")
    expected = int(num_local_round) * groups
    return _parse_trees(trees_doc, num_feature=int(num_feature), groups=groups, expected=expected,
                        trees_max=expected, nodes_max=int(max_nodes), depth_max=int(max_depth),
                        leaf_abs_max=leaf_abs_max)


def trees_gain(trees_doc: bytes, *, num_feature: int, num_class: int) -> float:
    """Summed split gain of a (structurally valid) trees document; for normalized_eta(mode="gain")."""
    objective = "multi:softprob" if num_class >= 2 else "binary:logistic"
    return _parse_trees(trees_doc, num_feature=num_feature, groups=_groups(objective, num_class), expected=None,
                        trees_max=TREES_MAX, nodes_max=NODES_PER_TREE_MAX, depth_max=DEPTH_MAX,
                        leaf_abs_max=math.inf).gain
