"""`fedpeer predict`: score new rows with a job's stored model, locally (no daemon needed).

The model is read from this site's state directory, never unpickled: BOFRF's validated tree arrays,
logreg's and mlp's validated arrays (.npz, loaded without pickle), or xgboost's JSON model
(checked to be one fedpeer built before xgboost loads it). A model is used
only if its file's bytes hash to the SHA-256 the job record holds (xgboost: `model_sha256`; any
kind: `model_file_sha256` when the record has it): a file modified or corrupted after the job
stored it is refused with a one-line message naming it (issue 10). The CSV is
read by the same checked reader as job data, keeping only the model's feature columns. Binary
models give a score (BOFRF: the weighted vote, positive = positive class; xgboost, logreg, mlp:
P(positive)) and a 0/1 prediction (logreg / mlp trained with two named classes: the class);
multi-class xgboost, logreg and mlp give the predicted class and one probability per class; a reg:squarederror
xgboost model gives the predicted value.
k-means gives each row's cluster (the index in the job's canonical order: centres sorted by
first coordinate) and its distance to that centre (fuzzy: one membership per cluster); a
Gaussian mixture gives the most probable component and every component's probability; dbscan the
cluster of the nearest clustered synthetic point within eps, or -1 (noise).
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import DataError, JobError
from ..ml.data import DataSpec, load_csv
from ..store import read_json


def predict_csv(config: Config, job_id: str, data: Path) -> list[dict]:
    from .kinds import job_kinds

    record_path = config.node.state_dir / "jobs" / job_id / "job.json"
    record = read_json(record_path)
    if record is None:
        raise JobError(f"no job {job_id!r} in {config.node.state_dir / 'jobs'}")
    if record["state"] != "done" or not (record.get("result") or {}).get("model_file"):
        raise JobError(f"job {job_id} has no stored model (state {record['state']})")
    kind = job_kinds()[record["kind"]]
    model_path = record_path.parent / kind.model_file
    result = record["result"]
    recorded = result.get("model_file_sha256")
    if recorded is not None:
        _check_file_sha256(model_path, recorded)
    header = _header(data)
    if record["kind"] in ("kmeans", "gmm", "dbscan"):
        from . import dbscan, gmm, kmeans
        module = {"kmeans": kmeans, "gmm": gmm, "dbscan": dbscan}[record["kind"]]
        model = module.load_model(model_path)
        features = (model[1] if record["kind"] == "gmm" else model)["features"]
        return module.predict(model, _rows(data, header, features))
    if record["kind"] in ("logreg", "mlp"):
        from . import logreg, mlp
        module = logreg if record["kind"] == "logreg" else mlp
        model = module.load_model(model_path)
        proba = module.predict(model, _rows(data, header, model["features"]))
        classes = model["classes"]
        if proba.ndim == 1:
            return [{"row": i + 1, "score": float(p),
                     "prediction": classes[int(p > 0.5)] if classes else int(p > 0.5)} for i, p in enumerate(proba)]
        return [{"row": i + 1, "prediction": classes[int(row.argmax())],
                 **{f"p_{c}": float(v) for c, v in zip(classes, row)}} for i, row in enumerate(proba)]
    if record["kind"] == "xgboost":
        from . import xgboost
        if not isinstance(result.get("model_sha256"), str):
            raise JobError(f"{record_path}: the job record holds no model_sha256 to check {model_path} against")
        model = xgboost.load_model(model_path, result["model_sha256"])
        features = tuple(record["result"]["features"])
        proba = xgboost.predict(model, _rows(data, header, features))
        classes = record["result"].get("classes") or []
        if record["result"].get("objective") == "reg:squarederror":
            return [{"row": i + 1, "prediction": float(v)} for i, v in enumerate(proba)]
        if not classes:
            return [{"row": i + 1, "score": float(p), "prediction": int(p > 0.5)} for i, p in enumerate(proba)]
        return [{"row": i + 1, "prediction": classes[int(row.argmax())],
                 **{f"p_{c}": float(v) for c, v in zip(classes, row)}} for i, row in enumerate(proba)]
    from . import bofrf
    model = bofrf.load_model(model_path)
    scores = bofrf.predict(model, _rows(data, header, model[0].features), model[0].features)
    return [{"row": i + 1, "score": float(s), "prediction": int(s > 0)} for i, s in enumerate(scores)]


def export_sklearn(config: Config, job_id: str) -> dict:
    """`fedpeer export`: a logreg job's stored model as scikit-learn LogisticRegression attributes
    (coef_, intercept_, classes_, n_features_in_, feature_names_in_), or an mlp job's weights as
    arrays in MLPClassifier's layout (coefs_, intercepts_, with the mean and scale its inputs are
    standardised with), after the same checks as predict (the record says done, the file's
    SHA-256 is the record's, the arrays are valid)."""
    record_path = config.node.state_dir / "jobs" / job_id / "job.json"
    record = read_json(record_path)
    if record is None:
        raise JobError(f"no job {job_id!r} in {config.node.state_dir / 'jobs'}")
    if record["kind"] not in ("logreg", "mlp"):
        raise JobError(f"job {job_id} is a {record['kind']} job; only logreg and mlp models export")
    result = record.get("result") or {}
    if record["state"] != "done" or not result.get("model_file"):
        raise JobError(f"job {job_id} has no stored model (state {record['state']})")
    from . import logreg, mlp

    model_path = record_path.parent / logreg.KIND.model_file
    if not isinstance(result.get("model_file_sha256"), str):
        raise JobError(f"{record_path}: the job record holds no model_file_sha256 to check {model_path} against")
    _check_file_sha256(model_path, result["model_file_sha256"])
    if record["kind"] == "mlp":
        return mlp.export(mlp.load_model(model_path))
    model = logreg.load_model(model_path)
    return logreg.sklearn_export(model["coef"], model["intercept"], model["classes"], list(model["features"]))


def _check_file_sha256(path: Path, expect: object) -> None:
    """Refuse a model file whose bytes are not the ones the job stored."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise JobError(f"{path}: cannot read the stored model: {exc.strerror or exc}") from None
    if digest.hexdigest() != expect:
        raise JobError(f"{path}: the model file was modified or corrupted after it was stored (its SHA-256 "
                       "differs from the job record's); restore it from a backup or run the job again")


def _rows(data: Path, header: list[str], features: tuple[str, ...]) -> np.ndarray:
    """The CSV's values of the model's feature columns, in the model's column order."""
    missing = [f for f in features if f not in header]
    if missing:
        raise DataError(f"{data}: lacks the model's feature column(s) {missing[:10]}")
    ignore = tuple(c for c in header if c not in features)
    dataset = load_csv(DataSpec(csv=data, label=None, ignore=ignore), binary=False)
    return dataset.X[:, [dataset.features.index(f) for f in features]]


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [c.strip() for c in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read the header: {exc}") from None
