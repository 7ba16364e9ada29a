"""Federated XGBoost (docs/algorithms.md) — the names importers have always used, re-exported.

The code lives in modules with one job each:
  fedpeer.ml.xgb.tree     one tree as validated arrays; the trees document a bagging site sends
  fedpeer.ml.xgb.model    the global xgboost model document: base score, canonical bytes, checks,
                         append_round, loading and predicting with xgboost
  fedpeer.ml.xgb.bagging     tree bagging / tree+: a site's part of one round (train_local_round)
  fedpeer.ml.evaluation  federated evaluation counts (score histograms, AUC, log-loss, accuracy)
  histogram mode (exact federated trees from summed gradient histograms): fedpeer.ml.xgb.sketch
  (cut points), hist (a site's level histograms), histtree (splits, one tree), histboost
  (parameters, intercept, model), histrun (a member's side; the in-process reference)
New code should import from those modules; this one stays so no importer has to change.
"""

from __future__ import annotations

from fedpeer.ml.evaluation import (
    LOGLOSS_EPS,
    accuracy_counts,
    auc_from_histograms,
    logloss_sums,
    score_histograms,
)
from fedpeer.ml.xgb.bagging import (
    _ALLOWED_PARAMS,
    _canonical_tree,
    _labels,
    _site_params,
    normalized_eta,
    train_local_round,
)
from fedpeer.ml.xgb.model import (
    _MODEL_CACHE,
    MODEL_BYTES_MAX,
    MODEL_FORMAT,
    MODEL_VERSION,
    PRIOR_MIN,
    ModelInfo,
    _base_vector,
    _features,
    _model_bytes,
    _read_model,
    append_round,
    check_model_policy,
    global_base_score,
    load_booster,
    model_info,
    model_sha256,
    predict_proba,
)
from fedpeer.ml.xgb.tree import (
    CLASSES_MAX,
    DEPTH_MAX,
    FEATURES_MAX,
    MODEL_OBJECTIVES,
    NODES_PER_TREE_MAX,
    OBJECTIVES,
    TREES_FORMAT,
    TREES_MAX,
    TreeBatch,
    TreesError,
    _groups,
    _parse_tree,
    _parse_trees,
    _Tree,
    _trees_doc,
    trees_gain,
    validate_trees,
)

__all__ = [
    "MODEL_FORMAT",
    "MODEL_VERSION",
    "OBJECTIVES",
    "TREES_FORMAT",
    "ModelInfo",
    "TreeBatch",
    "TreesError",
    "accuracy_counts",
    "append_round",
    "auc_from_histograms",
    "check_model_policy",
    "global_base_score",
    "load_booster",
    "logloss_sums",
    "model_info",
    "model_sha256",
    "normalized_eta",
    "predict_proba",
    "score_histograms",
    "train_local_round",
    "trees_gain",
    "validate_trees",
]

_REEXPORTED_PRIVATE = (_ALLOWED_PARAMS, _canonical_tree, _labels, _site_params, _base_vector, _features,
                       _model_bytes, _read_model, _groups, _parse_tree, _parse_trees, _Tree, _trees_doc, _MODEL_CACHE,
                       CLASSES_MAX, DEPTH_MAX, FEATURES_MAX, MODEL_OBJECTIVES, NODES_PER_TREE_MAX, TREES_MAX,
                       LOGLOSS_EPS, MODEL_BYTES_MAX, PRIOR_MIN)   # tests and tools reach for these by name
