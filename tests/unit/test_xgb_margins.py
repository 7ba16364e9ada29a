"""A bagging site's rows and margins kept between rounds (fedpeer/ml/xgb/margins.py `RoundCache`)
and the model bytes built from kept tree encodings: the same bytes as without them, byte for
byte, whatever the objective, sampling, tree method or order of models."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import make_classification, make_regression

from fedpeer.ml.xgb import boosting as B
from fedpeer.ml.xgb.margins import RoundCache
from fedpeer.ml.xgb.model import _model_bytes, _read_model_uncached, xgb_threads
from fedpeer.ml.xgb.tree import _dumps


def task(objective: str) -> tuple[np.ndarray, np.ndarray, dict, object, int]:
    """(X with missing values, y, params, federation base_score, num_class) of a small problem."""
    if objective == "reg:squarederror":
        X, y = make_regression(n_samples=900, n_features=6, noise=5.0, random_state=1)
        base, num_class = float(np.float32(y.mean())), 0
    elif objective == "multi:softprob":
        X, y = make_classification(n_samples=900, n_features=6, n_informative=4, n_classes=3, random_state=1)
        base, num_class = list(B.global_base_score(np.bincount(y), len(y), objective, 3)), 3
    else:
        X, y = make_classification(n_samples=900, n_features=6, random_state=1)
        base, num_class = B.global_base_score(int(y.sum()), len(y), objective), 0
    X[::13, 2] = np.nan
    params = {"objective": objective, "max_depth": 4, "tree_method": "hist", "max_bin": 32, "nthread": 1,
              "base_score": base}
    if num_class:
        params["num_class"] = num_class
    return X, y, params, base, num_class


@pytest.mark.parametrize("objective,extra", [
    ("binary:logistic", {}), ("binary:logistic", {"subsample": 0.7, "colsample_bytree": 0.6}),
    ("binary:logistic", {"tree_method": "approx"}), ("multi:softprob", {}),
    ("reg:squarederror", {"tree_method": "exact", "max_delta_step": 0.5})])
@pytest.mark.parametrize("n_local", [1, 2])
def test_a_round_cache_gives_the_same_trees_and_probabilities(objective, extra, n_local):
    X, y, params, base, num_class = task(objective)
    params = {**params, **extra}
    parts = [(X[i::3], y[i::3]) for i in range(3)]
    test = X[::4].copy()
    caches, test_cache = [RoundCache() for _ in parts], RoundCache()
    model = None
    for r in range(1, 5):
        docs = []
        for i, (Xs, ys) in enumerate(parts):
            plain = B.train_local_round(model, Xs, ys, params, n_local, 0.3, seed=10 * r + i)
            assert B.train_local_round(model, Xs, ys, params, n_local, 0.3, seed=10 * r + i, cache=caches[i]) == plain
            docs.append(plain)
        model = B.append_round(model, docs, base, X.shape[1], num_class, objective)
        Xs = parts[r % 3][0]        # the evaluation of the training rows shares the training's cache
        np.testing.assert_array_equal(B.predict_proba(model, Xs, 1, cache=caches[r % 3]), B.predict_proba(model, Xs, 1))
        if r % 2 == 0:
            np.testing.assert_array_equal(B.predict_proba(model, test, 1, cache=test_cache),
                                          B.predict_proba(model, test, 1))


def test_a_model_that_does_not_extend_the_kept_trees_is_predicted_from_its_start():
    """Another leader's model (other trees after the kept ones), then ours again, then other rows."""
    X, y, params, base, _ = task("binary:logistic")
    parts = [(X[i::2], y[i::2]) for i in range(2)]
    cache = RoundCache()
    Xs, ys = parts[0]
    docs = [B.train_local_round(None, X_, y_, params, 1, 0.3, seed=i) for i, (X_, y_) in enumerate(parts)]
    ours = B.append_round(None, docs, base, X.shape[1], 0, "binary:logistic")
    theirs = B.append_round(None, docs[::-1], base, X.shape[1], 0, "binary:logistic")
    for model in (ours, theirs, ours):
        assert B.train_local_round(model, Xs, ys, params, 1, 0.3, seed=7, cache=cache) == \
            B.train_local_round(model, Xs, ys, params, 1, 0.3, seed=7)
    other = (Xs + 1.0, ys)          # other arrays: the cache starts over on them
    assert B.train_local_round(ours, *other, params, 1, 0.3, seed=7, cache=cache) == \
        B.train_local_round(ours, *other, params, 1, 0.3, seed=7)


def test_model_bytes_are_one_canonical_encoding_of_the_whole():
    """`_model_bytes` splices in each tree's kept encoding: the bytes of one encoding of the document."""
    X, y, params, base, num_class = task("multi:softprob")
    doc = B.train_local_round(None, X, y, params, 2, 0.3, seed=1)
    model = B.append_round(None, [doc, doc], base, X.shape[1], num_class, "multi:softprob")
    info = _read_model_uncached(model)
    whole = json.loads(model)
    trees = [t.xgboost(i, X.shape[1]) for i, t in enumerate(info.trees)]
    whole["learner"]["gradient_booster"]["model"]["trees"] = trees
    assert _dumps(whole) == model
    empty = _model_bytes((), np.array(info.base_score), X.shape[1], 3, "multi:softprob")
    assert B.model_info(empty).n_trees == 0 and json.loads(empty)["learner"]["gradient_booster"]["model"]["trees"] == []


def test_append_round_takes_the_batches_validate_trees_returned():
    X, y, params, base, _ = task("binary:logistic")
    docs = [B.train_local_round(None, X[i::2], y[i::2], params, 1, 0.3, seed=i) for i in range(2)]
    batches = [B.validate_trees(d, num_feature=X.shape[1], num_class=0, num_local_round=1, max_depth=4, max_nodes=31,
                                leaf_abs_max=10.0) for d in docs]
    first = B.append_round(None, docs, base, X.shape[1], 0, "binary:logistic")
    assert B.append_round(None, batches, base, X.shape[1], 0, "binary:logistic") == first
    assert B.append_round(first, batches[:1], base, X.shape[1], 0, "binary:logistic") == \
        B.append_round(first, docs[:1], base, X.shape[1], 0, "binary:logistic")
    with pytest.raises(B.TreesError, match="another model"):     # validated for fewer features
        B.append_round(None, batches, base, 1, 0, "binary:logistic")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_xgb_threads_keeps_openmp_to_the_jobs_threads_and_lifts_the_limit():
    """load_model starts an OpenMP region on every core whatever the Booster's nthread; within
    xgb_threads(1) it starts no thread, and the limit ends with the block (xgboost's own global
    nthread, which cannot be set back to 0, is left alone)."""
    X, y, params, base, _ = task("binary:logistic")
    model = bytearray(B.append_round(None, [B.train_local_round(None, X, y, params, 1, 0.3, seed=1)], base,
                                     X.shape[1], 0, "binary:logistic"))
    counts: list[int] = []

    def load() -> None:      # a fresh thread: no OpenMP pool of its own yet
        with xgb_threads(1):
            xgb.Booster().load_model(model)
            counts.append(len(os.listdir("/proc/self/task")))
        counts.append(xgb.get_config()["nthread"])

    before = len(os.listdir("/proc/self/task"))
    worker = threading.Thread(target=load)
    worker.start()
    worker.join()
    assert counts == [before + 1, 0]          # the worker itself, no OpenMP thread; global config untouched
