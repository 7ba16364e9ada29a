"""`tree`: one exact federated CART tree (classification by gini or entropy, regression by
variance reduction) — the job kind, its parameters, its stored model (the tree's canonical JSON,
fedpeer/ml/tree/model.py), `fedpeer predict` and `fedpeer export`. The protocol is
fedpeer/kinds/tree/job.py (its arithmetic without the network fedpeer/kinds/tree/site.py), its text
fedpeer/kinds/tree/text.py. Mode `icdta` instead aggregates the members' own trees (ICDTA4FL
without a server): fedpeer/kinds/tree/icdta.py. With dp_epsilon (mode exact) the tree grows from
noised class counts on uniform bins: fedpeer/kinds/tree/dp.py."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.base.store import atomic_write
from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param
from fedpeer.jobs.params import (
    DP_CART_PARAMS,
    EPOCH_VIEWS_PARAM,
    SECURE_SUM_COMPACT,
    SECURE_SUM_LARGE,
    seed,
    test_fraction,
)
from fedpeer.kinds.scoring import binary_rows, class_rows
from fedpeer.kinds.tree import dp, icdta, text
from fedpeer.kinds.tree.job import run_job
from fedpeer.ml.tree.cart import CCP_ALPHA_MAX, CRITERIA, DEPTH_MAX, MAX_BIN_MAX, MIN_LEAF_ROWS_MAX
from fedpeer.ml.tree.model import MODEL_BYTES_MAX, load_model, model_doc, predict_value

LABEL_ABS_MAX_MAX = 1e12

MODES = ("exact", "icdta")

PARAMS = {
    "mode": Param(str, "exact", "exact: the pooled rows' CART tree from secure-summed histograms | icdta: ICDTA4FL "
                  "without a server — every member's own scikit-learn tree, scored at the others through a secure sum, "
                  "filtered, their rules aggregated by Cartesian product into one global tree (classification)",
                  choices=MODES),
    "icdta_threshold": Param(float, 0.0, "icdta: the filter of the members' trees; 0: keep those whose federated "
                             "accuracy and macro-F1 are both at least the mean over the trees; above 0: keep those "
                             "whose accuracy is at least this (none passing: the most accurate)", low=0.0, high=1.0),
    "criterion": Param(str, "gini", "gini or entropy (classification: the label's classes) | squared_error "
                       "(regression on a numeric label: variance reduction from Σy, Σy², rows)", choices=CRITERIA),
    "classes": Param(str, "", "classification: the label values, comma-separated, in class order (2 or more); "
                     "empty: binary, [data] positive against the rest"),
    "max_depth": Param(int, 5, "maximum tree depth (one secure sum per level)", low=1, high=DEPTH_MAX),
    "min_leaf_rows": Param(int, 5, "no split leaves fewer rows than this in a child, federation-wide "
                           "(scikit-learn's min_samples_leaf over the pooled rows); class counts below it are not "
                           "shown in the rules", low=1, high=MIN_LEAF_ROWS_MAX),
    "ccp_alpha": Param(float, 0.0, "minimal cost-complexity pruning, as scikit-learn's ccp_alpha (0: none)",
                       low=0.0, high=CCP_ALPHA_MAX),
    "max_bin": Param(int, 256, "bins per feature of the federated cut points; above the federation's training "
                     "rows every value is a cut point and the tree is scikit-learn's on the pooled rows (the cut "
                     "points then reveal every distinct value to the members)", low=2, high=MAX_BIN_MAX),
    "label_abs_max": Param(float, 1000.0, "squared_error: the declared bound on |label| (the fixed point of Σy "
                           "and Σy²: y to bound x 2^-28, y² to bound² x 2^-28); a site beyond it ends the job "
                           "naming it", low=1e-9, high=LABEL_ABS_MAX_MAX),
    "test_fraction": test_fraction(0.2, 0.0, "share of each site's rows kept out of growing to score the tree on "
                                   "(0: grow on every row and score on them)"),
    "eval_bins": Param(int, 1000, "score histogram bins of the federated AUC", low=10, high=100_000),
    "seed": seed("seed of each site's train/test split"),
    "secure_sum": SECURE_SUM_LARGE,
    "epoch_views": EPOCH_VIEWS_PARAM,
    "secure_sum_compact": SECURE_SUM_COMPACT,
    **DP_CART_PARAMS,   # differential privacy, mode exact (fedpeer/kinds/tree/dp.py): off at dp_epsilon = 0
}

# [policy.tree]: the largest parameters of a job this site agrees to run (defaults: the kind's own bounds).
LIMITS = {
    "depth_max": Limit("max_depth", DEPTH_MAX, "tree depth (max_depth)"),
    "bins_max": Limit("max_bin", MAX_BIN_MAX, "bins per feature of the cut points (max_bin)"),
}


def save_model(path: Any, model: bytes) -> None:
    atomic_write(path, model)


def read_model(path: Path, result: Mapping[str, Any]) -> tuple[Any, list[str], list[str]]:
    """The stored tree, refused unless its bytes hash to the record's model_sha256 and it is a
    well-formed tree: JobError in one line naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MODEL_BYTES_MAX + 1)
    except OSError as exc:
        raise JobError(f"{path}: cannot read the stored model: {exc.strerror or exc}") from None
    if hashlib.sha256(data).hexdigest() != result.get("model_sha256"):
        raise JobError(f"{path}: the model file was modified or corrupted after it was stored (its SHA-256 differs "
                       "from the job record's); restore it from a backup or run the job again")
    try:
        return load_model(data)
    except ValueError as exc:
        raise JobError(f"{path}: not a tree fedpeer stored ({exc})") from None


def predict_file(path: Path, result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict`: the predicted value (regression), P(positive) and 0/1 (binary), or every
    class's share (the leaf's class mix) and the most frequent class."""
    cart, features, classes = read_model(path, result)
    value = predict_value(cart, rows(tuple(features)))
    if cart.regression:
        return [{"row": i + 1, "prediction": float(v)} for i, v in enumerate(value)]
    if classes == ["negative", "positive"]:
        return binary_rows(value[:, 1])
    return class_rows(value, classes)


def export_file(path: Path, result: Mapping[str, Any]) -> dict:
    """`fedpeer export`: the tree in scikit-learn's arrays (fedpeer.ml.tree.model.to_sklearn builds
    a DecisionTreeClassifier / Regressor from them) with its feature and class names."""
    cart, features, classes = read_model(path, result)
    return model_doc(cart, features, classes)


def run(ch: Any, params: Mapping[str, Any], ctx: JobContext, offload: Callable[..., Any] | None = None) -> Any:
    """The kind's run(): the exact tree, or in mode icdta the aggregated one; `offload` runs the
    core's steps (asyncio.to_thread in the daemon; inline in simulations under virtual time)."""
    if params["mode"] == "icdta":
        return icdta.run_icdta(ch, params, ctx, offload or asyncio.to_thread)
    if params.get("dp_epsilon", 0.0) > 0:
        return dp.run_dp(ch, params, ctx, offload)
    return run_job(ch, params, ctx, offload)


def describe(result: Mapping[str, Any]) -> list[str]:
    return icdta.describe(result) if result.get("mode") == "icdta" else text.describe(result)


KIND = JobKind(name="tree", help="one exact federated CART tree (gini, entropy or squared_error) from secure-summed "
               "histograms; scikit-learn's tree on the pooled rows when max_bin is above the rows",
               params=PARAMS, run=run, needs_data=True, binary_label=False, save_model=save_model,
               model_file="model.json", member_failure_aborts=False, limits=LIMITS, describe=describe,
               site_table=text.site_table, predict=predict_file, export=export_file, messages=icdta.MESSAGES,
               refused=dp.refusal)
