"""`fedpeer predict`: score new rows with a job's stored model, locally (no daemon needed).

The model is read from this site's state directory (validated arrays, never pickle); the CSV is
read by the same checked reader as job data, keeping only the model's feature columns.
"""

from __future__ import annotations

import csv
from pathlib import Path

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
    from . import bofrf
    model = bofrf.load_model(model_path)
    forest = model[0]
    header = _header(data)
    missing = [f for f in forest.features if f not in header]
    if missing:
        raise DataError(f"{data}: lacks the model's feature column(s) {missing[:10]}")
    ignore = tuple(c for c in header if c not in forest.features)
    dataset = load_csv(DataSpec(csv=data, label=None, ignore=ignore), binary=False)
    scores = bofrf.predict(model, dataset.X, dataset.features)
    return [{"row": i + 1, "score": float(s), "prediction": int(s > 0)} for i, s in enumerate(scores)]


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [c.strip() for c in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read the header: {exc}") from None
