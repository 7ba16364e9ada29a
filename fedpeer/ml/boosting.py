"""Federated XGBoost by tree bagging, coordinated by a leader (ALGORITHMS.md §2), and the
federated evaluation counts of §3 — pure functions: no networking, no clock, no logging, no
global random state (seeds are arguments), no mutation of the caller's arrays.

One round r (FLeXGBoost, seeds/002): the leader holds the global model G_r (canonical model JSON,
below). Every site i calls `train_local_round(G_r, X_i, y_i, params, n, eta_i, seed)`: xgboost
continues from G_r on the site's rows for n boosting rounds (n = `num_local_round`; 1 is
"bare-bone", n > 1 is "tree+") with learning rate eta_i = `normalized_eta(...)`, and only the new
trees leave the site, as a *trees document*. The leader checks every document with
`validate_trees` and builds G_{r+1} = `append_round(G_r, [docs in member order], ...)`, whose bytes
every member can rebuild and compare (`model_sha256`). Only plain `xgboost.train` / `Booster` and
xgboost's JSON model format are used; nothing depends on xgboost's federated plugin or collective.

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

Global model (what `append_round` returns): an xgboost JSON model that
`xgboost.Booster().load_model(bytearray(model))` loads, written from a fixed template — schema
of xgboost 3.x, `"version": [3, 2, 0]` (the release it is tested with), no `cats` block (3.2 loads
models without it) — never by serialising a Booster. Trees are the members' trees in order,
ids 0..T-1, tree_info t % K, iteration_indptr [0, K, 2K, .., T] (one iteration = one local
boosting round of one member, so `iteration_range` slices in those units), num_parallel_tree 1,
boost_from_average "0" (so a warm start never re-estimates the intercept), attribute
"fedpeer_format". base_score: binary:logistic writes the prior probability as a scalar string
(the form xgboost 2.x wrote; 3.2 reads it); multi:softprob writes a vector of K margins
"[m0,m1,..]": xgboost 3.2 keeps one intercept per class, in margin space (checked: a model with
base_score [a,b,c] predicts margins a,b,c before any tree). Tested with xgboost 3.2 only; a
release with a scalar multi-class intercept would not load the multi-class model.

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

Federated evaluation (§3): `score_histograms`, `auc_from_histograms`, `logloss_sums`,
`accuracy_counts` return non-negative integer counts (or a float sum with an integer count), so
sites can secure-sum them: counts with `fixedpoint.encode_counts`, the log-loss sum with
`FixedPoint.encode` (its per-row loss is at most -log(LOGLOSS_EPS) ≈ 34.5).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, RemoteProtocolError

__all__ = [
    "TREES_FORMAT", "MODEL_FORMAT", "MODEL_VERSION", "OBJECTIVES", "TreesError", "TreeBatch", "ModelInfo",
    "global_base_score", "normalized_eta", "train_local_round", "validate_trees", "trees_gain", "append_round",
    "check_model_policy",
    "model_sha256", "model_info", "load_booster", "predict_proba",
    "score_histograms", "auc_from_histograms", "logloss_sums", "accuracy_counts",
]

TREES_FORMAT = "fedpeer-xgb-trees/1"
MODEL_FORMAT = "fedpeer-xgb-model/1"
MODEL_VERSION = (3, 2, 0)
OBJECTIVES = ("binary:logistic", "multi:softprob")
PRIOR_MIN = 1e-6              # class priors are clipped to [PRIOR_MIN, 1 - PRIOR_MIN] (log and logit stay finite)
LOGLOSS_EPS = 1e-15           # probabilities are clipped to [eps, 1 - eps] before the log
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
_ALLOWED_PARAMS = {                                # the only values tree bagging accepts
    "booster": ("gbtree",),                        # dart rescales old trees, gblinear has none
    "num_parallel_tree": (1, "1"),                 # one tree per class and round: the indexing below
    "multi_strategy": ("one_output_per_tree",),    # vector leaves are not carried
    "process_type": ("default",),                  # "update" would rewrite the global trees
}


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
# Objectives, base score, learning rate
# ---------------------------------------------------------------------------------------------

def _groups(objective: str, num_class: int) -> int:
    """Output groups K: 1 for binary:logistic (num_class 0 or 1), num_class for multi:softprob."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if isinstance(num_class, bool) or not isinstance(num_class, (int, np.integer)):
        raise ValueError(f"num_class must be an integer, got {num_class!r}")
    if objective == "binary:logistic":
        if num_class not in (0, 1):
            raise ValueError(f"binary:logistic has one output: num_class must be 0 or 1, got {num_class}")
        return 1
    if not 2 <= num_class <= CLASSES_MAX:
        raise ValueError(f"multi:softprob needs num_class in [2, {CLASSES_MAX}], got {num_class}")
    return int(num_class)


def _base_vector(base_score: Any, objective: str, groups: int) -> np.ndarray:
    """base_score as float32 values: (1,) probability in (0, 1) for binary, (K,) margins for multi."""
    values = np.atleast_1d(np.asarray(base_score, dtype=np.float64))
    if values.ndim != 1 or len(values) != groups:
        raise ValueError(f"base_score must hold {groups} value(s) for {objective}, got {base_score!r}")
    values = _f32(values)
    if not np.isfinite(values).all():
        raise ValueError(f"base_score must be finite (as float32), got {base_score!r}")
    if objective == "binary:logistic" and not 0.0 < values[0] < 1.0:
        raise ValueError(f"binary:logistic needs a base_score (prior probability) in (0, 1), got {values[0]}")
    return values


def _base_string(base: np.ndarray, objective: str) -> str:
    if objective == "binary:logistic":
        return repr(float(base[0]))
    return "[" + ",".join(repr(float(v)) for v in base) + "]"


def global_base_score(pos_count: Any, total_count: int, objective: str, num_class: int = 0) -> Any:
    """The federation's intercept from its label counts (secure-summed by the caller).

    binary:logistic: pos_count = number of positive rows; returns the prior probability
      pos/total (clipped to [PRIOR_MIN, 1 - PRIOR_MIN]) as a float32 value — what xgboost itself
      estimates on pooled data (the label mean).
    multi:softprob: pos_count = the K per-class row counts (summing to total_count); returns K
      margins log p_k - mean_j log p_j (p clipped below at PRIOR_MIN), as float32 values — the
      intercept xgboost 3.x estimates on pooled data; softmax of it is the class prior.
    The leader computes it once and it travels inside every model it builds (so members never
    depend on their own libm's last bit)."""
    groups = _groups(objective, num_class)
    if isinstance(total_count, bool) or not isinstance(total_count, (int, np.integer)) or total_count <= 0:
        raise ValueError(f"total_count must be a positive integer, got {total_count!r}")
    counts = np.atleast_1d(np.asarray(pos_count))
    if counts.dtype.kind not in "iu" or counts.ndim != 1:
        raise ValueError(f"pos_count must be integer count(s), got {pos_count!r}")
    counts = counts.astype(np.int64)
    if (counts < 0).any() or (counts > total_count).any():
        raise ValueError(f"counts must be in [0, total_count={total_count}], got {counts.tolist()}")
    if groups == 1:
        if len(counts) != 1:
            raise ValueError("binary:logistic takes one positive count")
        prior = min(max(int(counts[0]) / int(total_count), PRIOR_MIN), 1.0 - PRIOR_MIN)
        return float(_f32(prior)[()])
    if len(counts) != groups or int(counts.sum()) != int(total_count):
        raise ValueError(f"multi:softprob takes {groups} class counts summing to total_count={total_count}, "
                         f"got {counts.tolist()}")
    logp = np.log(np.maximum(counts / float(total_count), PRIOR_MIN))
    return tuple(float(v) for v in _f32(logp - logp.mean()))


def normalized_eta(eta: float, my_rows: int, total_rows: int, mode: str = "none", my_gain: float | None = None,
                   total_gain: float | None = None) -> float:
    """A site's learning rate (FLeXGBoost's normalised learning rate).

    "none": eta. "samples": eta * my_rows / total_rows, so the N sites' trees of one round add up
    to one step of size eta (with n local rounds: n steps). "gain": eta * my_gain / total_gain,
    with a site's gain = the summed split gains of its trees (`trees_gain`). A site's gain is only
    known once its trees exist; a workable protocol uses the gains of round r-1 for round r (the
    leader sees every member's trees) and "samples" in round 1. Gains are reported by the members
    themselves: a member can inflate its own weight that way, sample counts it can inflate too."""
    eta = float(eta)
    if not math.isfinite(eta) or eta <= 0:
        raise ValueError(f"eta must be a positive finite number, got {eta!r}")
    if mode == "none":
        return eta
    if mode == "samples":
        for name, v in (("my_rows", my_rows), ("total_rows", total_rows)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if not 0 < my_rows <= total_rows:
            raise ValueError(f"need 0 < my_rows <= total_rows, got {my_rows} and {total_rows}")
        return eta * int(my_rows) / int(total_rows)
    if mode == "gain":
        if my_gain is None or total_gain is None:
            raise ValueError("mode 'gain' needs my_gain and total_gain")
        my_gain, total_gain = float(my_gain), float(total_gain)
        if not (math.isfinite(my_gain) and math.isfinite(total_gain)) or my_gain < 0 or total_gain <= 0:
            raise ValueError(f"need finite gains with my_gain >= 0 < total_gain, got {my_gain} and {total_gain}")
        return eta * min(my_gain / total_gain, 1.0)   # the secure sum's rounding may put my_gain a hair above
    raise ValueError(f"mode must be 'none', 'samples' or 'gain', got {mode!r}")


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


# ---------------------------------------------------------------------------------------------
# Global model
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ModelInfo:
    """What a canonical global model holds."""

    objective: str
    num_class: int            # 0 for binary:logistic (xgboost's convention), K for multi:softprob
    num_feature: int
    base_score: tuple[float, ...]   # (prior,) for binary; K margins for multi
    trees: tuple[_Tree, ...]

    @property
    def groups(self) -> int:
        return max(1, self.num_class)

    @property
    def n_trees(self) -> int:
        return len(self.trees)


def _objective_json(objective: str, groups: int) -> dict:
    if objective == "binary:logistic":
        return {"name": objective, "reg_loss_param": {"scale_pos_weight": "1"}}
    return {"name": objective, "softmax_multiclass_param": {"num_class": str(groups)}}


def _model_bytes(trees: Sequence[_Tree], base: np.ndarray, num_feature: int, groups: int, objective: str) -> bytes:
    n = len(trees)
    assert n % groups == 0
    model = {
        "learner": {
            "attributes": {"fedpeer_format": MODEL_FORMAT},
            "feature_names": [],
            "feature_types": [],
            "gradient_booster": {
                "model": {
                    "gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(n)},
                    "iteration_indptr": list(range(0, n + 1, groups)),
                    "tree_info": [t % groups for t in range(n)],
                    "trees": [tree.xgboost(i, num_feature) for i, tree in enumerate(trees)],
                },
                "name": "gbtree",
            },
            "learner_model_param": {"base_score": _base_string(base, objective), "boost_from_average": "0",
                                    "num_class": str(groups if objective == "multi:softprob" else 0),
                                    "num_feature": str(num_feature), "num_target": "1"},
            "objective": _objective_json(objective, groups),
        },
        "version": list(MODEL_VERSION),
    }
    return _dumps(model)


def _get(obj: Any, path: Sequence[str], kind: type) -> Any:
    where = "model"
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            raise TreesError("xgb_model", f"{where} lacks {key!r}")
        obj, where = obj[key], f"{where}.{key}"
    if not isinstance(obj, kind) or isinstance(obj, bool):
        raise TreesError("xgb_model", f"{where} must be a {kind.__name__}")
    return obj


_MODEL_CACHE: OrderedDict[bytes, ModelInfo] = OrderedDict()
_MODEL_CACHE_SIZE = 4
_MODEL_CACHE_LOCK = threading.Lock()


def _read_model(model: Any) -> ModelInfo:
    """A canonical global model (bytes) -> ModelInfo; TreesError("xgb_model", ...) for anything else.
    A model from the leader is untrusted too: it passes the same tree checks as a member's trees.
    The last few results are kept by SHA-256 of the bytes (a round reads the same model several
    times: every simulated site, then append_round); ModelInfo and its arrays are immutable."""
    if not isinstance(model, (bytes, bytearray, memoryview)):
        raise TreesError("xgb_model", f"global model must be bytes, got {type(model).__name__}")
    digest = hashlib.sha256(model).digest()
    with _MODEL_CACHE_LOCK:
        info = _MODEL_CACHE.get(digest)
        if info is not None:
            _MODEL_CACHE.move_to_end(digest)
            return info
    info = _read_model_uncached(bytes(model))
    with _MODEL_CACHE_LOCK:
        _MODEL_CACHE[digest] = info
        while len(_MODEL_CACHE) > _MODEL_CACHE_SIZE:
            _MODEL_CACHE.popitem(last=False)
    return info


def _read_model_uncached(model: bytes) -> ModelInfo:
    raw = _loads(model, "xgb_model", "global model", MODEL_BYTES_MAX)
    learner = ("learner",)
    param = learner + ("learner_model_param",)
    objective = _get(raw, learner + ("objective", "name"), str)
    if objective not in OBJECTIVES:
        raise TreesError("xgb_model", f"objective {objective!r} is not one of {OBJECTIVES}")
    try:
        num_class = int(_get(raw, param + ("num_class",), str))
        num_feature = int(_get(raw, param + ("num_feature",), str))
        base_text = _get(raw, param + ("base_score",), str)
        base_values = [float(v) for v in base_text.strip("[]").split(",")]
    except ValueError as exc:
        raise TreesError("xgb_model", f"unreadable model parameter: {exc}") from None
    if not 1 <= num_feature <= FEATURES_MAX:
        raise TreesError("xgb_model", f"num_feature {num_feature} out of range [1, {FEATURES_MAX}]")
    try:
        groups = _groups(objective, num_class)
        base = _base_vector(base_values, objective, groups)
    except ValueError as exc:
        raise TreesError("xgb_model", str(exc)) from None
    items = _get(raw, learner + ("gradient_booster", "model", "trees"), list)
    if len(items) > TREES_MAX or len(items) % groups:
        raise TreesError("xgb_model", f"{len(items)} trees: must be a multiple of {groups}, at most {TREES_MAX}")
    trees = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TreesError("xgb_model", f"tree {i} must be an object")
        trees.append(_parse_tree({k: item.get(k) for k in _TREE_KEYS}, f"tree {i}", "xgb_model",
                                 num_feature=num_feature, nodes_max=NODES_PER_TREE_MAX, depth_max=DEPTH_MAX,
                                 leaf_abs_max=math.inf))
    expected = _model_bytes(trees, base, num_feature, groups, objective)
    if bytes(model) != expected:
        _require_canonical(bytes(model), json.loads(expected), "xgb_model",
                           "global model (not one append_round built)")
    return ModelInfo(objective=objective, num_class=num_class if objective == "multi:softprob" else 0,
                     num_feature=num_feature, base_score=tuple(float(v) for v in base), trees=tuple(trees))


def model_info(model: bytes) -> ModelInfo:
    """Objective, classes, features, base score and trees of a canonical global model (checked)."""
    return _read_model(model)


def check_model_policy(model: bytes, *, max_depth: int, max_nodes: int, leaf_abs_max: float, trees_max: int,
                       trees_multiple: int = 1) -> ModelInfo:
    """A global model from a peer against a job's policy; TreesError("xgb_model", ...) naming the
    tree and the rule, else its ModelInfo.

    `model_info` checks only what holds for every model (structure, canonical bytes, finite
    values); a model sent by a leader must also hold only trees a member's `validate_trees` would
    have accepted: depth <= max_depth, at most max_nodes nodes, |leaf value| <= leaf_abs_max, and
    at most trees_max trees, a multiple of trees_multiple (one member's trees of one round). A
    leader is one member: its word is no better than any other member's (issue 11)."""
    info = _read_model(model)
    leaf_abs_max = float(leaf_abs_max)
    if not leaf_abs_max > 0:
        raise ValueError(f"leaf_abs_max must be positive, got {leaf_abs_max}")
    if info.n_trees > trees_max or info.n_trees % max(1, trees_multiple):
        raise TreesError("xgb_model", f"{info.n_trees} trees: the job allows at most {trees_max}, "
                                      f"in whole rounds of {trees_multiple}")
    for i, tree in enumerate(info.trees):
        if tree.depth > max_depth:
            raise TreesError("xgb_model", f"tree {i}: depth {tree.depth} exceeds max_depth {max_depth}")
        if tree.n_nodes > max_nodes:
            raise TreesError("xgb_model", f"tree {i}: {tree.n_nodes} nodes exceed {max_nodes}")
        leaves = tree.left < 0
        if leaves.any() and float(np.abs(tree.value[leaves]).max()) > leaf_abs_max:
            worst = float(np.abs(tree.value[leaves]).max())
            raise TreesError("xgb_model", f"tree {i}: |leaf value| {worst!r} exceeds leaf_abs_max {leaf_abs_max!r}")
    return info


def append_round(global_model: bytes | None, trees_from_members: Sequence[Any], base_score: Any, num_feature: int,
                 num_class: int, objective: str) -> bytes:
    """The next global model: the trees of `global_model` (None: none yet), then every member's
    trees document in the given order. Deterministic: the same arguments give the same bytes,
    on any machine. Predictions of the result are base_score plus the sum of the parts.

    The documents must already have passed `validate_trees` against the round's policy; here they
    are checked again for structure only (so nothing malformed can reach a model). With a global
    model, objective, num_class, num_feature and base_score must agree with it."""
    groups = _groups(objective, num_class)
    if isinstance(num_feature, bool) or not isinstance(num_feature, (int, np.integer)) \
            or not 1 <= num_feature <= FEATURES_MAX:
        raise ValueError(f"num_feature must be an integer in [1, {FEATURES_MAX}], got {num_feature!r}")
    base = _base_vector(base_score, objective, groups)
    trees: list[_Tree] = []
    if global_model is not None:
        info = _read_model(global_model)
        if (info.objective, info.groups, info.num_feature) != (objective, groups, num_feature):
            raise ValueError(f"the global model is {info.objective} with {info.groups} group(s) and "
                             f"{info.num_feature} features, not {objective} with {groups} and {num_feature}")
        if not np.array_equal(np.array(info.base_score), base):
            raise ValueError(f"base_score {base.tolist()} differs from the global model's {list(info.base_score)}")
        trees.extend(info.trees)
    for m, doc in enumerate(trees_from_members):
        try:
            batch = _parse_trees(doc, num_feature=int(num_feature), groups=groups, expected=None, trees_max=TREES_MAX,
                                 nodes_max=NODES_PER_TREE_MAX, depth_max=DEPTH_MAX, leaf_abs_max=math.inf)
        except TreesError as exc:
            raise TreesError(exc.reason, f"member {m}: {exc.detail}") from None
        trees.extend(batch.trees)
    if len(trees) > TREES_MAX:
        raise ValueError(f"the model would hold {len(trees)} trees, more than {TREES_MAX}")
    return _model_bytes(trees, base, int(num_feature), groups, objective)


def model_sha256(model_bytes: bytes) -> str:
    """Hex SHA-256 of a model's bytes: what members compare to know they hold the same model."""
    return hashlib.sha256(bytes(model_bytes)).hexdigest()


def load_booster(model: bytes) -> Any:
    """An xgboost Booster of a canonical global model (checked first: xgboost is never handed
    bytes that did not pass `_read_model`)."""
    import xgboost as xgb

    _read_model(model)
    booster = xgb.Booster()
    booster.load_model(bytearray(model))
    return booster


def predict_proba(model: bytes, X: Any, nthread: int | None = None) -> np.ndarray:
    """Probabilities of a global model: (rows,) P(positive) for binary, (rows, K) for multi-class."""
    import xgboost as xgb

    X = _features(X, _read_model(model).num_feature)
    booster = load_booster(model)
    if nthread is not None:
        booster.set_param("nthread", int(nthread))
    return booster.predict(xgb.DMatrix(X, nthread=_nthread(nthread)))


def _nthread(value: Any) -> int:
    """xgboost's thread count for a DMatrix: the params' nthread, else all (-1). One thread is much
    faster for small data on some machines (OpenMP start-up costs milliseconds per call)."""
    return -1 if value is None or int(value) <= 0 else int(value)


# ---------------------------------------------------------------------------------------------
# A site's round
# ---------------------------------------------------------------------------------------------

def _features(X: Any, num_feature: int | None = None) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2 or X.dtype.kind not in "biuf" or X.shape[0] == 0:
        raise DataError(f"X must be a non-empty numeric (rows, features) array, got {X.dtype} {X.shape}")
    if num_feature is not None and X.shape[1] != num_feature:
        raise DataError(f"X has {X.shape[1]} features, the model {num_feature}")
    return X


def _labels(y: Any, rows: int, groups: int) -> np.ndarray:
    y = np.asarray(y)
    if y.shape != (rows,):
        raise DataError(f"y must have shape ({rows},), got {y.shape}")
    if y.dtype.kind == "f":
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            raise DataError("y must hold integer class labels")
    elif y.dtype.kind not in "biu":
        raise DataError(f"y must hold integer class labels, got {y.dtype}")
    y = y.astype(np.int64)
    top = 1 if groups == 1 else groups - 1
    if len(y) and (y.min() < 0 or y.max() > top):
        raise DataError(f"labels must be in [0, {top}], got range [{y.min()}, {y.max()}]")
    return y


def _site_params(params: Mapping[str, Any], objective: str, groups: int, eta_i: float, seed: int,
                 warm: bool) -> dict:
    out = dict(params)
    if out.get("objective", objective) != objective:
        raise ValueError(f"params objective {out.get('objective')!r} differs from the model's {objective!r}")
    out["objective"] = objective
    if objective == "multi:softprob":
        if int(out.get("num_class", groups)) != groups:
            raise ValueError(f"params num_class {out.get('num_class')} differs from the model's {groups}")
        out["num_class"] = groups
    elif int(out.get("num_class", 0)) not in (0, 1):
        raise ValueError("binary:logistic takes no num_class")
    for key, allowed in _ALLOWED_PARAMS.items():
        if key in out and out[key] not in allowed:
            raise ValueError(f"params {key}={out[key]!r} is not supported by tree bagging (allowed: {allowed})")
    updater = str(out.get("updater", ""))
    if "refresh" in updater or "sync" in updater:
        raise ValueError(f"params updater={updater!r} would modify existing trees")
    if out.get("enable_categorical"):
        raise ValueError("categorical splits are not carried by the trees document")
    for alias in ("eta", "learning_rate", "seed", "random_state"):
        out.pop(alias, None)
    out["eta"] = float(eta_i)
    out["seed"] = int(seed)
    if warm:
        out.pop("base_score", None)      # xgboost would let it override the global model's intercept
    elif "base_score" not in out:
        raise ValueError("without a global model, params must hold the federation's base_score "
                         "(global_base_score); otherwise every site boosts from its own label mean")
    else:
        out["base_score"] = [float(v) for v in _base_vector(out["base_score"], objective, groups)]
        if groups == 1:
            out["base_score"] = out["base_score"][0]
    return out


def _canonical_tree(raw: Mapping[str, Any], where: str) -> _Tree:
    """A tree as xgboost wrote it (trusted: our own training) -> canonical _Tree: reachable nodes
    renumbered breadth-first (drops nodes xgboost's pruner deleted), floats rounded to float32
    (exact: xgboost printed float32 values), zeros at leaves."""
    if any(raw.get("split_type", [])) or raw.get("categories"):
        raise ValueError(f"{where}: categorical splits are not supported")
    if int(raw["tree_param"].get("size_leaf_vector", "1")) > 1:
        raise ValueError(f"{where}: vector leaves are not supported")
    left_in, right_in = raw["left_children"], raw["right_children"]
    order = [0]
    new_left, new_right = [], []
    for old in order:                                     # grows as we go: breadth-first
        if left_in[old] == -1:
            new_left.append(-1)
            new_right.append(-1)
        else:
            new_left.append(len(order))
            new_right.append(len(order) + 1)
            order.extend((left_in[old], right_in[old]))
    idx = np.array(order, dtype=np.int64)
    left = np.array(new_left, dtype=np.int64)
    leaf = left == -1
    pick = lambda key, dtype: np.asarray(raw[key], dtype=dtype)[idx]   # noqa: E731
    depth = np.zeros(len(idx), dtype=np.int64)
    for i in np.flatnonzero(~leaf).tolist():
        depth[left[i]] = depth[left[i] + 1] = depth[i] + 1
    return _Tree(left=left, right=np.array(new_right, dtype=np.int64),
                 feature=np.where(leaf, 0, pick("split_indices", np.int64)),
                 value=_f32(pick("split_conditions", np.float64)),
                 default_left=np.where(leaf, 0, pick("default_left", np.int64)),
                 gain=np.where(leaf, 0.0, _f32(pick("loss_changes", np.float64))),
                 cover=_f32(pick("sum_hessian", np.float64)), depth=int(depth.max()))


def train_local_round(global_model: bytes | None, X: Any, y: Any, params: Mapping[str, Any], num_local_round: int,
                      eta_i: float, seed: int) -> bytes:
    """A site's part of one round: continue the global model on (X, y) for `num_local_round`
    boosting rounds with learning rate eta_i and return only the new trees, as a canonical trees
    document (module docstring) of num_local_round * K trees.

    `params` are xgboost training parameters (objective binary:logistic or multi:softprob with
    num_class; max_depth, lambda, tree_method, ...). eta/learning_rate and seed/random_state are
    replaced by eta_i and seed. With a global model its intercept is kept (a base_score in params
    is dropped); without one (round 1), params must hold the federation's base_score
    (`global_base_score`). Refused: booster other than gbtree, num_parallel_tree != 1, vector
    leaves, process_type "update", categorical features — all would break tree bagging."""
    import xgboost as xgb

    if isinstance(num_local_round, bool) or not isinstance(num_local_round, (int, np.integer)) \
            or not 1 <= num_local_round <= 100_000:
        raise ValueError(f"num_local_round must be a positive integer, got {num_local_round!r}")
    eta_i = float(eta_i)
    if not math.isfinite(eta_i) or eta_i <= 0:
        raise ValueError(f"eta_i must be a positive finite number, got {eta_i!r}")
    if global_model is not None:
        info = _read_model(global_model)
        objective, groups = info.objective, info.groups
        X = _features(X, info.num_feature)
        base = np.array(info.base_score)
        old = info.trees
    else:
        objective = params.get("objective", "binary:logistic")
        groups = _groups(objective, int(params.get("num_class", 0)))
        X = _features(X)
        base = None
        old = ()
    y = _labels(y, X.shape[0], groups)
    train_params = _site_params(params, objective, groups, eta_i, seed, warm=global_model is not None)
    if base is None:
        base = _base_vector(train_params["base_score"], objective, groups)
    dtrain = xgb.DMatrix(X, label=y, nthread=_nthread(train_params.get("nthread")))
    start = None if global_model is None else bytearray(global_model)   # checked by _read_model above
    booster = xgb.train(train_params, dtrain, num_boost_round=int(num_local_round), xgb_model=start,
                        verbose_eval=False)
    # Only the last old iteration (for the invariant check) and the new ones leave xgboost.
    first = max(len(old) // groups - 1, 0)
    learner = json.loads(bytes(booster[first:].save_raw("json")))["learner"]
    items = learner["gradient_booster"]["model"]["trees"]
    kept_old = len(items) - num_local_round * groups
    assert kept_old == (groups if old else 0), \
        f"xgboost made {len(items) - kept_old} trees, not {num_local_round * groups}"
    assert learner["gradient_booster"]["model"]["tree_info"] == [t % groups for t in range(len(items))]
    kept = _f32([float(v) for v in learner["learner_model_param"]["base_score"].strip("[]").split(",")])
    assert np.array_equal(kept, base), f"xgboost did not keep the federation's intercept: {kept} != {base}"
    assert all(_canonical_tree(items[i], "old").same_as(t) for i, t in enumerate(old[len(old) - kept_old:])), \
        "xgboost changed the trees of the global model"
    trees = [_canonical_tree(t, f"new tree {i}") for i, t in enumerate(items[kept_old:])]
    doc = _trees_doc(trees, groups)
    # What we send must pass the leader's structural gate; fail here, with the reason, if not.
    _parse_trees(doc, num_feature=X.shape[1], groups=groups, expected=len(trees), trees_max=len(trees),
                 nodes_max=NODES_PER_TREE_MAX, depth_max=DEPTH_MAX, leaf_abs_max=math.inf)
    return doc


# ---------------------------------------------------------------------------------------------
# Federated evaluation (ALGORITHMS.md §3): additive counts
# ---------------------------------------------------------------------------------------------

def _proba(y: Any, proba: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """(labels int64 (rows,), proba float64 (rows,) or (rows, K), K) with checks."""
    p = np.asarray(proba, dtype=np.float64)
    if p.ndim == 1:
        groups = 1
    elif p.ndim == 2 and p.shape[1] >= 2:
        groups = p.shape[1]
    else:
        raise ValueError(f"proba must be (rows,) for binary or (rows, K>=2), got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError("probabilities must be finite and in [0, 1]")
    y_arr = np.asarray(y)
    if y_arr.shape != (p.shape[0],) or y_arr.dtype.kind not in "biu":
        raise ValueError(f"y must be integer labels of shape ({p.shape[0]},), got {y_arr.dtype} {y_arr.shape}")
    labels = y_arr.astype(np.int64)
    top = 1 if groups == 1 else groups - 1
    if len(labels) and (labels.min() < 0 or labels.max() > top):
        raise ValueError(f"labels must be in [0, {top}]")
    return labels, p, groups


def _bins(p: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum(np.floor(p * bins).astype(np.int64), bins - 1)


def score_histograms(y: Any, proba: Any, bins: int = 1000) -> np.ndarray:
    """Counts of predicted scores per bin, negatives and positives apart — additive over sites.

    Binary (proba (rows,) = P(positive)): int64 (2, bins); row 0 counts negatives, row 1
    positives; bin b holds scores in [b/bins, (b+1)/bins) (1.0 in the last bin).
    Multi-class (proba (rows, K)): one-vs-rest, int64 (K, 2, bins): entry k is the binary
    histogram of P(class k) with class k as the positive. Secure-sum with
    `encode_counts(h.ravel(), n_parties, count_max=rows)`."""
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= 1 << 24:
        raise ValueError(f"bins must be an integer in [1, 2^24], got {bins!r}")
    labels, p, groups = _proba(y, proba)
    if groups == 1:
        return _binary_histogram(labels, p, bins)
    return np.stack([_binary_histogram((labels == k).astype(np.int64), p[:, k], bins) for k in range(groups)])


def _binary_histogram(labels: np.ndarray, p: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(labels * bins + _bins(p, bins), minlength=2 * bins).reshape(2, bins).astype(np.int64)


def auc_from_histograms(hist: Any) -> Any:
    """AUC from (summed) score histograms: exact up to ties inside a bin, which count 1/2 (as
    ties do in the AUC). (2, bins) -> float; (K, 2, bins) -> float64 (K,) one-vs-rest AUCs (their
    mean is scikit-learn's macro "ovr" AUC). NaN where a class has no positives or no negatives.
    Integer arithmetic throughout, one correctly rounded division at the end."""
    h = np.asarray(hist)
    if h.dtype.kind not in "iu" or h.ndim not in (2, 3) or h.shape[-2] != 2 or h.shape[-1] < 1:
        raise ValueError(f"hist must be integer counts of shape (2, bins) or (K, 2, bins), got {h.dtype} {h.shape}")
    if (h < 0).any():
        raise ValueError("hist holds negative counts")
    if h.ndim == 3:
        return np.array([_auc(h[k]) for k in range(h.shape[0])])
    return _auc(h)


def _auc(h: np.ndarray) -> float:
    neg, pos = [int(v) for v in h[0]], [int(v) for v in h[1]]
    n_neg, n_pos = sum(neg), sum(pos)
    if n_neg == 0 or n_pos == 0:
        return math.nan
    below, twice = 0, 0
    for n_b, p_b in zip(neg, pos):
        twice += p_b * (2 * below + n_b)        # pairs with the negative lower: 1, in the same bin: 1/2
        below += n_b
    return twice / (2 * n_pos * n_neg)


def logloss_sums(y: Any, proba: Any, eps: float = LOGLOSS_EPS) -> tuple[float, int]:
    """(Σ -log p(true class), rows) — additive; mean log-loss = Σ sums / Σ rows. Probabilities
    are clipped to [eps, 1 - eps] first."""
    labels, p, groups = _proba(y, proba)
    if groups == 1:
        p_true = np.where(labels == 1, p, 1.0 - p)
    else:
        p_true = p[np.arange(len(labels)), labels]
    return float(-np.log(np.clip(p_true, eps, 1.0 - eps)).sum()), int(len(labels))


def accuracy_counts(y: Any, proba: Any) -> tuple[int, int]:
    """(correct, rows) — additive. Binary predicts positive iff P > 0.5 (XGBClassifier's rule);
    multi-class predicts the argmax (the lowest class on a tie)."""
    labels, p, groups = _proba(y, proba)
    predicted = (p > 0.5).astype(np.int64) if groups == 1 else np.argmax(p, axis=1)
    return int((predicted == labels).sum()), int(len(labels))
