"""The fast path of `fedpeer.data.dataset.load_csv`: pyarrow's multi-threaded CSV reader; and the Arrow
pieces every columnar source shares (the float64 matrix fill, the label codes: data/sources/parquet.py,
data/sources/sql.py).

`read_csv` returns what `csvtext.read_csv` would return for the same file — the feature names, the
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
import ctypes
import functools
import io
import mmap
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fedpeer.data.spec import _BOM, MISSING_TOKENS, DataSpec, _NoLines, _open

_HEADER_BYTES_MAX = 4 << 20
_FIELD_CHARS_MAX = 131_072 - 1       # csv.field_size_limit()'s default; a longer text field -> Python
_BLOCK_BYTES = 1 << 20               # pyarrow's parse block: 4 MiB is no faster and holds more in flight
_FILL_BYTES = 1 << 20                # a piece of X copied by to_tensor (small batches); a lone batch of 2x: halves
_STAGE_BYTES = 3 << 20               # a block of X staged column by column (~7,900 rows of 50; 1k-2k rows: slower)
_STAGE_ROWS_MIN = 8_192              # batches of at least this many rows are staged (see _fill_part)
_FILL_THREADS = 2                    # threads filling X (see _fill)
_SMALL_PAGES_BYTES_MIN = 4 << 20      # a matrix this large or larger is kept off huge pages (empty_matrix)
_FIRST_SCANS_MAX = 16                # label values per chunk found by a scan each; more: np.unique's sort
_SCAN_WINDOW_BYTES = 64 << 20        # the quote scan maps the file this much at a time (a multiple of 64 KiB)
_GIVE_BACK_BYTES = 32 << 20          # the fill of a parsed table returns its freed memory to the system this often


def _case_forms(token: str) -> list[str]:
    forms = [""]
    for ch in token:
        forms = [f + c for f in forms for c in {ch.lower(), ch.upper()}]
    return forms


NULL_VALUES = sorted({form for token in MISSING_TOKENS for form in _case_forms(token)})
"""Every spelling of a missing token pyarrow must take as null (it compares exactly)."""


def _header(f) -> tuple[list[str], int | None] | tuple[None, None]:
    """The header record as the csv module reads it (names not stripped), and the byte offset where
    the data rows begin if the record is one line (None if it spans lines); (None, None) if not sure."""
    raw = f.read(_HEADER_BYTES_MAX)
    whole = len(raw) < _HEADER_BYTES_MAX
    skipped = 0
    if raw.startswith(_BOM):
        raw, skipped = raw[len(_BOM):], len(_BOM)
    if b"\x00" in raw or raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None, None
    try:
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(raw, final=whole)
    except UnicodeDecodeError:
        return None, None
    lines = io.StringIO(text, newline="")
    reader = csv.reader(lines)
    try:
        for record in reader:
            if record:
                break
        else:
            return None, None
    except csv.Error:
        return None, None
    consumed = text[:lines.tell()]      # empty lines, then the header record and its line end
    if not whole and not consumed.endswith(("\n", "\r")):
        return None, None  # the record may go on beyond what was read
    record_text = consumed.strip("\r\n")
    one_line = "\n" not in record_text and "\r" not in record_text    # no quoted name spans lines
    return record, (skipped + len(consumed.encode("utf-8")) if one_line else None)


def _has_quote(f, data_start: int | None) -> bool:
    """Whether the data rows (from byte data_start on; None: the header spans lines) hold a double
    quote: without one no value can span lines, and pyarrow may split the file into blocks at any
    line end (newlines_in_values=False, ~25 % faster). A quoted header on one line (as pyarrow's and
    many other writers quote every name) does not count. The file is mapped _SCAN_WINDOW_BYTES at a
    time: a page of a mapped file counts in the process's RSS while it is mapped (mapping the
    whole 939 MiB file was load_csv's peak RSS, 1,005 MiB, 0.2 s into the load)."""
    if data_start is None:
        return True
    try:
        size = os.fstat(f.fileno()).st_size
        offset = data_start - data_start % mmap.ALLOCATIONGRANULARITY
        while offset < size:
            length = min(_SCAN_WINDOW_BYTES, size - offset)
            with mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as m:
                if m.find(b'"', max(0, data_start - offset)) >= 0:
                    return True
            offset += length
        return False
    except (OSError, ValueError):
        return True


def read_csv(spec: DataSpec, rows_max: int, bytes_max: int) -> tuple[Any, ...] | None:
    """(features, X, codes, uniques, rows) as `csvtext.read_csv` gives them, or None (see the module)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv
    except ImportError:                 # pragma: no cover - a dependency; the Python parser still works
        return None
    path = spec.csv
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None                 # a pipe must be read once, by the Python parser, and no further than bytes_max
    except OSError:
        return None
    with _open(path) as f:              # today's messages for a missing or unreadable file
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= bytes_max:
            return None
        raw_header, data_start = _header(f)
        quoted = _has_quote(f, data_start)
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
    label_idx = header.index(spec.label) if spec.label is not None else None
    if label_idx is not None:            # coded block by block, its checks made on each block's dictionary
        types[raw_header[label_idx]] = pa.dictionary(pa.int32(), pa.string())
    try:
        table = pacsv.read_csv(
            str(path),
            read_options=pacsv.ReadOptions(use_threads=True, block_size=_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=",", quote_char='"', double_quote=True,
                                             escape_char=False, newlines_in_values=quoted,
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
        if column.null_count:
            return None
        if i == label_idx:
            if column.type != pa.dictionary(pa.int32(), pa.string()):
                return None
            text = pa.concat_arrays([chunk.dictionary for chunk in column.chunks])   # its values, per block
        elif column.type != pa.string():
            return None
        else:
            text = column
        if len(text) and (pc.max(pc.utf8_length(text)).as_py() >= _FIELD_CHARS_MAX
                          or pc.any(pc.match_substring(text, "\x00")).as_py()):
            return None

    if label_idx is not None:
        coder, start = _DictCodes(n, str.strip), 0
        for chunk in table.column(label_idx).chunks:
            start = coder.add(start, chunk)
        codes, uniques = coder.codes, coder.uniques
    else:
        uniques, codes = [""], np.zeros(n, dtype=np.int64)
    features = tuple(header[i] for i in feat_idx)
    names = [raw_header[i] for i in feat_idx]
    nulls = np.array([table.column(i).null_count for i in feat_idx])
    batches = table.select(names).to_batches()
    del table, column
    X, finite = _matrix_finite(batches, n)
    if not finite and not np.array_equal(np.isnan(X).sum(axis=0), nulls):
        return None      # a NaN pyarrow read from text ("nan(1)", "-nan"): the Python parser judges it
    return features, X, codes, uniques, _NoLines(all_finite=finite)


def _label_codes(column, text) -> tuple[np.ndarray, list[str]]:
    """(codes, distinct texts) of a label column: codes in order of first appearance of
    text(value), as the Python parser counts them (coded as a dictionary, see _DictCodes)."""
    coder, start = _DictCodes(len(column), text), 0
    for chunk in column.dictionary_encode().chunks:
        start = coder.add(start, chunk)
    return coder.codes, coder.uniques


class _DictCodes:
    """Label codes of dictionary-encoded chunks, chunk by chunk (codes in order of first appearance
    of text(value), a null as text(None), as the Python parser counts them):
    reading a text label as a dictionary and coding its indices skips materializing and hashing a
    string per row (Parquet 1M rows: read 0.007 s instead of 0.030 s best of 7, codes ~0 instead of
    0.047 s), and the work is done group by group instead of once, serially, at the end."""

    def __init__(self, n: int, text) -> None:
        self.codes = np.empty(n, dtype=np.int64)
        self.uniques: list[str] = []
        self._seen: dict[str, int] = {}
        self._text = text

    def add(self, start: int, chunk) -> int:
        """Code `chunk` (a DictionaryArray) into codes[start:]; the next start."""
        k = len(chunk.dictionary)
        indices = chunk.indices
        if indices.null_count:
            indices = indices.fill_null(k)                      # index k: a null
        idx = indices.to_numpy(zero_copy_only=False)
        present = np.flatnonzero(np.bincount(idx, minlength=k + 1))
        if len(present) <= _FIRST_SCANS_MAX:                    # a scan per value beats a sort of the rows
            first = np.array([np.argmax(idx == j) for j in present], dtype=np.int64)
        else:
            present, first = np.unique(idx, return_index=True)
        values = chunk.dictionary.to_pylist() + [None]
        remap = np.zeros(k + 1, dtype=np.int64)
        for j in present[np.argsort(first, kind="stable")]:
            value = self._text(values[j])
            code = self._seen.get(value)
            if code is None:
                code = self._seen[value] = len(self.uniques)
                self.uniques.append(value)
            remap[j] = code
        np.take(remap, idx, out=self.codes[start:start + len(idx)])
        return start + len(idx)


def empty_matrix(n: int, k: int) -> np.ndarray:
    """np.empty((n, k)) of float64 for the CSV fill, on 4 KiB pages. numpy advises transparent huge
    pages for large arrays; filling such a matrix while the parsed table is freed block by block
    (glibc) was slower: `load_csv` 1M x 50, 5 interleaved runs each, median 3.54 s (fill 0.72 s) on
    huge pages against 3.12 s (fill 0.46 s) without. The Parquet fill (staged, its row groups'
    buffers reused by pyarrow's pool) was faster on huge pages (best 0.383 vs 0.481 s, median 0.486
    vs 0.531 s, 15 runs each): it keeps np.empty."""
    nbytes = n * k * 8
    if nbytes < _SMALL_PAGES_BYTES_MIN or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty((n, k), dtype=np.float64)
    try:
        memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:                                    # as np.empty would say it
        raise MemoryError(f"cannot allocate a {n} x {k} float64 matrix ({nbytes} bytes): {e}") from None
    memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype=np.float64).reshape(n, k)


def _matrix(batches: list, n: int) -> np.ndarray:
    """The float64 (rows, columns) matrix of record batches (nulls -> NaN), each batch let go once
    copied so that the table never sits beside a full matrix."""
    return _matrix_finite(batches, n)[0]


def _matrix_finite(batches: list, n: int) -> tuple[np.ndarray, bool]:
    """`_matrix`, and whether every value in it is finite. The batches (a parsed CSV's, in pyarrow's
    system pool: glibc's malloc) give their memory back to the system while X fills (_give_back)."""
    X = empty_matrix(n, batches[0].num_columns if batches else 0)
    return X, _fill(X, 0, batches, give_back=True)[1]


def _give_back() -> None:
    """Return the freed memory of glibc's malloc to the system (malloc_trim): glibc keeps the freed
    buffers of a parsed table, so without it the table's RSS stayed beside the whole matrix. 1M x 50
    CSV, RSS sampled every 10 ms: the fill went 574 -> 958 MiB without, 616 -> 635 (at most) -> 559
    MiB with a trim every 64 parse blocks. No-op where there is no glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _fill(X: np.ndarray, start: int, batches: list, threads: int = _FILL_THREADS,
          give_back: bool = False) -> tuple[int, bool]:
    """Copy the batches into X from row `start` on (letting each go once copied); the next row, and
    whether every value copied is finite (judged on each piece while it is in the cache). With 2
    threads each fills half of the rows: the copies and the first touch of X's fresh pages (the
    kernel zeroing them, ~1/6 of load_csv's CPU on 1M x 50) run on both cores."""
    if threads > 1 and len(batches) == 1 and batches[0].num_rows >= 2 * _FILL_BYTES // 8:
        batch = batches.pop()
        half = batch.num_rows // 2
        batches.extend((batch.slice(0, half), batch.slice(half)))
        del batch
    rows = sum(batch.num_rows for batch in batches)
    if threads < 2 or len(batches) < 2:
        return start + rows, _fill_part(X, start, batches, give_back)
    k, first = 1, batches[0].num_rows         # batches[:k] (first rows) here, batches[k:] in a helper
    while k < len(batches) - 1 and 2 * (first + batches[k].num_rows) <= rows:
        first += batches[k].num_rows
        k += 1
    rest = batches[k:]
    del batches[k:]
    with ThreadPoolExecutor(1, thread_name_prefix="fill") as helper:
        second = helper.submit(_fill_part, X, start + first, rest, give_back)
        del rest                               # the helper lets each of its batches go once copied
        finite = _fill_part(X, start, batches, give_back)
        finite = second.result() and finite
    return start + rows, finite


def _fill_part(X: np.ndarray, start: int, batches: list, give_back: bool = False) -> bool:
    """Copy the batches into X from row `start` on (letting each go once copied); whether every
    value copied is finite, judged on each block while it is in the cache. give_back: _give_back
    after every _GIVE_BACK_BYTES of batches copied.

    A batch of STAGE_ROWS_MIN rows or more (a Parquet row group) is copied block by block: each
    column's piece is copied (a memcpy; a null is NaN) into a small column-major stage, then numpy's
    cache-blocked transpose writes the block into X. A smaller batch (a CSV parse block, ~1,000
    rows) is copied by Arrow's own row-major `to_tensor` and a memcpy: staging it (50 numpy calls
    per 1,000 rows) made `load_csv` slower (3.26 vs 3.03 s wall median, 4 interleaved runs). Parquet
    1M x 50 in 10 row groups, three runs of 9 interleaved: `load_data` CPU median 0.77 / 0.76 /
    0.73 s staged against 1.05 / 1.14 / 1.09 s with `to_tensor` everywhere (fill alone, faulted
    matrix: 0.19 vs 0.25 s)."""
    import pyarrow as pa

    finite = True
    stage = np.empty((0, 0))
    copied = 0
    for b in range(len(batches)):
        if give_back and copied >= _GIVE_BACK_BYTES:
            _give_back()
            copied = 0
        batch, batches[b] = batches[b], None
        copied += batch.nbytes
        if any(t != pa.float64() for t in batch.schema.types):
            batch = pa.RecordBatch.from_arrays([c if c.type == pa.float64() else c.cast(pa.float64(), safe=False)
                                                for c in batch.columns], names=batch.schema.names)
        n, k = batch.num_rows, max(1, batch.num_columns)
        if n < _STAGE_ROWS_MIN:
            step = max(1, _FILL_BYTES // (8 * k))
            for r in range(0, n, step):
                piece = np.asarray(batch.slice(r, step).to_tensor(null_to_nan=True, row_major=True))
                X[start + r:start + r + piece.shape[0]] = piece
                if finite:
                    finite = bool(np.isfinite(piece).all())
            start += n
            continue
        columns = [c.to_numpy(zero_copy_only=False) for c in batch.columns]   # float64: a null is NaN
        del batch
        step = max(1, _STAGE_BYTES // (8 * k))
        if stage.shape[0] != k or stage.shape[1] < min(step, n):
            stage = np.empty((k, min(step, n)))
        for r in range(0, n, step):
            e = min(r + step, n)
            block = stage[:, :e - r]
            np.stack([c[r:e] for c in columns], axis=0, out=block)
            np.copyto(X[start + r:start + e], block.T)
            if finite:
                finite = bool(np.isfinite(block).all())
        start += n
        del columns
    return finite
