"""A site's [data] as a job loads it (`fedpeer data check` reports it: fedpeer/app/datacheck.py).

`load_site` is the one way a job (fedpeer/jobs/lifecycle/admission.py) and `fedpeer data check` load the
site's rows, so that what the check prints is what a job would see. It blocks (parsing, imputing):
the daemon calls it in a worker thread, never on its event loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpeer.config.load import DataSection, JobLimits
from fedpeer.data.dataset import Dataset, DataSpec, load_data
from fedpeer.data.spec import schema_difference
from fedpeer.errors import DataError

__all__ = ["spec_for", "load_site"]


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
              binary: bool, rows_min: int = 0, ids_max: int = 1_000_000) -> tuple[Any, Dataset | None]:
    """(rows of csv, rows of test_csv or None). Blocking. With missing = "impute", test_csv's gaps are
    filled by the imputer fitted on csv's rows (never on test rows). With engine = "dask" the first is
    a DaskSite (fedpeer/data/dask.py: the rows stay on the site's cluster; the caller closes it);
    test_csv, a held-out file, is loaded in memory either way. With partition = "vertical" the first
    is a VerticalBlock (fedpeer/data/vertical.py: the site's columns and each row's ID; no label is
    needed, none is a feature), whose intersection with the other sites' IDs a job refuses below
    `rows_min` rows ([policy] rows_min), as it refuses a member announcing more than `ids_max` IDs."""
    if data.partition == "vertical":
        from fedpeer.data.vertical import load_vertical

        return load_vertical(spec_for(data, needs_label=False), data.id_column, rows_max=limits.data_rows_max,
                             bytes_max=limits.data_bytes_max, aligned_rows_min=rows_min,
                             aligned_ids_max=ids_max), None
    spec = spec_for(data, needs_label=needs_label) if data.engine != "dask" else None

    def load(spec: DataSpec, impute_from: Dataset | None = None) -> Dataset:
        return load_data(spec, binary=binary, rows_max=limits.data_rows_max, bytes_max=limits.data_bytes_max,
                        impute_from=impute_from)
    if spec is None:
        from fedpeer.data.dask import open_site

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

    spec = spec_for(replace(data, csv=data.test_csv, parquet=""), needs_label=needs_label)
    test = load_data(spec, binary=binary, rows_max=limits.data_rows_max, bytes_max=limits.data_bytes_max)
    if test.fingerprint != site.fingerprint:
        raise DataError(f"{data.test_csv}: [data] test_csv has other columns than {data.csv or data.parquet}: "
                        + schema_difference(site.features, list(test.features), "test_csv", "csv"))
    return test


