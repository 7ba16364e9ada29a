"""The fast path of `fedpeer.ml.data.load_csv`: pyarrow's multi-threaded CSV reader.

`read_csv` returns what `data._read` would return for the same file — the feature names, the
float64 matrix (NaN where a value is missing), the label codes and their distinct values in order of
first appearance — or None whenever it cannot vouch for that; `load_csv` then reads the file with
the Python parser, which gives today's result or today's exact message. It returns None when:

- the file is not a regular file, is empty, larger than bytes_max, or its header is not plain UTF-8
  CSV within its first 4 MiB (the header is read by the csv module, as the Python parser does);
- the header has an empty or duplicated name, or the label / ignore columns do not fit it;
- pyarrow rejects the file: a row with another number of fields, a feature value that is not a
  plain decimal number (or a missing token: empty, NA, N/A, NaN, null, ? in any case, without
  surrounding spaces — " NA " goes to the Python parser), invalid UTF-8 in a text column, an
  unterminated quote;
- a text column (label, ignored columns) holds a NUL character or a value of 131,072 characters or
  more (the csv module's field limit);
- there are no data rows, or more than rows_max.

Both readers follow the same CSV dialect (comma, double quote, "" inside quotes, CR, LF and CRLF
line ends, empty lines skipped, a UTF-8 byte-order mark skipped) and the same decimal-to-double
rounding (correctly rounded), which tests/unit/test_data_arrow.py checks on generated files. One
difference is left: a numeric field of 131,072 characters or more (such as 0.000...1 padded with
zeros) is refused by the csv module's field limit and read by pyarrow.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import stat
from typing import Any

import numpy as np

from .data import _BOM, MISSING_TOKENS, DataSpec, _NoLines, _open

_HEADER_BYTES_MAX = 4 << 20
_FIELD_CHARS_MAX = 131_072 - 1       # csv.field_size_limit()'s default; a longer text field -> Python
_BLOCK_BYTES = 4 << 20               # pyarrow's parse block (one chunk of every column per block)


def _case_forms(token: str) -> list[str]:
    forms = [""]
    for ch in token:
        forms = [f + c for f in forms for c in {ch.lower(), ch.upper()}]
    return forms


NULL_VALUES = sorted({form for token in MISSING_TOKENS for form in _case_forms(token)})
"""Every spelling of a missing token pyarrow must take as null (it compares exactly)."""


def _header(f) -> list[str] | None:
    """The header record as the csv module reads it (names not stripped), None if not sure."""
    raw = f.read(_HEADER_BYTES_MAX)
    whole = len(raw) < _HEADER_BYTES_MAX
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    if b"\x00" in raw or raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None
    try:
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(raw, final=whole)
    except UnicodeDecodeError:
        return None
    lines = io.StringIO(text, newline="")
    reader = csv.reader(lines)
    try:
        for record in reader:
            if record:
                break
        else:
            return None
    except csv.Error:
        return None
    if not whole and not text[:lines.tell()].endswith(("\n", "\r")):
        return None        # the record may go on beyond what was read
    return record


def read_csv(spec: DataSpec, rows_max: int, bytes_max: int) -> tuple[Any, ...] | None:
    """(features, X, codes, uniques, rows) as `data._read` gives them, or None (see the module)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv
    except ImportError:                 # pragma: no cover - a dependency; the Python parser still works
        return None
    path = spec.csv
    with _open(path) as f:              # today's messages for a missing or unreadable file
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= bytes_max:
            return None
        raw_header = _header(f)
    if raw_header is None:
        return None
    header = [name.strip() for name in raw_header]
    if any(not name or "\x00" in name for name in header) or len(set(header)) != len(header):
        return None
    if spec.label is not None and (spec.label not in header or spec.label in spec.ignore):
        return None
    if any(name not in header for name in spec.ignore):
        return None
    ignored = set(spec.ignore)
    feat_idx = [i for i, name in enumerate(header) if name != spec.label and name not in ignored]
    if not feat_idx:
        return None
    text_idx = [i for i in range(len(header)) if i not in set(feat_idx)]
    types = {raw_header[i]: pa.float64() for i in feat_idx}
    types.update({raw_header[i]: pa.string() for i in text_idx})
    try:
        table = pacsv.read_csv(
            str(path),
            read_options=pacsv.ReadOptions(use_threads=True, block_size=_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=",", quote_char='"', double_quote=True,
                                             escape_char=False, newlines_in_values=True,
                                             ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(check_utf8=True, column_types=types, null_values=NULL_VALUES,
                                                 strings_can_be_null=False, quoted_strings_can_be_null=True,
                                                 true_values=[], false_values=[], auto_dict_encode=False),
            memory_pool=pa.system_memory_pool())
    except (pa.ArrowException, OSError, ValueError):
        return None
    n = table.num_rows
    if table.column_names != raw_header or not 0 < n <= rows_max:
        return None
    if any(table.schema.field(i).type != pa.float64() for i in feat_idx):
        return None
    column = None
    for i in text_idx:
        column = table.column(i)
        if column.type != pa.string() or column.null_count:
            return None
        if n and (pc.max(pc.utf8_length(column)).as_py() >= _FIELD_CHARS_MAX
                  or pc.any(pc.match_substring(column, "\x00")).as_py()):
            return None

    # Labels: codes in order of first appearance of the stripped value, as the Python parser counts.
    if spec.label is not None:
        column = table.column(header.index(spec.label))
        distinct = pc.unique(column)
        raw_codes = pc.index_in(column, value_set=distinct).to_numpy(zero_copy_only=False)
        uniques: list[str] = []
        seen: dict[str, int] = {}
        remap = np.empty(len(distinct), dtype=np.int64)
        for k, value in enumerate(distinct.to_pylist()):
            value = value.strip()
            code = seen.get(value)
            if code is None:
                code = seen[value] = len(uniques)
                uniques.append(value)
            remap[k] = code
        codes = remap[raw_codes]
    else:
        uniques, codes = [""], np.zeros(n, dtype=np.int64)

    # The matrix, batch by batch, each batch let go once copied (the table never sits beside a full X).
    features = tuple(header[i] for i in feat_idx)
    names = [raw_header[i] for i in feat_idx]
    batches = table.select(names).to_batches()
    del table, column
    X = np.empty((n, len(feat_idx)), dtype=np.float64)
    start = 0
    for b in range(len(batches)):
        batch, batches[b] = batches[b], None
        stop = start + batch.num_rows
        for j in range(batch.num_columns):
            X[start:stop, j] = batch.column(j).to_numpy(zero_copy_only=False)
        start = stop
        del batch
    return features, X, codes, uniques, _NoLines()
