"""[data] parquet: a file or a directory of part files -> what `csvtext.read_csv` gives for a CSV
with the same columns (same names, same fingerprint), column types from the file's schema.

Integers, floats and booleans are features; a dictionary (categorical), text, date or time column
is refused with the fix. The matrix is allocated once from the row counts in the metadata and
filled row group by row group (data/sources/csv_arrow.py's staged fill), the next group decoded meanwhile; a
text label is read as a dictionary and coded group by group.
"""

from __future__ import annotations

import bisect
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fedpeer.data.sources.csv_arrow import _DictCodes, _fill, _label_codes
from fedpeer.data.spec import DataSpec, need_extra
from fedpeer.errors import DataError


class _ParquetRows:
    """Rows of a Parquet source are named by their 1-based position ("row N"); there are no lines.
    In a directory of several part files, also the part file and the row in it. all_finite: every
    value of X was found finite while filling it."""

    def __init__(self, all_finite: bool = False, files: list | None = None, starts: list[int] | None = None) -> None:
        self.all_finite = all_finite
        self._files, self._starts = files or [], starts or []

    def where(self, index: int) -> str:
        if len(self._files) < 2:
            return f"row {index + 1}"
        k = bisect.bisect_right(self._starts, index) - 1
        return f"row {index + 1} (row {index - self._starts[k] + 1} of {self._files[k].name})"


def _parquet_files(path) -> list:
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(("_", "."))
                       and p.suffix in (".parquet", ".parq", ".pq", ""))
        if not files:
            raise DataError(f"{path}: directory holds no Parquet part files (*.parquet); point parquet at "
                            "the file or the directory of the extract")
        return files
    return [path]


def _column_kind(t) -> str:
    import pyarrow as pa

    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    if pa.types.is_dictionary(t):
        return "dictionary"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "text"
    if pa.types.is_temporal(t):
        return "time"
    return "other"


def read_parquet(spec: DataSpec, rows_max: int, bytes_max: int) -> tuple[Any, ...]:
    """(features, X, codes, uniques, rows) of a Parquet source, as `csvtext.read_csv` gives them for a CSV
    with the same columns (same names, same fingerprint). Raises DataError naming the source, the
    column and the fix."""
    need_extra("pyarrow.parquet", "parquet", "[data] parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fedpeer.data.spec import check_columns

    path = spec.parquet
    if not path.exists():
        raise DataError(f"{path}: file not found; check the data path in the job or site configuration")
    files = _parquet_files(path)
    try:
        size = sum(os.stat(f).st_size for f in files)
    except OSError as e:
        raise DataError(f"{path}: cannot be read: {e.strerror or e}") from None
    if size > bytes_max:
        raise DataError(f"{path}: is {size} bytes, more than the limit of {bytes_max} bytes (bytes_max); "
                         "use a sample of the data or raise the limit")
    metas = []
    for f in files:
        where = path if f == path else f"{path}: part file {f.name}"
        try:
            metas.append(pq.read_metadata(f))
        except PermissionError:
            raise DataError(f"{where}: cannot be read (permission denied); let the fedpeer user read it") from None
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{where}: is not a readable Parquet file ({e}); write it with pyarrow, pandas "
                             "(to_parquet) or Spark, or use csv") from None
    schema = metas[0].schema.to_arrow_schema()
    for f, meta in zip(files[1:], metas[1:]):
        other = meta.schema.to_arrow_schema()
        if not other.equals(schema):
            raise DataError(f"{path}: part file {f.name} has other columns or types than {files[0].name} "
                             f"({_schema_difference(other, schema)}); every part file must have the same schema")
    header = list(schema.names)
    check_columns(path, header, spec)
    if spec.label is not None and spec.label in spec.ignore:
        raise DataError(f"{path}: the label column {spec.label!r} is also listed in ignore; remove it from ignore")
    features = tuple(n for n in header if n != spec.label and n not in set(spec.ignore))
    if not features:
        raise DataError(f"{path}: no feature columns left (all columns are the label or ignored)")
    for name in features:
        t = schema.field(name).type
        kind = _column_kind(t)
        if kind == "number":
            continue
        fix = {"dictionary": "is categorical (dictionary-encoded) in the Parquet schema; encode it as numbers "
                             "(for example one column per category) or add it to ignore",
               "text": "is text in the Parquet schema; encode it as numbers or add it to ignore (an identifier?)",
               "time": "is a date or time in the Parquet schema; turn it into a number (for example days since "
                       "an event) or add it to ignore"}.get(kind, "is not a number column in the Parquet schema; "
                                                                   "cast it to a number or add it to ignore")
        raise DataError(f"{path}: column {name!r} ({t}) {fix}",
                        public=f"column {name!r} is not a number column in its data; make it one, or add it "
                        "to [data] ignore there")
    label_text = None
    if spec.label is not None:
        t = schema.field(spec.label).type
        value_type = t.value_type if pa.types.is_dictionary(t) else t
        if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
            label_text = _label_from_text
        elif pa.types.is_integer(value_type):
            label_text = _label_from_int
        elif pa.types.is_boolean(value_type):
            label_text = _label_from_bool
        else:
            raise DataError(f"{path}: label column {spec.label!r} is {t} in the Parquet schema; a label must be "
                             "text, an integer or a boolean (the class)")
    n = sum(meta.num_rows for meta in metas)
    if n > rows_max:
        raise DataError(f"{path}: has more than {rows_max} data rows (rows_max); use a sample of the data or "
                         "raise the limit")
    if n == 0 and not spec.empty_ok:
        raise DataError(f"{path}: has columns but no data rows")
    columns = list(features) + ([spec.label] if spec.label is not None else [])
    # Row group by row group into a matrix allocated once (the row count is in the metadata): memory
    # is the matrix plus one row group, not a whole table beside the matrix.
    X = np.empty((n, len(features)), dtype=np.float64)
    label_chunks: list = []
    # a text label is read as a dictionary and coded group by group (see _DictCodes)
    dict_codes = _DictCodes(n, label_text) if label_text is _label_from_text else None
    read_dictionary = [spec.label] if dict_codes is not None else None
    start, finite, coded, reading = 0, True, 0, files[0]
    try:
        groups = []
        for reading in files:
            part = pq.ParquetFile(reading, read_dictionary=read_dictionary)
            groups += [(reading, part, g) for g in range(part.num_row_groups)]
        with ThreadPoolExecutor(1, thread_name_prefix="parquet-read") as ahead:   # the next group reads
            pending = ahead.submit(_read_group, *groups[0][1:], columns) if groups else None   # while this fills
            for k in range(len(groups)):
                reading = groups[k][0]
                table = pending.result()
                if k + 1 < len(groups):
                    pending = ahead.submit(_read_group, *groups[k + 1][1:], columns)
                if start + table.num_rows > n:
                    raise DataError(f"{path}: holds more rows than its metadata says; write it again")
                if spec.label is not None:
                    for chunk in table.column(spec.label).chunks:
                        if dict_codes is not None:
                            coded = dict_codes.add(coded, chunk)
                        else:
                            label_chunks.append(chunk.cast(chunk.type.value_type)
                                                if pa.types.is_dictionary(chunk.type) else chunk)
                    table = table.drop_columns([spec.label])
                start, finite_group = _fill(X, start, table.to_batches())
                finite = finite and finite_group
                del table
    except (pa.ArrowException, OSError) as e:
        where = path if reading == path else f"{path}: part file {reading.name}"
        raise DataError(f"{where}: reading failed ({e}); write the file again or use csv") from None
    if start != n:
        raise DataError(f"{path}: holds fewer rows than its metadata says; write it again")
    if dict_codes is not None:
        codes, uniques = dict_codes.codes, dict_codes.uniques
    elif spec.label is not None:
        column = pa.chunked_array(label_chunks, type=label_chunks[0].type if label_chunks else pa.string())
        codes, uniques = _label_codes(column, label_text)
    else:
        uniques, codes = [""], np.zeros(n, dtype=np.int64)
    starts = np.cumsum([0] + [meta.num_rows for meta in metas[:-1]]).tolist()
    return features, X, codes, uniques, _ParquetRows(all_finite=finite, files=files, starts=starts)


def _schema_difference(other, schema) -> str:
    """The first column that differs between two part files' Arrow schemas, in words."""
    theirs, ours = dict(zip(other.names, other.types)), dict(zip(schema.names, schema.types))
    for name in schema.names:
        if name not in theirs:
            return f"no column {name!r}"
        if theirs[name] != ours[name]:
            return f"column {name!r} is {theirs[name]}, not {ours[name]}"
    for name in other.names:
        if name not in ours:
            return f"an extra column {name!r}"
    return "the same columns in another order"


def _read_group(part, group: int, columns: list[str]):
    return part.read_row_group(group, columns=columns, use_threads=True)


def _label_from_text(value: str | None) -> str:
    return "" if value is None else value.strip()


def _label_from_int(value: int | None) -> str:
    return "" if value is None else str(value)


def _label_from_bool(value: bool | None) -> str:
    return "" if value is None else str(value)          # "True" / "False", as pandas writes them to CSV
