"""The global xgboost model document: base score, canonical model bytes, reading and checking
a model from a peer, appending members' trees, loading it into xgboost (docs/algorithms.md) — pure
functions: no networking, no clock, no logging, no global random state.

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
reg:squarederror (histogram mode, fedpeer.ml.xgb.histboost) writes its intercept as a scalar margin.

Canonical JSON, float32 values and the tree checks are those of fedpeer.ml.xgb.tree: a model from
a peer passes the same checks as a member's trees document before anything reaches xgboost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.ml.xgb.tree import (
    _TREE_KEYS,
    DEPTH_MAX,
    FEATURES_MAX,
    MODEL_OBJECTIVES,
    NODES_PER_TREE_MAX,
    TREES_MAX,
    TreeBatch,
    TreesError,
    _dumps,
    _f32,
    _groups,
    _loads,
    _parse_tree,
    _parse_trees,
    _require_canonical,
    _Tree,
)

__all__ = [
    "MODEL_BYTES_MAX",
    "MODEL_FORMAT",
    "MODEL_VERSION",
    "PRIOR_MIN",
    "ModelInfo",
    "append_round",
    "check_model_policy",
    "global_base_score",
    "load_booster",
    "model_info",
    "model_sha256",
    "predict_proba",
]

MODEL_FORMAT = "fedpeer-xgb-model/1"
MODEL_VERSION = (3, 2, 0)
PRIOR_MIN = 1e-6              # class priors are clipped to [PRIOR_MIN, 1 - PRIOR_MIN] (log and logit stay finite)
MODEL_BYTES_MAX = 1 << 31


# ---------------------------------------------------------------------------------------------
# Base score
# ---------------------------------------------------------------------------------------------

def _base_vector(base_score: Any, objective: str, groups: int) -> np.ndarray:
    """base_score as float32 values: (1,) probability in (0, 1) for binary, (K,) margins for multi,
    (1,) margin for regression."""
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
    if objective != "multi:softprob":
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
    if objective == "reg:squarederror":
        raise ValueError("reg:squarederror has no label counts: its intercept is the label mean "
                         "(fedpeer.ml.xgb.histboost.base_score_from_stats)")
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
    if objective != "multi:softprob":
        return {"name": objective, "reg_loss_param": {"scale_pos_weight": "1"}}
    return {"name": objective, "softmax_multiclass_param": {"num_class": str(groups)}}


_TREES_SLOT = b'"trees":[]'      # where `_model_bytes` puts the trees' own encodings


def _model_bytes(trees: Sequence[_Tree], base: np.ndarray, num_feature: int, groups: int, objective: str) -> bytes:
    """The canonical bytes of the model (`_dumps` of the document below). The trees are spliced in
    from each tree's kept encoding (`_Tree.xgboost_json`): json.dumps writes a list as "[" + its
    items' encodings joined by "," + "]", so the bytes are those of one `_dumps` of the whole,
    without encoding R rounds' trees again in every round."""
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
                    "trees": [],
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
    head, tail = _dumps(model).split(_TREES_SLOT)     # the one key of that name
    return b"".join((head, b'"trees":[', b",".join(tree.xgboost_json(i, num_feature) for i, tree in enumerate(trees)),
                     b"]", tail))


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
    digest = _digest(model)
    with _MODEL_CACHE_LOCK:
        info = _MODEL_CACHE.get(digest)
        if info is not None:
            _MODEL_CACHE.move_to_end(digest)
            return info
    info = _read_model_uncached(bytes(model))
    _remember(digest, info)
    return info


_DIGESTS: OrderedDict[int, tuple[bytes, bytes]] = OrderedDict()   # id -> (the bytes object, its SHA-256)
_DIGESTS_SIZE = 2


def _digest(model: Any) -> bytes:
    """SHA-256 of a model's bytes; of the last few `bytes` objects (immutable) computed once: a
    round hashes its new model when building it, storing it and training on it (a growing model:
    O(rounds) each time). The entries hold their objects, so an id is never another's."""
    if type(model) is not bytes:
        return hashlib.sha256(model).digest()
    with _MODEL_CACHE_LOCK:
        held = _DIGESTS.get(id(model))
        if held is not None and held[0] is model:
            return held[1]
    digest = hashlib.sha256(model).digest()
    with _MODEL_CACHE_LOCK:
        _DIGESTS[id(model)] = (model, digest)
        while len(_DIGESTS) > _DIGESTS_SIZE:
            _DIGESTS.popitem(last=False)
    return digest


def _remember(digest: bytes, info: ModelInfo) -> None:
    with _MODEL_CACHE_LOCK:
        _MODEL_CACHE[digest] = info
        while len(_MODEL_CACHE) > _MODEL_CACHE_SIZE:
            _MODEL_CACHE.popitem(last=False)


def _read_model_uncached(model: bytes) -> ModelInfo:
    raw = _loads(model, "xgb_model", "global model", MODEL_BYTES_MAX)
    learner = ("learner",)
    param = learner + ("learner_model_param",)
    objective = _get(raw, learner + ("objective", "name"), str)
    if objective not in MODEL_OBJECTIVES:
        raise TreesError("xgb_model", f"objective {objective!r} is not one of {MODEL_OBJECTIVES}")
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
    leader is one member: its word is no better than any other member's."""
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
    are checked again for structure only (so nothing malformed can reach a model). A document may
    be given as the TreeBatch `validate_trees` returned for it (with this num_feature and classes:
    checked again, it would be parsed twice). With a global model, objective, num_class,
    num_feature and base_score must agree with it."""
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
        if isinstance(doc, TreeBatch):
            if doc.groups != groups or any(int(t.feature.max()) >= num_feature for t in doc.trees):
                raise TreesError("xgb_trees", f"member {m}: trees validated for another model")
            trees.extend(doc.trees)
            continue
        try:
            batch = _parse_trees(doc, num_feature=int(num_feature), groups=groups, expected=None, trees_max=TREES_MAX,
                                 nodes_max=NODES_PER_TREE_MAX, depth_max=DEPTH_MAX, leaf_abs_max=math.inf)
        except TreesError as exc:
            raise TreesError(exc.reason, f"member {m}: {exc.detail}") from None
        trees.extend(batch.trees)
    if len(trees) > TREES_MAX:
        raise ValueError(f"the model would hold {len(trees)} trees, more than {TREES_MAX}")
    model = _model_bytes(trees, base, int(num_feature), groups, objective)
    if len(model) > MODEL_BYTES_MAX:          # what any member's `_read_model` refuses
        raise TreesError("xgb_model", f"global model is {len(model)} bytes, more than the {MODEL_BYTES_MAX} allowed")
    # What `_read_model` would find in these bytes (every tree passed the same checks, the bytes are
    # canonical by construction): the member that stores the model, and trains on it next round,
    # need not parse it again.
    _remember(_digest(model), ModelInfo(
        objective=objective, num_class=groups if objective == "multi:softprob" else 0, num_feature=int(num_feature),
        base_score=tuple(float(v) for v in base), trees=tuple(trees)))
    return model


def model_sha256(model_bytes: bytes) -> str:
    """Hex SHA-256 of a model's bytes: what members compare to know they hold the same model."""
    return _digest(model_bytes).hex()


def load_booster(model: bytes) -> Any:
    """An xgboost Booster of a canonical global model (checked first: xgboost is never handed
    bytes that did not pass `_read_model`)."""
    import xgboost as xgb

    _read_model(model)
    booster = xgb.Booster()
    booster.load_model(bytearray(model))
    return booster


def predict_proba(model: bytes, X: Any, nthread: int | None = None, cache: Any = None) -> np.ndarray:
    """Probabilities of a global model: (rows,) P(positive) for binary, (rows, K) for multi-class.
    `cache`: a fedpeer.ml.xgb.margins.RoundCache of these rows, the same values faster."""
    import xgboost as xgb

    info = _read_model(model)
    rows, X = X, _features(X, info.num_feature)
    with xgb_threads(nthread):
        if cache is not None:
            return cache.predict(rows, X, info, nthread)
        booster = load_booster(model)
        if nthread is not None:
            booster.set_param("nthread", int(nthread))
        return booster.predict(xgb.DMatrix(X, nthread=_nthread(nthread)))


_OPENMP: Any = None                 # threadpoolctl's handle on the loaded OpenMP runtimes, found once
_OPENMP_LOCK = threading.Lock()


def xgb_threads(nthread: Any) -> contextlib.AbstractContextManager:
    """Within it, OpenMP regions started by this thread use at most `nthread` threads (None or
    <= 0: no limit), also those a Booster's nthread does not reach: `load_model` runs one on every
    core, whose worker then spins (on 3 daemons sharing 2 cores: ~6 % of a bagging job's CPU,
    measured). OpenMP's thread count is per thread, and the limit is lifted on leaving (not
    xgboost's global `nthread`: it cannot be set back to 0 once set)."""
    n = 0 if nthread is None else int(nthread)
    if n <= 0:
        return contextlib.nullcontext()
    global _OPENMP
    with _OPENMP_LOCK:
        if _OPENMP is None:
            import xgboost  # noqa: F401  (its OpenMP runtime must be loaded to be found)
            from threadpoolctl import ThreadpoolController
            _OPENMP = ThreadpoolController().select(user_api="openmp")
    return _OPENMP.limit(limits=n)


def _nthread(value: Any) -> int:
    """xgboost's thread count for a DMatrix: the params' nthread, else all (-1). One thread is much
    faster for small data on some machines (OpenMP start-up costs milliseconds per call)."""
    return -1 if value is None or int(value) <= 0 else int(value)



def _features(X: Any, num_feature: int | None = None) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2 or X.dtype.kind not in "biuf" or X.shape[0] == 0:
        raise DataError(f"X must be a non-empty numeric (rows, features) array, got {X.dtype} {X.shape}")
    if num_feature is not None and X.shape[1] != num_feature:
        raise DataError(f"X has {X.shape[1]} features, the model {num_feature}")
    return X
