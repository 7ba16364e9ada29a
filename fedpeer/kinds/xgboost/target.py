"""What the xgboost job's objective decides, in one place for both modes: the labels a site
trains on, how its rows are split, the label statistics behind the base score, the evaluation
vector every member secure-sums and the metrics read from its total.

- binary:logistic / multi:softprob: class indices; a stratified split; label counts -> the
  class prior; evaluation = per-class score histograms, correct predictions and rows (counts) and
  the log-loss sum (fixed point) -> AUC (exact up to ties inside a bin), log-loss, accuracy.
- reg:squarederror: the label column's numbers; a plain random split; [Σ round(y * 2^16), rows]
  -> the label mean (fedpeer.ml.xgb.histboost.label_stats, the histogram core's own); evaluation =
  rows (a count) and Σ (prediction - y)², Σ |prediction - y| (fixed point) -> RMSE, MAE.
- With `train_loss` (capability xgb-train-loss-1; a job with a member without it runs without),
  the same sum also carries the site's training rows (a count) and its training loss on them:
  Σ log-loss, or Σ e², Σ |e| (fixed point) -> `train_logloss` or `train_rmse`, with `train_rows`.
  The counts come first, then the sums: [test counts, training rows, test sums, training sums].
Nothing here sees another site's values: every vector goes through the secure sum.
`check_labels` and `check_eval` say whether a total can come from honest sites (ValueError naming
the check; the job ends everywhere with it, naming no site).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from fedpeer.data import dataset as mldata
from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import site_seed
from fedpeer.ml import evaluation as evalcounts
from fedpeer.ml.moments import FIXED, whole_counts
from fedpeer.ml.xgb import bagging, boosting
from fedpeer.ml.xgb.histboost import (
    HistParams,
    base_score_from_stats,
    check_label_stats,
    decode_ints,
    encode_ints,
    label_stats,
)
from fedpeer.protocols.fixedpoint import decode_counts, encode_counts

REGRESSION = "reg:squarederror"
COUNT_MAX = 2**40                # evaluation and label counts are row counts


def is_regression(params: Mapping[str, Any]) -> bool:
    return params["objective"] == REGRESSION


def class_names(params: Mapping[str, Any]) -> list[str]:
    if params["objective"] != "multi:softprob":
        return []
    names = [c.strip() for c in params["classes"].split(",") if c.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        raise JobError("multi:softprob needs classes: at least two distinct label values, comma-separated")
    return names


def groups_of(params: Mapping[str, Any]) -> int:
    return max(1, len(class_names(params)))


def site_labels(dataset: Any, params: Mapping[str, Any]) -> np.ndarray:
    """What a site's rows are trained on: 0/1 (positive = [data] positive), the index in `classes`
    (int64), or for reg:squarederror the label column's numbers (float64)."""
    if is_regression(params):
        return _numbers(dataset.labels)
    names = class_names(params)
    present = sorted(set(dataset.labels.tolist()))
    if not names:
        if dataset.y is None:
            raise DataError("binary:logistic needs the positive class: set [data] positive")
        if len(present) > 2:
            raise DataError(f"binary:logistic: the label column has {len(present)} values {present[:10]}, "
                            "not two; use objective multi:softprob with classes, or reg:squarederror")
        return np.asarray(dataset.y, dtype=np.int64)
    unknown = [v for v in present if v not in names]
    if unknown:
        raise DataError(f"label value(s) {unknown[:10]} are not among the job's classes {names}")
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[v] for v in dataset.labels.tolist()], dtype=np.int64)


def _numbers(labels: np.ndarray) -> np.ndarray:
    out = np.empty(len(labels), dtype=np.float64)
    for i, text in enumerate(labels.tolist()):
        try:
            out[i] = float(text)
        except ValueError:
            raise DataError(f"reg:squarederror needs a numeric label: data row {i + 1} has {text[:40]!r}") from None
    if not np.isfinite(out).all():
        i = int(np.flatnonzero(~np.isfinite(out))[0])
        raise DataError(f"reg:squarederror needs finite labels: data row {i + 1} has {labels[i]!r}")
    return out


# -- base score ---------------------------------------------------------------------------------

_REG = HistParams(objective=REGRESSION)


def label_vector(y: np.ndarray, params: Mapping[str, Any], n_parties: int) -> np.ndarray:
    """A site's label statistics, encoded for the secure sum."""
    if is_regression(params):
        return encode_ints(label_stats(y, _REG), n_parties)
    groups = groups_of(params)
    counts = np.array([int(y.sum()), len(y)]) if groups == 1 else np.bincount(y, minlength=groups)
    return encode_counts(counts.astype(np.int64), n_parties, COUNT_MAX)


def check_labels(total: np.ndarray, params: Mapping[str, Any], parties: int) -> None:
    """ValueError (naming the check) unless summed `label_vector`s can come from honest sites."""
    if is_regression(params):
        check_label_stats(decode_ints(total), _REG, parties)
    else:
        bagging.check_label_counts(whole_counts(total), groups_of(params), parties * COUNT_MAX)


def base_from_total(total: np.ndarray, params: Mapping[str, Any]) -> tuple[Any, int]:
    """(global base_score, total training rows) from the summed `label_vector`s: a float (binary:
    the prior probability; regression: the label mean as a margin) or K class-prior margins."""
    if is_regression(params):
        stats = decode_ints(total)
        return base_score_from_stats(stats, _REG)[0], int(stats[-1])
    counts, groups = decode_counts(total), groups_of(params)
    if groups == 1:
        return boosting.global_base_score(int(counts[0]), int(counts[1]), params["objective"]), int(counts[1])
    rows = int(counts.sum())
    return boosting.global_base_score(counts.astype(np.int64), rows, params["objective"], groups), rows


# -- evaluation ---------------------------------------------------------------------------------

def _n_counts(params: Mapping[str, Any]) -> int:
    return 1 if is_regression(params) else 2 * params["eval_bins"] * groups_of(params) + 2


def with_train(params: Mapping[str, Any]) -> bool:
    """Does the job's evaluation sum carry the training loss (`train_loss`; absent in the records
    of builds before it)?"""
    return bool(params.get("train_loss", False))


def eval_vector(y: np.ndarray, pred: np.ndarray, params: Mapping[str, Any], n_parties: int,
                train: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """A site's evaluation of a model on its rows (pred: probabilities, or values for regression),
    encoded for one secure sum; with `train_loss`, `train` is the site's training part, its
    `train_sums`."""
    return encode_eval(*joined(eval_sums(y, pred, params), train, params), n_parties)


def joined(test: tuple[np.ndarray, np.ndarray], train: tuple[np.ndarray, np.ndarray] | None,
           params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation's (counts, sums): the test part's, then (with `train_loss`) the training
    part's (`train`: its `train_sums`)."""
    if not with_train(params):
        return test
    if train is None:
        raise ValueError("train_loss: the evaluation needs the site's training part")
    counts, sums = train
    return np.concatenate([test[0], counts]), np.concatenate([test[1], sums])


def train_sums(y: np.ndarray, pred: np.ndarray, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A site's training loss on its training rows, additive: ([rows], [Σ log-loss]), or for
    regression ([rows], [Σ e², Σ |e|])."""
    if is_regression(params):
        err = np.asarray(pred, dtype=np.float64) - y
        return np.array([len(y)], dtype=np.int64), np.array([float(err @ err), float(np.abs(err).sum())])
    loss, rows = evalcounts.logloss_sums(y, pred)
    return np.array([rows], dtype=np.int64), np.array([loss])


def _parts(total: np.ndarray, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A summed evaluation as (test counts, test sums, training counts, training sums), the
    counts as numpy int64 or object ints as `whole_counts` gives them (the training part empty
    without `train_loss`)."""
    k, s = _n_counts(params), 2 if is_regression(params) else 1
    t = 1 if with_train(params) else 0
    if len(total) != k + t + s * (1 + t) * FIXED.limbs:
        raise ValueError("the evaluation sum has the length of the job's parameters")
    counts, sums = whole_counts(total[:k + t]), FIXED.decode(total[k + t:])
    return counts[:k], sums[:s], counts[k:], sums[s:]


def eval_sums(y: np.ndarray, pred: np.ndarray, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(int64 counts, float64 sums) of `eval_vector` before encoding: additive over rows (the Dask
    engine sums them over its partitions)."""
    if is_regression(params):
        err = np.asarray(pred, dtype=np.float64) - y
        return np.array([len(y)], dtype=np.int64), np.array([float(err @ err), float(np.abs(err).sum())])
    counts, loss = evalcounts.site_counts(y, pred, params["eval_bins"])
    return counts.astype(np.int64), np.array([loss])


def encode_eval(counts: np.ndarray, sums: np.ndarray, n_parties: int) -> np.ndarray:
    return np.concatenate([encode_counts(counts.astype(np.int64), n_parties, COUNT_MAX), FIXED.encode(sums, n_parties)])


def check_eval(total: np.ndarray, params: Mapping[str, Any], train_rows_max: int | None = None) -> None:
    """ValueError (naming the check) unless summed `eval_vector`s can come from honest sites
    (fedpeer/ml/evaluation.py `check_counts`, `check_errors`, `check_loss`); the training part's
    rows at most `train_rows_max`, the federation's training rows."""
    counts, sums, train_counts, train = _parts(total, params)
    if is_regression(params):
        evalcounts.check_errors(int(counts[0]), float(sums[0]), float(sums[1]))
    else:
        evalcounts.check_counts(counts, float(sums[0]), groups_of(params), params["eval_bins"])
    if len(train_counts):
        rows = int(train_counts[0])
        if train_rows_max is None or not 1 <= rows <= train_rows_max:
            raise ValueError("the training loss rests on at least one and at most the federation's training rows")
        if is_regression(params):
            evalcounts.check_errors(rows, float(train[0]), float(train[1]))
        else:
            evalcounts.check_loss(rows, float(train[0]), train_rows_max)


def eval_metrics(total: np.ndarray, params: Mapping[str, Any]) -> dict:
    """The federation's metrics from the summed `eval_vector`s."""
    counts, sums, train_counts, train = _parts(total, params)
    if is_regression(params):
        rows = int(counts[0])
        out = {"rmse": round(math.sqrt(max(sums[0], 0.0) / rows), 6), "mae": round(float(sums[1]) / rows, 6),
               "test_rows": rows}
    else:
        out = evalcounts.metrics(np.asarray(counts, dtype=np.int64), float(sums[0]), groups_of(params),
                                 params["eval_bins"])
        out["test_rows"] = out.pop("rows")
    return {**out, **_train_metrics(train_counts, train, params)}


def _train_metrics(counts: np.ndarray, sums: np.ndarray, params: Mapping[str, Any]) -> dict:
    """{"train_logloss" or "train_rmse", "train_rows"} of the training part (none without it)."""
    if not len(counts):
        return {}
    rows = int(counts[0])
    if is_regression(params):
        return {"train_rmse": round(math.sqrt(max(float(sums[0]), 0.0) / rows), 6), "train_rows": rows}
    return {"train_logloss": round(float(sums[0]) / rows, 6), "train_rows": rows}


def curve_metrics(total: np.ndarray, params: Mapping[str, Any]) -> dict | None:
    """The last round's metrics at the rounds' bins (`eval_round_bins`), from its total summed at
    `eval_bins`: the learning curve's points then all rest on the same bins (the result keeps the
    finer score). None for regression, equal bins, or bins the rounds' do not divide."""
    to = min(params["eval_round_bins"], params["eval_bins"])
    if is_regression(params) or to == params["eval_bins"]:
        return None
    counts, sums, train_counts, train = _parts(total, params)
    coarse = evalcounts.coarsen(np.asarray(counts, dtype=np.int64), groups_of(params), params["eval_bins"], to)
    if coarse is None:
        return None
    out = evalcounts.metrics(coarse, float(sums[0]), groups_of(params), to)
    out["test_rows"] = out.pop("rows")
    return {**out, **_train_metrics(train_counts, train, params), "eval_bins": to}


def metric_keys(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of `eval_metrics`; the first is the one a result leads with."""
    return ("rmse", "mae", "test_rows") if is_regression(params) else ("auc", "logloss", "accuracy", "test_rows")


def model_score(model: bytes, X: np.ndarray, y: np.ndarray, params: Mapping[str, Any],
                nthread: int | None = None) -> dict:
    """A model on rows every site holds ([data] test_csv), computed locally: {"auc"} (macro
    one-vs-rest for multi-class; None with one class only) or {"rmse", "mae"}; and "rows"."""
    pred = boosting.predict_proba(model, X, nthread=nthread)
    out: dict[str, Any] = {"rows": int(len(y))}
    if is_regression(params):
        err = np.asarray(pred, dtype=np.float64) - y
        return {"rmse": float(np.sqrt(np.mean(err * err))), "mae": float(np.mean(np.abs(err))), **out}
    return {"auc": evalcounts.local_auc(y, pred), **out}


def test_csv_score(model: bytes, data: Any, params: Mapping[str, Any]) -> dict:
    """`model_score` on a site's [data] test_csv (a Dataset)."""
    return model_score(model, data.X, site_labels(data, params), params, params["nthread"] or None)


def prepare(site: Any) -> None:
    """Split a bagging Site's rows (stratified, seeded by the job seed and the site's key): its
    `fit` and `test` parts and its label groups."""
    p, data = site.params, site.ctx.data
    y = site_labels(data, p)
    labelled = replace(data, y=y)     # keeps what split_train_test needs to refit an imputer
    if p["test_fraction"] > 0:
        train, test = mldata.split_train_test(labelled, p["test_fraction"], seed=site_seed(p["seed"], site.me),
                                              stratify=not is_regression(p))
    else:
        train = test = labelled
    site.fit, site.test = (train.X, train.y), (test.X, test.y)
    site.groups = groups_of(p)
