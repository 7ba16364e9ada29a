"""A site's [data] as a job loads it, and `fedpeer data check`'s report of it.

`load_site` is the one way a job (fedpeer/jobs/admission.py) and `fedpeer data check` load the
site's rows, so that what the check prints is what a job would see. It blocks (parsing, imputing):
the daemon calls it in a worker thread, never on its event loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .config import DataSection, JobLimits
from .errors import DataError
from .ml.data import Dataset, DataSpec, load_data

__all__ = ["spec_for", "load_site", "report", "format_report"]


def spec_for(data: DataSection, *, needs_label: bool) -> DataSpec:
    """The DataSpec of [data] for a job that needs the label (or not: clustering; a configured label
    column is then not a feature either)."""
    where = {"csv": Path(data.csv)} if data.csv else {"csv": None, "parquet": Path(data.parquet)} \
        if data.parquet else {"csv": None, "sql": data.sql, "dsn_file": Path(data.dsn_file),
                              "sql_timeout_ms": data.sql_timeout_ms}
    if needs_label:
        return DataSpec(**where, label=data.label, positive=data.positive or None,
                        ignore=tuple(data.ignore), missing=data.missing)
    label = (data.label,) if data.label and data.label not in data.ignore else ()
    return DataSpec(**where, label=None, ignore=(*data.ignore, *label), missing=data.missing)


def load_site(data: DataSection, limits: JobLimits, *, needs_label: bool,
              binary: bool) -> tuple[Any, Dataset | None]:
    """(rows of csv, rows of test_csv or None). Blocking. With missing = "impute", test_csv's gaps are
    filled by the imputer fitted on csv's rows (never on test rows). With engine = "dask" the first is
    a DaskSite (fedpeer/ml/dasksite.py: the rows stay on the site's cluster; the caller closes it);
    test_csv, a held-out file, is loaded in memory either way."""
    spec = spec_for(data, needs_label=needs_label) if data.engine != "dask" else None

    def load(spec: DataSpec, impute_from: Dataset | None = None) -> Dataset:
        return load_data(spec, binary=binary, rows_max=limits.data_rows_max, bytes_max=limits.data_bytes_max,
                        impute_from=impute_from)
    if spec is None:
        from .ml.dasksite import open_site

        dataset = open_site(data, limits, needs_label=needs_label, binary=binary)
        try:
            return dataset, _dask_test(data, limits, dataset, needs_label=needs_label, binary=binary)
        except BaseException:
            dataset.close()
            raise
    dataset = load(spec)
    test = None
    if data.test_csv:
        from dataclasses import replace

        from .jobs.admission import schema_difference
        test = load(replace(spec, csv=Path(data.test_csv), parquet=None, sql=None), dataset)
        if test.fingerprint != dataset.fingerprint:
            raise DataError(f"{data.test_csv}: [data] test_csv has other columns than "
                            f"{data.csv or data.parquet or '[data] sql'}: "
                            + schema_difference(dataset.features, list(test.features), "test_csv", "csv"))
    return dataset, test


def _dask_test(data: DataSection, limits: JobLimits, site: Any, *, needs_label: bool,
               binary: bool) -> Dataset | None:
    if not data.test_csv:
        return None
    from dataclasses import replace

    from .jobs.admission import schema_difference
    spec = spec_for(replace(data, csv=data.test_csv, parquet=""), needs_label=needs_label)
    test = load_data(spec, binary=binary, rows_max=limits.data_rows_max, bytes_max=limits.data_bytes_max)
    if test.fingerprint != site.fingerprint:
        raise DataError(f"{data.test_csv}: [data] test_csv has other columns than {data.csv or data.parquet}: "
                        + schema_difference(site.features, list(test.features), "test_csv", "csv"))
    return test


def report(data: DataSection, limits: JobLimits) -> dict[str, Any]:
    """What `fedpeer data check` prints: the site's rows as a job that uses the label would load them
    (any number of classes), or without a label when [data] has none."""
    needs_label = bool(data.label)
    dataset, test = load_site(data, limits, needs_label=needs_label, binary=False)
    try:
        doc = _describe(dataset, data.csv or data.parquet or "[data] sql", count_labels=needs_label)
    finally:
        if getattr(dataset, "engine", "memory") == "dask":
            dataset.close()
    if data.engine == "dask":
        doc["engine"], doc["scheduler"], doc["partitions"] = "dask", data.scheduler, len(dataset.part_rows)
    doc["missing_policy"] = data.missing
    if needs_label:       # what a job that needs two classes (stats, bofrf) would say of the label
        from .jobs.kinds import job_kinds
        from .ml.data import binary_label_problem

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
    else:
        values, counts = np.unique(ds.labels, return_counts=True)
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


def _missing(ds: Dataset) -> dict[str, int]:
    """Missing (or infinite) values per feature column as the file holds them: counted before the
    policy acts (dropped rows and imputed cells are counted here; the loaded matrix has none)."""
    return dict(ds.missing_counts) if ds.missing_counts else {name: 0 for name in ds.features}


def format_report(doc: dict[str, Any]) -> str:
    lines = [f"{doc['source']}: {doc['rows']} rows, {len(doc['features'])} features "
             f"(missing = \"{doc['missing_policy']}\")"]
    if doc.get("engine") == "dask":
        lines.append(f"engine dask: {doc['partitions']} partitions on {doc['scheduler']}")
    lines += _body(doc)
    if doc.get("binary_refusal"):
        lines.append(f"binary jobs ({', '.join(doc['binary_jobs'])}) would refuse it: {doc['binary_refusal']}")
    if "test_csv" in doc:
        test = doc["test_csv"]
        lines.append(f"test_csv {test['source']}: {test['rows']} rows")
        lines += ["  " + line for line in _body(test)]
    return "\n".join(lines)


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
