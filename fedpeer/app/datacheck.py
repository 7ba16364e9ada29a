"""`fedpeer data check`: this site's [data] loaded as a job loads it (fedpeer/data/site.py
`load_site`), described for its operator: rows, features, label balance, missing values, the schema
fingerprint, and what the binary job kinds would say of the label."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpeer.config.load import DataSection, JobLimits
from fedpeer.data.dataset import Dataset, binary_label_problem
from fedpeer.data.site import load_site
from fedpeer.data.spec import near_column
from fedpeer.kinds.catalog import job_kinds

__all__ = ["report", "format_report"]


def report(data: DataSection, limits: JobLimits) -> dict[str, Any]:
    """What `fedpeer data check` prints: the site's rows as a job that uses the label would load them
    (any number of classes), or without a label when [data] has none."""
    needs_label = bool(data.label) and data.partition != "vertical"    # a vertical site's label is no feature
    dataset, test = load_site(data, limits, needs_label=needs_label, binary=False)
    try:
        doc = _describe(dataset, data.csv or data.parquet or "[data] sql", count_labels=needs_label)
        doc["bounds"] = _bounds(data, dataset)
    finally:
        if getattr(dataset, "engine", "memory") == "dask":
            dataset.close()
    if data.engine == "dask":
        doc["engine"], doc["scheduler"], doc["partitions"] = "dask", data.scheduler, len(dataset.part_rows)
    doc["missing_policy"] = data.missing
    if data.partition == "vertical":      # its rows are aligned with the other sites' by a job
        doc["partition"], doc["id_column"] = "vertical", data.id_column
    if needs_label:       # what a job that needs two classes (stats, bofrf) would say of the label
        doc["binary_jobs"] = [name for name, kind in job_kinds().items() if kind.binary_label and kind.needs_data]
        doc["binary_refusal"] = binary_label_problem(doc["source"], data.label, data.positive or None,
                                                     sorted(doc["label_counts"]), doc["rows"])
    if test is not None:
        doc["test_csv"] = _describe(test, data.test_csv, count_labels=needs_label)
    return doc


def _describe(ds: Any, source: str, *, count_labels: bool) -> dict[str, Any]:
    if getattr(ds, "engine", "memory") == "dask":     # counted on the cluster, per partition
        values = sorted(ds.label_counts)
        counts = [ds.label_counts[v] for v in values]
    elif count_labels:
        values, counts = np.unique(ds.labels, return_counts=True)
    else:                                              # a vertical site has no labels loaded
        values, counts = np.array([]), np.array([])
    return {
        "source": source,
        "rows": ds.rows,
        "features": list(ds.features),
        "schema_fingerprint": ds.fingerprint.hex(),
        "label_counts": {str(v): int(c) for v, c in zip(values, counts)} if count_labels else {},
        "missing": _missing(ds),
        "rows_dropped": ds.rows_dropped,
        "cells_imputed": ds.cells_imputed,
    }


def _bounds(data: DataSection, ds: Any) -> dict[str, Any]:
    """[data] bounds against the features: the columns without bounds (a DP job that needs them
    refuses), names that are no feature (a typo: with the nearest feature), and per column the
    rows outside its bounds (they fall in the first or last bin; memory engine only)."""
    features = list(ds.features)
    out: dict[str, Any] = {"declared": len(data.bounds), "missing": [f for f in features if f not in data.bounds],
                           "unknown": {name: near_column(name, features) for name in data.bounds
                                       if name not in features}}
    if getattr(ds, "engine", "memory") == "memory" and data.bounds:
        X = np.asarray(ds.X)
        out["outside"] = {f: int(np.count_nonzero((X[:, j] < data.bounds[f][0]) | (X[:, j] > data.bounds[f][1])))
                          for j, f in enumerate(features) if f in data.bounds}
    return out


def _missing(ds: Dataset) -> dict[str, int]:
    """Missing (or infinite) values per feature column as the file holds them: counted before the
    policy acts (dropped rows and imputed cells are counted here; the loaded matrix has none)."""
    return dict(ds.missing_counts) if ds.missing_counts else {name: 0 for name in ds.features}


def format_report(doc: dict[str, Any]) -> str:
    lines = [f"{doc['source']}: {doc['rows']} rows, {len(doc['features'])} features "
             f"(missing = \"{doc['missing_policy']}\")"]
    if doc.get("engine") == "dask":
        lines.append(f"engine dask: {doc['partitions']} partitions on {doc['scheduler']}")
    if doc.get("partition") == "vertical":
        lines.append(f"partition vertical: one row per ID of column {doc['id_column']!r} (every ID once); a job "
                     "aligns them with the other sites' by a private set intersection")
    lines += _body(doc)
    lines += _bounds_lines(doc.get("bounds"), len(doc["features"]))
    if doc.get("binary_refusal"):
        lines.append(f"binary jobs ({', '.join(doc['binary_jobs'])}) would refuse it: {doc['binary_refusal']}")
    if "test_csv" in doc:
        test = doc["test_csv"]
        lines.append(f"test_csv {test['source']}: {test['rows']} rows")
        lines += ["  " + line for line in _body(test)]
    return "\n".join(lines)


def _bounds_lines(b: dict[str, Any] | None, n_features: int) -> list[str]:
    if b is None:
        return []
    if not b["declared"]:
        return ["public bounds ([data] bounds): none; a DP histogram xgboost or tree job (dp_epsilon) would be refused"]
    lines = [f"public bounds ([data] bounds): {n_features - len(b['missing'])} of {n_features} features"
             + (f"; without: {', '.join(b['missing'][:10])}" + (" ..." if len(b["missing"]) > 10 else "")
                if b["missing"] else "")]
    for name, near in b["unknown"].items():
        lines.append(f"  [data] bounds names {name!r}, which is no feature{near}")
    outside = {k: v for k, v in (b.get("outside") or {}).items() if v}
    if outside:
        lines.append("  rows outside their bounds (they fall in the first or last bin): "
                     + ", ".join(f"{k} {v}" for k, v in outside.items()))
    return lines


def _body(doc: dict[str, Any]) -> list[str]:
    lines = [f"schema fingerprint: {doc['schema_fingerprint']}"]
    if doc["label_counts"]:
        total = sum(doc["label_counts"].values())
        lines.append("label balance: " + ", ".join(f"{k!r} {v} ({100 * v / total:.1f} %)"
                                                   for k, v in doc["label_counts"].items()))
    if doc["rows_dropped"]:
        lines.append(f"rows dropped for missing values: {doc['rows_dropped']}")
    if doc["cells_imputed"]:
        lines.append(f"values imputed (site-local IterativeImputer): {doc['cells_imputed']}")
    gaps = {k: v for k, v in doc["missing"].items() if v}
    lines.append("missing values per column: " + (", ".join(f"{k} {v}" for k, v in gaps.items()) if gaps
                                                  else f"none in any of the {len(doc['features'])} columns"))
    return lines
