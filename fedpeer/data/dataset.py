"""A site's private data -> a checked, numeric `Dataset`: the one layer behind `[data]`.

Every source ends in `_finish` with the same checks: a CSV read by pyarrow (data/sources/csv_arrow.py) or, when
pyarrow cannot vouch for the result, by the Python parser (data/sources/csv_text.py); Parquet (data/sources/parquet.py);
a PostgreSQL query (data/sources/sql.py).

Rules of this module:
- Every problem with the data is a `DataError` whose message names the file and, where it
  applies, the column, the first offending row and how to fix it. Rows are given twice:
  "data row N" counts data rows from 1 below the header (row N+1 in a spreadsheet that shows the
  header as row 1), "line L" is the physical line of the file (they differ when there are blank
  lines or quoted values spanning lines).
- The file is read once, streaming, and never beyond `bytes_max` bytes or `rows_max` rows.
- Features are every column except the label and the `ignore`d ones, in file order. A constant
  column stays: the schema (and its fingerprint) must be identical at every site.
- Missing values are empty, NA, N/A, NaN, null and ? (any case, surrounding spaces allowed);
  +/-Inf (including overflowing numbers such as 1e999) is treated like a missing value.
- missing = "impute" fills missing feature values site-locally: scikit-learn's IterativeImputer
  (MICE) fitted on this site's own rows only; a test file is filled by the imputer fitted on the
  site's data file (`load_csv(..., impute_from=train)`), never fitted on test rows; a job that
  splits off its own test rows (`split_train_test`) fits the imputer again on its training part
  and fills the test part with that one. A row whose label is missing is still dropped (and
  counted): a label is never imputed.
- Pure: no logging, no global state (the csv module's field size limit is left alone).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedpeer.data.spec import (  # noqa: F401  (DataSpec, MISSING_TOKENS, check_columns: importable from here too)
    _LIST_MAX,
    MISSING_POLICIES,
    MISSING_TOKENS,
    DataSpec,
    RowPlaces,
    _is_missing_label,
    _NeedLines,
    _quote_list,
    check_columns,
)
from fedpeer.errors import DataError

__all__ = ["DataSpec", "Dataset", "schema_fingerprint", "load_csv", "load_data", "split_train_test"]


FEATURE_TYPE_FLOAT = "float"
# A label is a class name; longer values are refused (they would bloat the labels array).
LABEL_CHARS_MAX = 256

_SCHEMA_VERSION = b"fedpeer.schema.v1\x00"


@dataclass(frozen=True, eq=False)
class Dataset:
    """Checked local data. Arrays are read-only; copy before changing them. Equality is identity."""

    features: tuple[str, ...]          # ordered feature column names (CSV order, minus label and ignored)
    X: np.ndarray                      # float64 (rows, features), finite
    y: np.ndarray | None               # int8 0/1 when a positive class is given, else None
    labels: np.ndarray                 # the raw label values as str (rows,), surrounding spaces stripped
    rows_dropped: int                  # rows dropped for missing values while loading
    fingerprint: bytes                 # 32 bytes: schema_fingerprint(features, types)
    cells_imputed: int = 0             # missing = "impute": feature values filled in while loading
    missing_counts: tuple[tuple[str, int], ...] = ()   # (feature, missing or infinite values in the file)
    imputer: Any = field(default=None, repr=False)   # the fitted IterativeImputer, if one was needed
    gaps: np.ndarray | None = field(default=None, repr=False)   # bool (rows, features): the cells an
    # imputer fitted on these rows filled (None: none, or filled by another Dataset's imputer), so
    # that split_train_test can fit one on the training part alone
    # [data] partition: a Dataset holds the same columns as the other sites (fedpeer/data/vertical.py:
    # the vertical block)
    partition: ClassVar[str] = "horizontal"

    @property
    def rows(self) -> int:
        return int(self.X.shape[0])


def schema_fingerprint(features: Sequence[str], types: Sequence[str]) -> bytes:
    """SHA-256 of the ordered (name, type) pairs. Equal fingerprints <=> same columns, same order.

    Encoding: version prefix, pair count (8 bytes big-endian), then for each name and each type its
    UTF-8 length (8 bytes big-endian) and bytes. No separator can be forged by a column name.
    """
    features, types = list(features), list(types)
    if len(features) != len(types):
        raise ValueError(f"{len(features)} feature names but {len(types)} types")
    if not all(isinstance(s, str) for s in features + types):
        raise TypeError("feature names and types must be str")
    h = hashlib.sha256(_SCHEMA_VERSION)
    h.update(len(features).to_bytes(8, "big"))
    for name, typ in zip(features, types):
        for text in (name, typ):
            raw = text.encode("utf-8")
            h.update(len(raw).to_bytes(8, "big"))
            h.update(raw)
    return h.digest()


# ---------------------------------------------------------------------------------------------
# Loading.


def load_data(spec: DataSpec, *, binary: bool = True, rows_max: int = 10_000_000,
              bytes_max: int = 2 * 1024**3, impute_from: Dataset | None = None) -> Dataset:
    """`load_csv` or, for `spec.parquet`, `parquetsource.read_parquet`: the same checked Dataset either way."""
    if spec.sql is not None:
        from fedpeer.data.sources import sql as sqlsource

        return _finish(spec, binary, *sqlsource.read_sql(spec, rows_max, bytes_max), impute_from=impute_from)
    if spec.parquet is None:
        return load_csv(spec, binary=binary, rows_max=rows_max, bytes_max=bytes_max, impute_from=impute_from)
    if rows_max < 1 or bytes_max < 1:
        raise ValueError("rows_max and bytes_max must be positive")
    from fedpeer.data.sources import parquet as parquetsource

    return _finish(spec, binary, *parquetsource.read_parquet(spec, rows_max, bytes_max), impute_from=impute_from)


def load_csv(spec: DataSpec, *, binary: bool = True, rows_max: int = 10_000_000,
             bytes_max: int = 2 * 1024**3, impute_from: Dataset | None = None) -> Dataset:
    """Read and check `spec.csv`. `binary`: the label must have exactly two values, one of them
    `spec.positive`. Raises DataError for every problem with the file or the spec.
    `impute_from` (missing = "impute"): fill this file's missing values with the imputer of that
    Dataset (the site's training data) instead of fitting one on this file's rows.

    pyarrow's multi-threaded reader parses the file when it can say for sure that the result is what
    the Python parser below would give (`_arrow.read_csv`); on anything it rejects or cannot vouch
    for, and on every DataError, the Python parser reads the file again and decides, so that every
    message (file, column, "data row N, line L", the fix) is the one it has always been."""
    if spec.csv is None:
        return load_data(spec, binary=binary, rows_max=rows_max, bytes_max=bytes_max, impute_from=impute_from)
    if rows_max < 1 or bytes_max < 1:
        raise ValueError("rows_max and bytes_max must be positive")
    from fedpeer.data.sources import csv_arrow as _arrow

    try:
        fast = _arrow.read_csv(spec, rows_max, bytes_max)
    except DataError:
        fast = None
    if fast is not None:
        try:
            return _finish(spec, binary, *fast, impute_from=impute_from)
        except (DataError, _NeedLines):
            pass                      # the Python parser below gives the message, with its lines
    return _load_csv_python(spec, binary=binary, rows_max=rows_max, bytes_max=bytes_max, impute_from=impute_from)


def _load_csv_python(spec: DataSpec, *, binary: bool = True, rows_max: int = 10_000_000,
                     bytes_max: int = 2 * 1024**3, impute_from: Dataset | None = None) -> Dataset:
    """The Python parser's Dataset of `spec.csv` (data/sources/csv_text.py): today's result or today's message."""
    from fedpeer.data.sources import csv_text as csvtext

    return _finish(spec, binary, *csvtext.read_csv(spec, rows_max, bytes_max), impute_from=impute_from)


def _finish(spec: DataSpec, binary: bool, features: tuple[str, ...], X: np.ndarray, codes: np.ndarray,
            uniques: list[str], rows: RowPlaces, impute_from: Dataset | None = None) -> Dataset:
    path = spec.source
    n = X.shape[0]
    # Labels: judge each distinct value once.
    for code, value in enumerate(uniques):
        if len(value) > LABEL_CHARS_MAX:
            first = int(np.argmax(codes == code))
            raise DataError(f"{path}: label column {spec.label!r}: {rows.where(first)} has a value of "
                            f"{len(value)} characters (at most {LABEL_CHARS_MAX}); is {spec.label!r} "
                            "really the class column?")
    bad_label = np.array([spec.label is not None and _is_missing_label(v) for v in uniques], dtype=bool)
    label_missing = bad_label[codes]
    if getattr(rows, "all_finite", False) or np.isfinite(X).all():   # the common case: no masks
        nan_cells = inf_cells = np.broadcast_to(np.False_, X.shape)
        gap_counts = np.zeros(X.shape[1], dtype=np.int64)
        feature_bad = np.zeros(n, dtype=bool)
    else:
        nan_cells = np.isnan(X)
        inf_cells = np.isinf(X)
        gap_counts = nan_cells.sum(axis=0) + inf_cells.sum(axis=0)
        feature_bad = nan_cells.any(axis=1) | inf_cells.any(axis=1)
    impute = spec.missing == "impute"
    bad_rows = label_missing if impute else feature_bad | label_missing
    dropped = int(bad_rows.sum())
    if dropped and spec.missing == "error":
        problems = []
        for j, name in enumerate(features):
            for mask, what in ((nan_cells[:, j], "missing"), (inf_cells[:, j], "infinite")):
                count = int(mask.sum())
                if count:
                    problems.append(f"column {name!r} has {count} {what} value{'s' * (count != 1)} "
                                    f"(first at {rows.where(int(np.argmax(mask)))})")
        count = int(label_missing.sum())
        if count:
            problems.append(f"label column {spec.label!r} has {count} missing or infinite value"
                            f"{'s' * (count != 1)} (first at {rows.where(int(np.argmax(label_missing)))})")
        named = [f"column {name!r}" for j, name in enumerate(features)
                 if nan_cells[:, j].any() or inf_cells[:, j].any()]
        named += [f"label column {spec.label!r}"] if label_missing.any() else []
        gaps_named = ", ".join(named[:_LIST_MAX]) + (" and more" if len(named) > _LIST_MAX else "")
        more = len(problems) - _LIST_MAX
        text = "; ".join(problems[:_LIST_MAX]) + (f"; ... and {more} more columns" if more > 0 else "")
        tokens = "empty, NA, N/A, NaN, null or ?" if spec.csv is not None else "null or NaN"
        raise DataError(f"{path}: {text}. Missing means {tokens}. Fill them in, or "
                        f"set missing = \"drop\" to drop the rows that have one ({dropped} of {n})",
                        public=f"its data has missing or infinite values in {gaps_named}; fill them in there, or "
                        "set [data] missing = \"drop\" or \"impute\"")
    if dropped:
        if dropped == n and not spec.empty_ok:
            raise DataError(f"{path}: all {n} data rows have a missing or infinite value; nothing is left "
                            "after dropping them",
                            public="every data row of it has a missing or infinite value; nothing is left")
        keep = ~bad_rows
        X, codes = X[keep], codes[keep]
    imputed, imputer, gaps = 0, None, None
    if impute:
        X, gaps, imputer = _impute(path, features, X, impute_from)
        imputed = int(gaps.sum()) if gaps is not None else 0
        if impute_from is not None:
            gaps = None                  # filled by the training file's imputer: nothing to refit
    present = sorted(uniques[c] for c in np.flatnonzero(np.bincount(codes, minlength=len(uniques))))   # no sort
    if binary:
        problem = binary_label_problem(path, spec.label, spec.positive, present, X.shape[0])
        if problem is not None:
            raise DataError(problem, public=f"its label column {spec.label!r} does not hold the two classes a "
                                            "binary job needs (or [data] positive is not set)")
    y = None
    if spec.positive is not None:
        if spec.positive not in present:
            raise DataError(f"{path}: positive class {spec.positive!r} is not a value of label column "
                            f"{spec.label!r}; the values are {_quote_list(present)}",
                            public=f"[data] positive {spec.positive!r} is not a class of its label column "
                            f"{spec.label!r}; fix [data] positive")
        y = (codes == uniques.index(spec.positive)).astype(np.int8)
    labels = np.array(uniques, dtype=str)[codes]
    X = np.ascontiguousarray(X, dtype=np.float64)
    ds = _frozen(features, X, y, labels, dropped)
    if gaps is not None:
        gaps.setflags(write=False)
    return Dataset(ds.features, ds.X, ds.y, ds.labels, ds.rows_dropped, ds.fingerprint, imputed,
                   tuple(zip(features, map(int, gap_counts))), imputer, gaps)


def binary_label_problem(path: object, label: str | None, positive: str | None, present: Sequence[str],
                         rows: int) -> str | None:
    """Why a binary job refuses a label column whose distinct values are `present` (sorted), or
    None: it needs exactly two values and the positive class set (to one of them: _finish)."""
    if len(present) != 2:
        if len(present) == 1:
            why = (f"has only one value, {present[0]!r} (in all {rows} rows): no model can be "
                   "learned from one class; this site needs rows of both classes")
        else:
            why = (f"has {len(present)} distinct values ({_quote_list(present)}), a binary job "
                   "needs exactly two")
        return f"{path}: label column {label!r} {why}"
    if positive is None:
        return (f"{path}: a binary job needs the positive class: set positive to one of "
                f"{_quote_list(present)} (values of column {label!r})")
    return None


def _impute(path: Path, features: tuple[str, ...], X: np.ndarray,
            impute_from: Dataset | None) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """(X filled, the cells filled or None, the imputer): the missing and infinite values of X filled
    by an IterativeImputer (see _fit_imputer) fitted on the site's own training rows only: X itself,
    or the rows of `impute_from` (the training Dataset) for a test file. Never fitted on a test
    file's rows."""
    gaps = ~np.isfinite(X)
    if impute_from is not None and impute_from.features != features:
        raise DataError(f"{path}: its feature columns ({_quote_list(features)}) differ from those of the "
                        f"site's data file ({_quote_list(impute_from.features)}) whose imputer fills its "
                        "missing values; give both files the same columns")
    if not gaps.any():
        return X, None, impute_from.imputer if impute_from is not None else None
    X = np.where(gaps, np.nan, X)
    imputer = impute_from.imputer if impute_from is not None else None
    if imputer is None:
        imputer = _fit_imputer(f"{path}: ", "any row", features, X if impute_from is None else impute_from.X)
    filled = imputer.transform(X)
    return np.ascontiguousarray(filled, dtype=np.float64), gaps, imputer


def _fit_imputer(where: str, rows: str, features: tuple[str, ...], train: np.ndarray) -> Any:
    """An IterativeImputer (MICE, BayesianRidge per column, 10 rounds, seeded) fitted on `train`
    (NaN where a value is missing). A column with no value in `train` (`rows`) is refused."""
    empty = np.isnan(train).all(axis=0)
    if empty.any():
        name = features[int(np.argmax(empty))]
        raise DataError(f"{where}column {name!r} has no value in {rows}: nothing to impute it from; fill it in "
                        "or add it to ignore")
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.experimental import enable_iterative_imputer  # noqa: F401
    from sklearn.impute import IterativeImputer

    imputer = IterativeImputer(max_iter=10, random_state=0, keep_empty_features=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)    # 10 rounds are what MICE runs here
        imputer.fit(train)
    return imputer


def _frozen(features: tuple[str, ...], X: np.ndarray, y: np.ndarray | None, labels: np.ndarray,
            rows_dropped: int, fingerprint: bytes | None = None) -> Dataset:
    for a in (X, y, labels):
        if a is not None:
            a.setflags(write=False)
    if fingerprint is None:
        fingerprint = schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features))
    return Dataset(features, X, y, labels, rows_dropped, fingerprint)


# ---------------------------------------------------------------------------------------------
# Splitting.

def split_train_test(ds: Dataset, test_fraction: float, seed: int,
                     stratify: bool = True) -> tuple[Dataset, Dataset]:
    """(train, test): a random split, deterministic given `seed`, rows kept in file order.

    The test set has round(rows * test_fraction) rows, at least 1 and at most rows - 1. With
    `stratify` and a y, each class gets its share of the test rows to within one row (largest
    remainder). Both parts keep the features, fingerprint and rows_dropped of `ds`.

    missing = "impute": the cells `ds`'s imputer filled are filled again by an imputer fitted on the
    training part alone, so that no test row takes part in fitting it (the load fitted one on all
    of the site's rows).
    """
    in_test = split_mask(ds.X.shape[0], ds.y if stratify else None, test_fraction, seed)
    X, imputer = ds.X, ds.imputer
    if ds.gaps is not None:
        X = np.where(ds.gaps, np.nan, ds.X)
        imputer = _fit_imputer("", "the training part of this site's rows (its other rows went to the test "
                               "part)", ds.features, X[~in_test])

    def part(mask: np.ndarray) -> Dataset:
        rows = X[mask]
        gaps = None if ds.gaps is None else ds.gaps[mask]
        if gaps is not None and gaps.any():
            rows = np.ascontiguousarray(imputer.transform(rows), dtype=np.float64)
        ds_part = _frozen(ds.features, rows, None if ds.y is None else ds.y[mask], ds.labels[mask],
                          ds.rows_dropped, ds.fingerprint)
        if gaps is not None:
            gaps.setflags(write=False)
        return replace(ds_part, cells_imputed=0 if gaps is None else int(gaps.sum()),
                       missing_counts=ds.missing_counts, imputer=imputer, gaps=gaps)
    return part(~in_test), part(in_test)


def split_mask(n: int, y: np.ndarray | None, test_fraction: float, seed: int) -> np.ndarray:
    """bool (n,): the test rows of `split_train_test` (stratified by y when it is given); the Dask
    engine (fedpeer/data/dask.py) draws its split with it, so both engines split alike."""
    if not (isinstance(test_fraction, (int, float)) and 0.0 < test_fraction < 1.0):
        raise ValueError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction!r}")
    if n < 2:
        raise DataError(f"cannot split {n} data row{'s' * (n != 1)} into a train and a test set")
    n_test = min(max(math.floor(n * test_fraction + 0.5), 1), n - 1)
    rng = np.random.default_rng(seed)
    if y is not None:
        classes, inverse = np.unique(y, return_inverse=True)
        counts = np.bincount(inverse, minlength=len(classes))
        ideal = counts * (n_test / n)
        share = np.floor(ideal).astype(np.int64)
        short = n_test - int(share.sum())
        share[np.argsort(-(ideal - share), kind="stable")[:short]] += 1
        test = np.concatenate([rng.permutation(np.flatnonzero(inverse == c))[:share[c]]
                               for c in range(len(classes))])
    else:
        test = rng.permutation(n)[:n_test]
    in_test = np.zeros(n, dtype=bool)
    in_test[test] = True
    return in_test
