"""load_csv's pyarrow fast path gives bit for bit the Dataset of the Python parser, and every bad file
still gets the Python parser's exact message (file, column, "data row N, line L", the fix)."""

from __future__ import annotations

import codecs
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpeer.data import dataset as data
from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.data.sources import csv_arrow as _arrow
from fedpeer.errors import DataError


def write(tmp_path: Path, content: str | bytes, name: str = "site.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def outcome(fn, spec: DataSpec, **kw):
    try:
        return fn(spec, **kw)
    except DataError as e:
        return str(e)


def same_dataset(a: data.Dataset, b: data.Dataset) -> None:
    assert a.features == b.features and a.fingerprint == b.fingerprint and a.rows_dropped == b.rows_dropped
    assert a.X.dtype == b.X.dtype == np.float64 and a.X.shape == b.X.shape and a.X.tobytes() == b.X.tobytes()
    assert a.X.flags.c_contiguous and not a.X.flags.writeable
    assert a.labels.dtype == b.labels.dtype and a.labels.tolist() == b.labels.tolist()
    assert (a.y is None) == (b.y is None)
    if a.y is not None:
        assert a.y.dtype == b.y.dtype and a.y.tobytes() == b.y.tobytes()


def fast_only(spec: DataSpec, binary: bool = True, rows_max: int = 10_000_000, bytes_max: int = 2**31):
    """The pyarrow path alone: a Dataset, or None where it hands the file to the Python parser."""
    parsed = _arrow.read_csv(spec, rows_max, bytes_max)
    if parsed is None:
        return None
    try:
        return data._finish(spec, binary, *parsed)
    except (DataError, data._NeedLines):
        return None


# Today's bad files (tests/unit/test_data.py and more): the message must be the Python parser's, word for word.
BAD = [
    ("", {}), ("\n\r\n\n", {}), ("a,y\n", {}), ("a,y\n\n\n", {}),
    ("a,b,a,y\n1,2,3,0\n", {}), ("a, b,b ,y\n1,2,3,0\n", {}), (",a,y\n1,2,0\n", {}),
    ("a,b,y\n1,2,0\n3,4,1\n5,6\n", {}), ("a,b,y\n1,2,0\n\n3,4,1,9\n", {}),
    ("a,b,Class\n1,2,0\n", {}), ("a,b,Y\n1,2,0\n", {}),
    ("a,when,y\n1,2024-01-02,0\n2,2024-01-03,1\n", {}), ("a,b,y\n1,2,0\n3,1_000,1\n", {}),
    ("a,b,y\n1,2,0\n3,\uff14,1\n", {}), ("a,b,y\n1,2,0\n3,0x10,1\n", {}),
    ("a,b,y\n1,2,0\n1,2,0\n", {}), ("a,y\n1,0\n2,1\n3,2\n", {}), ("a,y\n1,no\n2,yes\n", {}),
    ("a,y\n1,0\n2,1\n" + "".join(f"{i},{'x' * 300}\n" for i in range(2)), {}),
    ("a,y\n1,M\n2,R\n", {"positive": None}),
    ("Id,a,y\n1,2,0\n2,3,1\n", {"ignore": ("ID",)}), ("Id,a,y\n1,2,0\n2,3,1\n", {"ignore": ("y",)}),
    ("Id,a,y\n1,2,0\n2,3,1\n", {"ignore": ("Id", "a")}),
    ("a,y\n1,0\n2,caf\xe9\n".encode("latin-1"), {}), (b"a,y\r\n" + b"1,0\r\n" * 5000 + b"2,\xff\r\n", {}),
    ("a,y\n1,0\n2,1\n".encode("utf-16-le"), {}), (codecs.BOM_UTF16_BE + "a,y\n1,0\n2,1\n".encode("utf-16-be"), {}),
    (b"a,y\n1,\x000\n2,1\n", {}), (b"a,y\n1,0\n2,\"1\x00\"\n", {}),
    (b"a,y,id\n1,0,x\n2,1,\"\x00\"\n", {"ignore": ("id",)}),
    (b"a,y\n1,0\n2,\xed\xa0\x80\n", {}),                                     # a UTF-8 encoded surrogate
    ("a,b,y\n1,NA,0\n,4,NA\n3,,1\n4,5,inf\n5,6,1\n6,7,0\n", {}),
    ("a,b,y\n1,2,0\n3,4,1\n5, NA ,1\n6,7,0\n", {}), ("a,b,y\n1,2,0\n3,4,1\n5,6,1\n7,-1e400,0\n", {}),
    ("a,y\nNA,0\n?,1\n", {"missing": "drop"}), ("a,y\n1,0\nNA,1\n2,0\n", {"missing": "drop"}),
    ('note,a,y\n"two\nlines",1,0\n\nx,2,1\n"z\nz",NA,1\n', {"ignore": ("note",)}),
    ("a,y\n1,0\n2,1\n\"" + "x" * 200_000 + "\",0\n", {}),
    ("a,y,id\n1,0,x\n2,1,\"" + "x" * 200_000 + "\"\n", {"ignore": ("id",)}),   # the csv module's field limit
    ("a,y\n1,0\n2,1\n3,0\n", {"rows_max": 2}), ("a,y\n1,0\n2,1\n", {"bytes_max": 10}),
    ("a,y\n1,0\n  \n2,1\n", {}), ("a,b,y\n1,2,0\n3,nan(1),1\n4,5,0\n", {"missing": "drop"}),
    ("a,b,y\n1,2,0\n3,nan(),1\n4,5,0\n", {"missing": "impute"}), ("a,b,y\n1,2,0\n3,\"4\"5x,1\n", {}),
]


@pytest.mark.parametrize("content,kw", BAD)
def test_bad_files_keep_the_python_parsers_message(tmp_path: Path, content: str | bytes, kw: dict) -> None:
    path = write(tmp_path, content)
    spec_kw = {k: v for k, v in kw.items() if k in ("ignore", "missing", "positive")}
    load_kw = {k: v for k, v in kw.items() if k not in spec_kw}
    spec = DataSpec(path, "y", **{"positive": "1", **spec_kw})
    with pytest.raises(DataError) as err:
        load_csv(spec, **load_kw)
    message = str(err.value)
    assert message == outcome(data._load_csv_python, spec, **load_kw)
    assert message.startswith(f"{path}: ")
    assert fast_only(spec, **load_kw) is None                # the fast path never answers for a bad file


def test_messages_name_file_column_and_row(tmp_path: Path) -> None:
    path = write(tmp_path, "a,b,y\n1,2,0\n\n3,oops,1\n")
    message = str(pytest.raises(DataError, load_csv, DataSpec(path, "y", "1")).value)
    assert message.startswith(f"{path}: column 'b' is not numeric: data row 2, line 4 has 'oops'")
    assert "add it to ignore" in message


def test_well_formed_files_take_the_fast_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the Python parser was used")
    monkeypatch.setattr(data, "_load_csv_python", refuse)
    path = write(tmp_path, "\ufeff id , a ,b,y\r\n"
                           "x1, 1 ,2.5,1\r\n"
                           "\r\n"
                           "x2,-3e-2,+.5, 0 \r\n"
                           "\"x\n3\",1E3,\"7\",1\r\n"
                           "\"x,4\",NA,?,0\r\n")
    ds = load_csv(DataSpec(path, "y", "1", ignore=("id",), missing="drop"))
    assert ds.features == ("a", "b") and ds.X.tolist() == [[1.0, 2.5], [-0.03, 0.5], [1000.0, 7.0]]
    assert ds.labels.tolist() == ["1", "0", "1"] and ds.y.tolist() == [1, 0, 1] and ds.rows_dropped == 1


@pytest.mark.parametrize("content", ['a,y\n1,0\n2,"1\n', 'a,y\n1,0\n"2"5,1\n', 'a,y\n"1" ,0\n2,1'])
def test_odd_but_accepted_files_agree(tmp_path: Path, content: str) -> None:
    spec = DataSpec(write(tmp_path, content), "y", "1")
    same_dataset(load_csv(spec), data._load_csv_python(spec))


# ---------------------------------------------------------------------------------------------
# Generated files: the fast path's Dataset is the Python parser's, bit for bit.

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
number = st.one_of(
    finite.map(repr), finite.map(lambda v: f"{v:.3g}"), finite.map(lambda v: f"{v:.17e}"),
    st.integers(-2**70, 2**70).map(str), st.integers(0, 999).map(lambda i: f"+{i}."),
    st.integers(0, 999).map(lambda i: f".{i}"), st.integers(0, 99).map(lambda i: f"0{i}e-3"),
    st.sampled_from(["-0", "0.1000000000000000055511151231257827021181583404541015625", "4.9e-324",
                     "2.2250738585072011e-308", "1.7976931348623157e308", "9007199254740993", "1e-400"]),
)
cell = st.one_of(number, number.map(lambda t: f'"{t}"'), number.map(lambda t: f" {t}"), number.map(lambda t: f"{t}\t"),
                 st.sampled_from(["", "NA", "na", "N/A", "nan", "NaN", "NULL", "?", '""', '"NA"', "inf", "-Infinity",
                                  "1e999", " NA ", "-nan", "nan(1)", "1_0", "x"]))
label = st.sampled_from(["yes", "no", " yes", "no ", '"yes"', '"no, really"', '"y""es"', "NA", "", "inf", '"a\nb"'])
ident = st.sampled_from(["id1", '"a,b"', '"two\nlines"', "é", '""', "x\"y"])


@st.composite
def csv_files(draw) -> tuple[bytes, dict]:
    nf = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 12))
    sep = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    header = ["id"] + [f" f{j}" if j % 2 else f"f{j}" for j in range(nf)] + ["y"]
    lines = [",".join(f'"{h}"' if draw(st.booleans()) else h for h in header)]
    for _ in range(rows):
        lines.append(",".join([draw(ident)] + [draw(cell) for _ in range(nf)] + [draw(label)]))
        if draw(st.integers(0, 9)) == 0:
            lines.append("")
    text = sep.join(lines) + (sep if draw(st.booleans()) else "")
    bom = draw(st.sampled_from([b"", codecs.BOM_UTF8]))
    kw = dict(ignore=("id",), missing=draw(st.sampled_from(["error", "drop"])),
              positive=draw(st.sampled_from(["yes", None])), binary=draw(st.booleans()))
    return bom + text.encode(), kw


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(csv_files())
def test_fast_path_is_bit_identical(tmp_path: Path, case: tuple[bytes, dict]) -> None:
    content, kw = case
    path = write(tmp_path, content)
    spec = DataSpec(path, "y", kw["positive"], ignore=kw["ignore"], missing=kw["missing"])
    slow = outcome(data._load_csv_python, spec, binary=kw["binary"])
    fast = fast_only(spec, binary=kw["binary"])
    if fast is not None:
        assert not isinstance(slow, str), slow
        same_dataset(fast, slow)
    whole = outcome(load_csv, spec, binary=kw["binary"])
    if isinstance(slow, str):
        assert whole == slow
    else:
        same_dataset(whole, slow)


def test_fast_path_on_a_larger_file(tmp_path: Path) -> None:
    """Several pyarrow blocks (chunks), labels first seen late, dropped rows: still identical."""
    rng = np.random.default_rng(7)
    n, d = 30_000, 6
    X = rng.normal(scale=1e3, size=(n, d))
    X[rng.random((n, d)) < 0.001] = np.nan
    labels = rng.choice(["a", " b", "c "], size=n)
    labels[n - 3] = "late"
    body = "".join(",".join("NA" if v != v else repr(v) for v in row) + f",{lab}\n"
                   for row, lab in zip(X.tolist(), labels))
    path = write(tmp_path, ",".join(f"v{j}" for j in range(d)) + ",y\n" + body)
    saved = _arrow._BLOCK_BYTES
    try:
        _arrow._BLOCK_BYTES = 64 << 10
        spec = DataSpec(path, "y", None, missing="drop")
        fast = fast_only(spec, binary=False)
    finally:
        _arrow._BLOCK_BYTES = saved
    assert fast is not None and fast.rows_dropped > 0
    same_dataset(fast, data._load_csv_python(spec, binary=False))
    spec = DataSpec(path, None, ignore=("y",), missing="drop")
    same_dataset(fast_only(spec, binary=False), data._load_csv_python(spec, binary=False))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=list("0123456789.eE+-naifNIty()_x \t"), min_size=1, max_size=9))
def test_any_number_like_token_reads_as_the_python_parser_reads_it(tmp_path: Path, token: str) -> None:
    path = write(tmp_path, f"a,b,y\n1,{token},0\n2,3,1\n4,5,0\n")
    for missing in ("error", "drop"):
        spec = DataSpec(path, "y", None, missing=missing)
        slow = outcome(data._load_csv_python, spec, binary=False)
        fast = fast_only(spec, binary=False)
        if fast is not None:
            assert not isinstance(slow, str), (token, slow)
            same_dataset(fast, slow)


@pytest.mark.parametrize("content, split_anywhere", [
    ('"a","b","y"\n1,2,0\n3,4,1\n', True),                 # pyarrow's CSVWriter quotes every name, not the values
    ('\ufeff\n\r\n"a",b,"y"\r\n1,2,0\r\n3,4,1\r\n', True),  # BOM, empty lines before the header, CRLF
    ('"a","b","y"\n1,2,0\n3,"4",1\n', False),               # a quote in the data rows
    ('"a","b\nc","y"\n1,2,0\n3,4,1\n', False),              # a quoted name spans lines
])
def test_a_quoted_header_alone_lets_pyarrow_split_at_any_line_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  content: str, split_anywhere: bool) -> None:
    import pyarrow.csv as pacsv

    seen: list[bool] = []
    real = pacsv.ParseOptions

    def spy(**kw):
        seen.append(kw["newlines_in_values"])
        return real(**kw)
    monkeypatch.setattr(pacsv, "ParseOptions", spy)
    path = write(tmp_path, content)
    spec = DataSpec(path, "y", "1")
    fast = fast_only(spec)
    assert seen == [not split_anywhere]
    same_dataset(fast, data._load_csv_python(spec))


def test_the_quote_scan_maps_the_file_window_by_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """_has_quote maps at most _SCAN_WINDOW_BYTES at a time and finds a quote wherever it is."""
    import mmap

    window = 2 * mmap.ALLOCATIONGRANULARITY
    monkeypatch.setattr(_arrow, "_SCAN_WINDOW_BYTES", window)
    body = bytearray(b"1,2,0\n" * (5 * window // 6))
    path = tmp_path / "q.csv"
    for start in (0, 3, window - 5, window + 1):
        for at in (None, start, window - 1, window, 2 * window + 7, len(body) - 1):
            if at is not None and at < start:
                continue
            data = bytearray(body)
            if at is not None:
                data[at] = ord('"')
            path.write_bytes(bytes(data))
            with open(path, "rb") as f:
                assert _arrow._has_quote(f, start) == (bytes(data).find(b'"', start) >= 0), (start, at)
    with open(path, "rb") as f:
        assert _arrow._has_quote(f, None)


def test_the_fill_of_a_parsed_table_gives_memory_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    calls: list[int] = []
    monkeypatch.setattr(_arrow, "_give_back", lambda: calls.append(1))
    monkeypatch.setattr(_arrow, "_GIVE_BACK_BYTES", 8 * 1000 * 3 * 4)
    batches = [pa.record_batch([pa.array(np.arange(1000.0))] * 3, names=["a", "b", "c"]) for _ in range(20)]
    X, finite = _arrow._matrix_finite(list(batches), 20_000)
    assert finite and X[:, 0].tolist() == np.tile(np.arange(1000.0), 20).tolist()
    assert 2 <= len(calls) <= 6           # every 4 batches' worth, in each of the two threads
    trim = _arrow._malloc_trim()          # glibc's, where there is one
    assert trim is None or trim(0) in (0, 1)


@pytest.mark.parametrize("sizes", [[300_000], [5, 70_000, 3, 120_000, 1], [1], [2, 2]])
def test_fill_in_one_or_two_threads_gives_the_same_matrix(sizes: list[int]) -> None:
    import pyarrow as pa

    rng = np.random.default_rng(len(sizes))
    batches, expected = [], []
    for n in sizes:
        cols = rng.normal(size=(3, n))
        cols[rng.random((3, n)) < 0.01] = np.inf
        mask = rng.random(n) < 0.01
        arrays = [pa.array(cols[0], mask=mask), pa.array(cols[1]), pa.array(cols[2].astype(np.float32))]
        batches.append(pa.record_batch(arrays, names=["a", "b", "c"]))
        expected.append(np.column_stack([np.where(mask, np.nan, cols[0]), cols[1], cols[2].astype(np.float32)]))
    want = np.concatenate(expected)
    for threads in (1, 2):
        X = np.full((len(want) + 2, 3), -1.0)
        end, finite = _arrow._fill(X, 1, list(batches), threads=threads)
        assert end == len(want) + 1 and finite == bool(np.isfinite(want).all())
        assert X[1:-1].tobytes() == want.tobytes() and (X[0] == -1).all() and (X[-1] == -1).all()


@pytest.mark.parametrize("n", [3, (_arrow._SMALL_PAGES_BYTES_MIN // 80) + 7])
def test_the_csv_matrix_is_a_plain_writable_float64_array(n: int) -> None:
    """empty_matrix (4 KiB pages for a large matrix): C-ordered float64 of the shape asked, writable,
    and its memory lives as long as the array (here: past the function's own references)."""
    X = _arrow.empty_matrix(n, 10)
    assert X.shape == (n, 10) and X.dtype == np.float64 and X.flags.c_contiguous and X.flags.writeable
    X[:] = np.arange(n * 10, dtype=np.float64).reshape(n, 10)
    X.setflags(write=False)
    Y = X[n // 2:]
    del X
    assert Y[-1, -1] == n * 10 - 1 and Y[0, 0] == (n // 2) * 10
