"""`fedpeer predict`: score new rows with a job's stored model, locally (no daemon needed).

The model is read from this site's state directory, never unpickled: BOFRF's validated tree arrays,
logreg's and mlp's validated arrays (.npz, loaded without pickle), or xgboost's JSON model
(checked to be one fedpeer built before xgboost loads it). A model is used only if its file's
bytes hash to the SHA-256 the job record holds (xgboost: `model_sha256`; any kind:
`model_file_sha256` when the record has it): a file modified or corrupted after the job stored it
is refused with a one-line message naming it. The CSV is read by the same checked reader as job
data, keeping only the model's feature columns (and, with `--id-column COL`, that column's values,
which then stand first in every output row instead of the row number).

Binary models give a score, P(positive) (BOFRF: the weighted vote share, with the weighted vote
itself as `vote_sum`, positive = positive class), and a prediction: the class, by the site's
[data] positive class and the label's other value (0/1 where [data] names no positive class;
logreg / mlp trained with two named classes: their class); multi-class xgboost, logreg and mlp
give the predicted class and one probability per class; a reg:squarederror xgboost model gives the
predicted value. A tree gives what its leaf holds: P(positive) and the class, the class mix and
its most frequent class, or (regression) the leaf's mean. k-means gives each row's cluster (the
index in the job's canonical order: centres sorted by first coordinate) and its distance to that
centre (fuzzy: one membership per cluster); a Gaussian mixture gives the most probable component
and every component's probability; dbscan the cluster of the nearest clustered synthetic point
within eps, or -1 (noise).
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpeer.base.store import read_json
from fedpeer.config.load import Config
from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.errors import DataError, JobError


def predict_csv(config: Config, job_id: str, data: Path, id_column: str | None = None) -> list[dict]:
    """Score `data` with job `job_id`'s stored model (the kind's `predict`), after the checks every
    kind shares: the job is done, its model file is there and its bytes are the stored ones. With
    `id_column`, each row's value of that column (which `data` must have) replaces its number."""
    record_path, record, kind = _stored(config, job_id)
    result = record.get("result") or {}
    if record["state"] != "done" or not result.get("model_file") or kind.predict is None:
        raise JobError(f"job {job_id} has no stored model (state {record['state']})")
    model_path = record_path.parent / kind.model_file
    recorded = result.get("model_file_sha256")
    if recorded is not None:
        _check_file_sha256(model_path, recorded)
    header = _header(data)
    if id_column is not None and id_column not in header:
        raise DataError(f"{data}: no column {id_column!r} (--id-column); its columns: {', '.join(header)}")
    ids: list[np.ndarray] = []

    def rows(features: Any) -> np.ndarray:
        X, row_ids = _rows(data, header, tuple(features), id_column)
        ids.append(row_ids)
        return X
    scored = _named(kind.predict(model_path, result, rows), config)
    if id_column is None or not ids:
        return scored
    return [{id_column: str(i), **{k: v for k, v in row.items() if k != "row"}} for i, row in zip(ids[-1], scored)]


def _named(scored: list[dict], config: Config) -> list[dict]:
    """A binary model's 0/1 `prediction` as the class it stands for: the site's [data] positive
    class and the label's other value (the score column stays P(positive))."""
    from fedpeer.app.jobtext import site_class_names

    binary = scored and "score" in scored[0] and all(type(r.get("prediction")) is int for r in scored)
    names = site_class_names(config) if binary else None
    if names is None:
        return scored
    return [{**r, "prediction": names[r["prediction"]]} for r in scored]


def export_model(config: Config, job_id: str) -> tuple[dict, str]:
    """`fedpeer export`: a job's stored model as JSON (the kind's `export`: logreg as scikit-learn
    LogisticRegression's attributes, mlp as MLPClassifier's weights with the mean and scale its
    inputs are standardised with, tree as scikit-learn's tree arrays, xgboost as xgboost's own
    JSON model), after the same checks as predict (the record says done, the file's SHA-256 is the
    record's, the model is valid); and one line on what it is and how to load it."""
    from fedpeer.kinds.catalog import job_kinds

    record_path, record, kind = _stored(config, job_id)
    if kind.export is None:
        exporting = [name for name, k in job_kinds().items() if k.export is not None]
        raise JobError(f"job {job_id} is a {record['kind']} job; only {' and '.join(exporting)} models export")
    result = record.get("result") or {}
    if record["state"] != "done" or not result.get("model_file"):
        raise JobError(f"job {job_id} has no stored model (state {record['state']})")
    model_path = record_path.parent / kind.model_file
    if not isinstance(result.get("model_file_sha256"), str):
        raise JobError(f"{record_path}: the job record holds no model_file_sha256 to check {model_path} against")
    _check_file_sha256(model_path, result["model_file_sha256"])
    note = kind.export_note(result) if kind.export_note is not None else f"the {kind.name} model as JSON arrays"
    return kind.export(model_path, result), note


def _stored(config: Config, job_id: str) -> tuple[Path, dict, Any]:
    """A job's record file, its record, and its kind."""
    from fedpeer.kinds.catalog import job_kinds

    record_path = config.node.state_dir / "jobs" / job_id / "job.json"
    record = read_json(record_path)
    if record is None:
        raise JobError(f"no job {job_id!r} in {config.node.state_dir / 'jobs'}")
    kind = job_kinds().get(record.get("kind"))
    if kind is None:
        raise JobError(f"job {job_id} is of kind {record.get('kind')!r}, which this build of fedpeer does not know")
    return record_path, record, kind


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


def _rows(data: Path, header: list[str], features: tuple[str, ...],
          id_column: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The CSV's values of the model's feature columns, in the model's column order, and each
    row's value of `id_column` (read as a label is: text, checked; None: the row numbers)."""
    check_columns(data, header, features, id_column)
    label = id_column if id_column is not None and id_column not in features else None
    ignore = tuple(c for c in header if c not in features and c != label)
    dataset = load_csv(DataSpec(csv=data, label=label, ignore=ignore), binary=False)
    X = dataset.X[:, [dataset.features.index(f) for f in features]]
    if label is not None:
        return X, dataset.labels
    if id_column is not None:     # the ID is also one of the model's features
        return X, np.array([f"{v:g}" for v in X[:, features.index(id_column)]])
    return X, np.arange(1, len(X) + 1)


def check_columns(data: Path, header: list[str], features: Sequence[str], id_column: str | None = None) -> None:
    """The model's columns are found in `data` by name (their order there does not matter), or a
    one-line refusal naming every missing one and the columns `data` has that the model lacks."""
    twice = sorted({c for c in header if header.count(c) > 1 and c in (*features, id_column)})
    if twice:
        raise DataError(f"{data}: column(s) {', '.join(twice)} appear more than once in the header: "
                        "which one the model reads is ambiguous; rename or drop the copies")
    missing = [f for f in features if f not in header]
    if missing:
        extra = [c for c in header if c not in features and c != id_column]
        raise DataError(f"{data}: lacks {len(missing)} of the model's {len(features)} feature columns: "
                        f"{', '.join(missing)}" + (f"; columns the model does not know: {', '.join(extra)}"
                                                   if extra else "") + " (columns are matched by name)")


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [c.strip() for c in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read the header: {exc}") from None
