"""The Python CSV parser: the reference reader of a site's CSV, and the one that places every problem.

It streams the file once through the csv module, never beyond `bytes_max` bytes or `rows_max` rows,
and names the file, the column, "data row N, line L" and the fix in every message (see the rules in
fedpeer/data/dataset.py). pyarrow's reader (`_arrow.read_csv`) parses a file first when it can vouch for
giving the same result; on anything else this parser reads it and decides.
"""

from __future__ import annotations

import bisect
import codecs
import csv
import io
import math
import operator
import os
import stat
from array import array
from typing import Any, BinaryIO

import numpy as np

from fedpeer.data.spec import _BOM, MISSING_TOKENS, DataSpec, _example, _open, _parse_float, check_columns, not_numeric
from fedpeer.errors import DataError

_CHUNK_CELLS = 1 << 20      # floats per block while accumulating rows (8 MiB)
_READ_BYTES = 1 << 16       # bytes per read of the file under the text decoder


# ---------------------------------------------------------------------------------------------
# Bounded, accounted byte stream under the text decoder.

class _TooLarge(Exception):
    pass


class _Utf16(Exception):
    pass


class _NulByte(Exception):
    def __init__(self, offset: int, line: int) -> None:
        self.offset, self.line = offset, line


def _breaks(data: bytes) -> int:
    """Line breaks in data: \\n, \\r\\n and lone \\r each count once."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


class _Metered(io.BufferedIOBase):
    """Feeds the TextIOWrapper directly (no read-ahead in between), so that every byte handed to
    the decoder has been counted: refuses to go past `limit` bytes, refuses NUL bytes, strips a
    UTF-8 byte-order mark, and can place a decoding error at a byte offset and line."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        super().__init__()
        self._raw, self._limit = raw, limit
        self.consumed = 0            # bytes of the file handed out or skipped (the BOM)
        self.line_breaks = 0         # line breaks in those bytes
        self._cr_last = False
        self._first = True

    def readable(self) -> bool:
        return True

    def _account(self, data: bytes) -> None:
        start = self.consumed
        self.consumed += len(data)
        if self.consumed > self._limit:
            raise _TooLarge()
        nul = data.find(b"\x00")
        if nul >= 0:
            raise _NulByte(start + nul, self._line_at(data, nul))
        self.line_breaks += _breaks(data) - (1 if self._cr_last and data[:1] == b"\n" else 0)
        self._cr_last = data[-1:] == b"\r" if data else self._cr_last

    def _line_at(self, data: bytes, index: int) -> int:
        """1-based line of data[index], data being the bytes just after those already counted."""
        before = data[:index]
        joined = 1 if self._cr_last and before[:1] == b"\n" else 0     # \r|\n across two reads
        return 1 + self.line_breaks + _breaks(before) - joined

    def read1(self, size: int = -1) -> bytes:
        size = size if size and size > 0 else _READ_BYTES
        data = self._raw.read1(size)
        if self._first:
            self._first = False
            while 0 < len(data) < len(_BOM) and _BOM.startswith(data):
                if not (more := self._raw.read1(size)):
                    break
                data += more
            if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
                raise _Utf16()
            if data.startswith(_BOM):
                self._account(_BOM)
                data = data[len(_BOM):] or self._raw.read1(size)   # b"" would mean end of file
        self._account(data)
        return data

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            parts = []
            while part := self.read1(_READ_BYTES):
                parts.append(part)
            return b"".join(parts)
        return self.read1(size)

    def locate(self, err: UnicodeDecodeError) -> tuple[int, int] | None:
        """(byte offset, line) of a decoding error raised on the bytes handed out so far.

        The incremental decoder raises on (its undecoded remainder + the chunk just read), which is
        always the tail of what this stream handed out; None if that does not hold."""
        obj = err.object
        if not isinstance(obj, (bytes, bytearray)) or not 0 <= err.start < len(obj):
            return None
        offset = self.consumed - len(obj) + err.start
        if offset < 0:
            return None
        tail = bytes(obj[err.start:])
        return offset, 1 + self.line_breaks - _breaks(tail)


# ---------------------------------------------------------------------------------------------
# Reading.

class _Rows:
    """Where data rows are in the file: data row index (0-based) -> 1-based line, stored sparsely
    as breakpoints where the difference between them changes."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._deltas: list[int] = []

    def note(self, index: int, line: int) -> None:
        delta = line - index
        if not self._deltas or self._deltas[-1] != delta:
            self._starts.append(index)
            self._deltas.append(delta)

    def where(self, index: int) -> str:
        k = bisect.bisect_right(self._starts, index) - 1
        return f"data row {index + 1}, line {index + self._deltas[k]}"


def read_csv(spec: DataSpec, rows_max: int, bytes_max: int) -> tuple[Any, ...]:
    """(features, X, codes, uniques, rows) of `spec.csv`, read with the csv module; every problem
    is a DataError placed by data row and line."""
    path = spec.csv
    with _open(path) as f:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode) and st.st_size > bytes_max:
            raise DataError(f"{path}: is {st.st_size} bytes, more than the limit of {bytes_max} bytes "
                            "(bytes_max); use a sample of the data or raise the limit")
        metered = _Metered(f, bytes_max)
        text = io.TextIOWrapper(metered, encoding="utf-8", errors="strict", newline="")
        reader = csv.reader(text)
        try:
            parsed = _read(spec, reader, rows_max)
        except _TooLarge:
            raise DataError(f"{path}: is more than the limit of {bytes_max} bytes (bytes_max); "
                            "use a sample of the data or raise the limit") from None
        except _Utf16:
            raise DataError(f"{path}: is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as "
                            "CSV in UTF-8 (Excel: 'CSV UTF-8')") from None
        except _NulByte as e:
            raise DataError(f"{path}: contains a NUL byte at byte offset {e.offset} (line {e.line}): "
                            "not a text CSV file (UTF-16? binary?); save it as CSV in UTF-8") from None
        except UnicodeDecodeError as e:
            place = metered.locate(e)
            at = (f" at byte offset {place[0]} (line {place[1]})" if place
                  else f" after line {reader.line_num}")
            bad = f"byte 0x{e.object[e.start]:02X}" if place else "byte"
            raise DataError(f"{path}: is not UTF-8 text: invalid {bad}{at} (saved as UTF-16, Latin-1 or "
                            "Windows-1252?); save it as CSV in UTF-8 (Excel: 'CSV UTF-8')") from None
        except csv.Error as e:
            raise DataError(f"{path}: is not valid CSV near line {reader.line_num}: {e}") from None
        except OSError as e:
            raise DataError(f"{path}: reading failed: {e.strerror or e}") from None
    return parsed


def _read(spec: DataSpec, reader, rows_max: int):
    path = spec.csv
    header = None
    for record in reader:
        if record:
            header = [name.strip() for name in record]
            break
    if header is None:
        raise DataError(f"{path}: is empty; a CSV file with a header row and data rows is needed")
    header_lines = reader.line_num
    for i, name in enumerate(header):
        if not name:
            raise DataError(f"{path}: column {i + 1} of the header has no name (R's write.csv writes one "
                            "for row names: use row.names = FALSE); give every column a name")
    seen = check_columns(path, header, spec)
    if spec.label is not None and spec.label in spec.ignore:
        raise DataError(f"{path}: the label column {spec.label!r} is also listed in ignore; "
                        "remove it from ignore")
    label_idx = seen[spec.label] if spec.label is not None else -1
    ignored = set(spec.ignore)
    feat_idx = [i for i, name in enumerate(header) if i != label_idx and name not in ignored]
    features = tuple(header[i] for i in feat_idx)
    if not features:
        raise DataError(f"{path}: no feature columns left (all columns are the label or ignored)")
    ncols, nf = len(header), len(feat_idx)
    pick = operator.itemgetter(*feat_idx) if nf > 1 else (lambda r, _i=feat_idx[0]: (r[_i],))

    block_rows = max(1, _CHUNK_CELLS // nf)
    blocks: list[np.ndarray] = []
    block = np.empty((block_rows, nf), dtype=np.float64)
    k = 0
    codes = array("l")
    label_codes: dict[str, int] = {}
    rows = _Rows()
    n = 0
    last_line = header_lines
    for record in reader:
        start_line, last_line = last_line + 1, reader.line_num
        if not record:
            continue                                   # blank line
        n += 1
        if n > rows_max:
            raise DataError(f"{path}: has more than {rows_max} data rows (rows_max); use a sample of the "
                            "data or raise the limit")
        rows.note(n - 1, start_line)
        if len(record) != ncols:
            raise DataError(public="a data row of its CSV has another number of fields than the header; fix the file",
                        message=f"{path}: {rows.where(n - 1)} has {len(record)} fields but the header has "
                            f"{ncols} columns; fix that row (a stray or missing comma, or an unquoted "
                            "comma inside a value?)")
        cells = pick(record)
        try:
            values = [float(c) for c in cells]
            joined = "".join(cells)
            ok = joined.isascii() and "_" not in joined   # else let _parse_float judge each cell
        except ValueError:
            ok = False
        if not ok:
            values = []
            for j, c in enumerate(cells):
                t = c.strip()
                if t.lower() in MISSING_TOKENS:
                    values.append(math.nan)
                    continue
                v = _parse_float(t)
                if v is None:
                    raise DataError(f"{path}: column {features[j]!r} is not numeric: {rows.where(n - 1)} "
                                    f"has {_example(c)}; if it is not a feature (an identifier, a date, "
                                    "text), add it to ignore", public=not_numeric(features[j]))
                values.append(v)
        block[k] = values
        k += 1
        if k == block_rows:
            blocks.append(block)
            block = np.empty((block_rows, nf), dtype=np.float64)
            k = 0
        lab = record[label_idx].strip() if label_idx >= 0 else ""
        code = label_codes.get(lab)
        if code is None:
            code = label_codes[lab] = len(label_codes)
        codes.append(code)
    if n == 0 and not spec.empty_ok:
        raise DataError(f"{path}: has a header but no data rows")
    blocks.append(block[:k])
    X = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    return features, X, np.frombuffer(codes, dtype=np.dtype("l")).astype(np.int64), list(label_codes), rows
