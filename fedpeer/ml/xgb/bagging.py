"""Federated XGBoost by tree bagging, coordinated by a leader (docs/algorithms.md, FLeXGBoost
tree+, the FLeXGBoost tree+ paper) — a site's part of one round; pure functions: no networking, no clock, no
logging, no global random state (seeds are arguments), no mutation of the caller's arrays.

One round r (FLeXGBoost, the FLeXGBoost tree+ paper): the leader holds the global model G_r (canonical model JSON,
below). Every site i calls `train_local_round(G_r, X_i, y_i, params, n, eta_i, seed)`: xgboost
continues from G_r on the site's rows for n boosting rounds (n = `num_local_round`; 1 is
"bare-bone", n > 1 is "tree+") with learning rate eta_i = `normalized_eta(...)`, and only the new
trees leave the site, as a *trees document*. The leader checks every document with
`validate_trees` and builds G_{r+1} = `append_round(G_r, [docs in member order], ...)`, whose bytes
every member can rebuild and compare (`model_sha256`). Only plain `xgboost.train` / `Booster` and
xgboost's JSON model format are used; nothing depends on xgboost's federated plugin or collective.

The trees document is described in fedpeer.ml.xgb.tree, the global model in fedpeer.ml.xgb.model.

A site that trains every round passes its `RoundCache` (fedpeer.ml.xgb.margins: its rows and the
global model's margins on them, kept between rounds) to `train_local_round`: the same bytes, at
the cost of the round's new trees instead of the whole model's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.ml.xgb.margins import RoundCache
from fedpeer.ml.xgb.model import _base_vector, _features, _nthread, _read_model, xgb_threads
from fedpeer.ml.xgb.tree import (
    DEPTH_MAX,
    MODEL_OBJECTIVES,
    NODES_PER_TREE_MAX,
    _f32,
    _groups,
    _parse_trees,
    _Tree,
    _trees_doc,
)

__all__ = ["RoundCache", "check_label_counts", "normalized_eta", "train_local_round"]

_ALLOWED_PARAMS = {                                # the only values tree bagging accepts
    "booster": ("gbtree",),                        # dart rescales old trees, gblinear has none
    "num_parallel_tree": (1, "1"),                 # one tree per class and round: the indexing below
    "multi_strategy": ("one_output_per_tree",),    # vector leaves are not carried
    "process_type": ("default",),                  # "update" would rewrite the global trees
}


def check_label_counts(counts: np.ndarray, groups: int, rows_max: int) -> int:
    """ValueError unless summed label counts can be honest: binary [positives, rows] with
    0 <= positives <= rows; multi-class one count per class, none negative; the rows between 1
    and `rows_max` (the members' declared counts' bound, summed). Returns the rows."""
    counts = np.asarray(counts, dtype=np.int64)
    if groups == 1:
        positives, rows = int(counts[0]), int(counts[1])
        if not 0 <= positives <= rows:
            raise ValueError("the positives are between 0 and the rows")
    else:
        rows = sum(int(c) for c in counts)        # Python ints: a poisoned sum cannot wrap
        if (counts < 0).any():
            raise ValueError("every class count is non-negative")
    if not 1 <= rows <= rows_max:
        raise ValueError("the rows are between 1 and the members' declared maximum")
    return rows


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




def _labels(y: Any, rows: int, groups: int, objective: str) -> np.ndarray:
    y = np.asarray(y)
    if y.shape != (rows,):
        raise DataError(f"y must have shape ({rows},), got {y.shape}")
    if objective == "reg:squarederror":
        if y.dtype.kind not in "biuf" or not np.isfinite(y.astype(np.float64)).all():
            raise DataError("reg:squarederror needs finite numeric labels")
        return y.astype(np.float64)
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
        raise ValueError(f"{objective} takes no num_class")
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
    pick = lambda key, dtype: np.asarray(raw[key], dtype=dtype)[idx]
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
                      eta_i: float, seed: int, cache: RoundCache | None = None) -> bytes:
    """A site's part of one round: continue the global model on (X, y) for `num_local_round`
    boosting rounds with learning rate eta_i and return only the new trees, as a canonical trees
    document (module docstring) of num_local_round * K trees.

    `params` are xgboost training parameters (objective binary:logistic, multi:softprob with
    num_class, or reg:squarederror; max_depth, lambda, tree_method, ...). eta/learning_rate and seed/random_state are
    replaced by eta_i and seed. With a global model its intercept is kept (a base_score in params
    is dropped); without one (round 1), params must hold the federation's base_score
    (`global_base_score`). Refused: booster other than gbtree, num_parallel_tree != 1, vector
    leaves, process_type "update", categorical features — all would break tree bagging.
    `cache`: the site's RoundCache (fedpeer.ml.xgb.margins), the same bytes faster."""
    import xgboost as xgb

    if isinstance(num_local_round, bool) or not isinstance(num_local_round, (int, np.integer)) \
            or not 1 <= num_local_round <= 100_000:
        raise ValueError(f"num_local_round must be a positive integer, got {num_local_round!r}")
    eta_i = float(eta_i)
    if not math.isfinite(eta_i) or eta_i <= 0:
        raise ValueError(f"eta_i must be a positive finite number, got {eta_i!r}")
    info = None if global_model is None else _read_model(global_model)
    objective = params.get("objective", "binary:logistic") if info is None else info.objective
    if objective not in MODEL_OBJECTIVES:
        raise ValueError(f"tree bagging trains {MODEL_OBJECTIVES}, not {objective!r}")
    rows = (X, y)
    if info is not None:
        groups = info.groups
        X = _features(X, info.num_feature)
        base = np.array(info.base_score)
        old = info.trees
    else:
        groups = _groups(objective, int(params.get("num_class", 0)))
        X = _features(X)
        base = None
        old = ()
    y = _labels(y, X.shape[0], groups, objective)
    train_params = _site_params(params, objective, groups, eta_i, seed, warm=global_model is not None)
    if base is None:
        base = _base_vector(train_params["base_score"], objective, groups)
    with xgb_threads(train_params.get("nthread")):
        if cache is not None:
            booster = cache.train(rows, X, y, info, train_params, num_local_round)
            old = ()                           # the booster holds the new trees only
        else:
            dtrain = xgb.DMatrix(X, label=y, nthread=_nthread(train_params.get("nthread")))
            start = None if global_model is None else bytearray(global_model)   # checked by _read_model above
            booster = xgb.train(train_params, dtrain, num_boost_round=int(num_local_round), xgb_model=start,
                                verbose_eval=False)
        # Only the last old iteration (for the invariant check) and the new ones leave xgboost.
        first = max(len(old) // groups - 1, 0)
        learner = json.loads(bytes((booster[first:] if first else booster).save_raw("json")))["learner"]
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
