"""[data] parquet: a file or a directory of part files ends in the same checked Dataset as the same
columns in a CSV (same fingerprint), and every refusal names the source, the column and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.app.sitefiles import init_site
from fedpeer.config import load as cfg
from fedpeer.data.dataset import DataSpec, load_csv, load_data
from fedpeer.data.site import load_site
from fedpeer.errors import ConfigError, DataError


def frame(n: int = 50, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"Id": [f"p{i}" for i in range(n)], "age": rng.integers(20, 90, n), "bmi": rng.normal(25, 4, n),
            "smoker": rng.random(n) < 0.3, "y": np.where(rng.random(n) < 0.4, "sick", "well")}


def to_csv(cols: dict, path: Path) -> Path:
    """The same columns as CSV (booleans as 0/1: a CSV feature is a number)."""
    def text(v) -> str:
        v = v.item() if hasattr(v, "item") else v
        return str(int(v)) if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)
    names = list(cols)
    path.write_text(",".join(names) + "\n" + "".join(",".join(text(v) for v in row) + "\n"
                                                     for row in zip(*(cols[c] for c in names))))
    return path


def same(a, b) -> None:
    assert a.features == b.features and a.fingerprint == b.fingerprint and a.rows_dropped == b.rows_dropped
    assert a.X.tobytes() == b.X.tobytes() and a.labels.tolist() == b.labels.tolist()
    assert (a.y is None and b.y is None) or a.y.tobytes() == b.y.tobytes()


def test_parquet_file_and_directory_match_the_csv(tmp_path: Path) -> None:
    cols = frame()
    pq.write_table(pa.table(cols), tmp_path / "site.parquet")
    csv = load_csv(DataSpec(to_csv(cols, tmp_path / "site.csv"), "y", "sick", ignore=("Id",)))
    pqt = load_data(DataSpec(None, "y", "sick", ignore=("Id",), parquet=tmp_path / "site.parquet"))
    same(pqt, csv)
    assert pqt.features == ("age", "bmi", "smoker") and set(pqt.X[:, 2]) <= {0.0, 1.0}
    parts = tmp_path / "extract"
    parts.mkdir()
    table = pa.table(cols)
    for k, start in enumerate(range(0, 50, 20)):
        pq.write_table(table.slice(start, 20), parts / f"part-{k:05d}.parquet")
    (parts / "_SUCCESS").write_text("")
    same(load_data(DataSpec(None, "y", "sick", ignore=("Id",), parquet=parts)), csv)


def test_parquet_labels_missing_values_and_rows(tmp_path: Path) -> None:
    t = pa.table({"a": pa.array([1.0, None, 3.0, float("nan"), 5.0]), "b": pa.array([1, 2, None, 4, 5], pa.int32()),
                  "y": pa.array([1, 0, 1, 0, None], pa.int64())})
    path = tmp_path / "s.parquet"
    pq.write_table(t, path)
    with pytest.raises(DataError) as err:
        load_data(DataSpec(None, "y", "1", parquet=path))
    message = str(err.value)
    assert message.startswith(f"{path}: column 'a' has 2 missing values (first at row 2)")
    assert "column 'b' has 1 missing value (first at row 3)" in message
    assert "label column 'y' has 1 missing or infinite value (first at row 5)" in message
    assert 'missing = "drop"' in message
    ds = load_data(DataSpec(None, "y", "1", parquet=path, missing="drop"), binary=False)
    assert ds.X.tolist() == [[1.0, 1.0]] and ds.rows_dropped == 4 and ds.labels.tolist() == ["1"]
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "y": [True, False, True]}), path)
    ds = load_data(DataSpec(None, "y", "True", parquet=path))
    assert ds.labels.tolist() == ["True", "False", "True"] and ds.y.tolist() == [1, 0, 1]
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0],
                             "y": pa.array(["no", " yes", "no"]).dictionary_encode()}), path)
    assert load_data(DataSpec(None, "y", "yes", parquet=path)).y.tolist() == [0, 1, 0]


@pytest.mark.parametrize("column,expected", [
    (pa.array(["x", "y", "z"]), "column 'c' (string) is text in the Parquet schema"),
    (pa.array(["x", "y", "x"]).dictionary_encode(), "is categorical (dictionary-encoded)"),
    (pa.array([0, 1, 2], pa.timestamp("s")), "is a date or time"),
    (pa.array([[1], [2], [3]]), "is not a number column"),
])
def test_parquet_refuses_columns_that_are_not_numbers(tmp_path: Path, column, expected: str) -> None:
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "c": column, "y": ["p", "n", "p"]}), path)
    with pytest.raises(DataError) as err:
        load_data(DataSpec(None, "y", "p", parquet=path))
    assert str(err.value).startswith(f"{path}: ") and expected in str(err.value) and "ignore" in str(err.value)
    assert load_data(DataSpec(None, "y", "p", parquet=path, ignore=("c",))).features == ("a",)


def test_parquet_refusals(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "y": [0.5, 1.5, 0.5]}), path)

    def message(**kw) -> str:
        spec_kw = {k: kw.pop(k) for k in list(kw) if k in ("ignore", "label", "missing")}
        with pytest.raises(DataError) as err:
            load_data(DataSpec(None, spec_kw.pop("label", "y"), None, parquet=kw.pop("parquet", path), **spec_kw),
                      binary=False, **kw)
        return str(err.value)
    assert "label column 'y' is double" in message()
    assert "label column 'Y' not found (did you mean 'y'?)" in message(label="Y")
    assert "listed in ignore not found" in message(ignore=("b",))
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "y": [0, 1, 0]}), good)
    assert "more than 2 data rows (rows_max)" in message(parquet=good, rows_max=2)
    assert "more than the limit of 10 bytes" in message(bytes_max=10)
    assert "file not found" in message(parquet=tmp_path / "nope.parquet")
    (tmp_path / "bad.parquet").write_text("a,y\n1,0\n")
    assert "is not a readable Parquet file" in message(parquet=tmp_path / "bad.parquet")
    (tmp_path / "empty").mkdir()
    assert "holds no Parquet part files" in message(parquet=tmp_path / "empty")
    with pytest.raises(DataError, match="exactly one of csv"):
        DataSpec(tmp_path / "a.csv", "y", parquet=path)


def test_a_directorys_messages_name_the_part_file(tmp_path: Path) -> None:
    parts = tmp_path / "extract"
    parts.mkdir()
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "y": ["n", "p", "n"]}), parts / "part-0.parquet")
    pq.write_table(pa.table({"a": [4.0, None, 6.0], "y": ["p", "n", "p"]}), parts / "part-1.parquet")

    def message(**kw) -> str:
        with pytest.raises(DataError) as err:
            load_data(DataSpec(None, "y", "p", parquet=parts, **kw))
        return str(err.value)
    text = message()
    assert text.startswith(f"{parts}: column 'a' has 1 missing value (first at row 5 (row 2 of part-1.parquet))")
    assert "Missing means null or NaN." in text
    assert load_data(DataSpec(None, "y", "p", parquet=parts, missing="drop")).rows == 5
    pq.write_table(pa.table({"a": [4, 5, 6], "y": ["p", "n", "p"]}), parts / "part-1.parquet")
    assert (f"{parts}: part file part-1.parquet has other columns or types than part-0.parquet (column 'a' is "
            "int64, not double)") in message()
    pq.write_table(pa.table({"y": ["p", "n", "p"]}), parts / "part-1.parquet")
    assert "part-1.parquet has other columns or types than part-0.parquet (no column 'a')" in message()
    (parts / "part-1.parquet").write_bytes(b"PAR1 not really")
    assert message().startswith(f"{parts}: part file part-1.parquet: is not a readable Parquet file")


def test_config_and_load_site_take_parquet(tmp_path: Path) -> None:
    conf, _ = init_site(tmp_path / "s", "s", "127.0.0.1:17433")
    pq.write_table(pa.table(frame()), conf.parent / "rows.parquet")
    base = conf.read_text()
    conf.write_text(base + '\n[data]\nparquet = "rows.parquet"\nlabel = "y"\npositive = "sick"\nignore = ["Id"]\n')
    config = cfg.load(conf)
    assert config.data.parquet == str(conf.parent / "rows.parquet") and config.data.csv == ""
    ds, test = load_site(config.data, config.jobs, needs_label=True, binary=True)
    assert ds.rows == 50 and test is None
    conf.write_text(base + '\n[data]\nparquet = "rows.parquet"\ncsv = "rows.csv"\n')
    with pytest.raises(ConfigError, match="not both"):
        cfg.load(conf)


def test_large_row_groups_fill_the_matrix_as_the_csv_does(tmp_path: Path) -> None:
    """Row groups of STAGE_ROWS_MIN rows or more go through the staged fill:
    the same matrix, bit for bit, as the CSV of the same values, with nulls, NaN and infinities
    found and counted as in CSV (missing = "drop"), and as numpy's own column stack."""
    from fedpeer.data.sources import csv_arrow as _arrow

    n = 2 * _arrow._STAGE_ROWS_MIN + 1_234
    cols = frame(n, seed=5)
    bmi = np.asarray(cols["bmi"], dtype=np.float64)
    bmi[[7, n // 2, n - 1]] = [np.nan, np.inf, -np.inf]
    nulls = np.zeros(n, dtype=bool)
    nulls[[3, _arrow._STAGE_ROWS_MIN + 1]] = True
    table = pa.table({**cols, "bmi": pa.array(bmi), "age": pa.array(cols["age"], mask=nulls)})
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=_arrow._STAGE_ROWS_MIN + 3_000)
    assert pq.read_metadata(path).num_row_groups == 2
    features = table.drop_columns(["Id", "y"])
    want = np.column_stack([c.to_numpy(zero_copy_only=False).astype(np.float64) for c in features.columns])
    X, finite = _arrow._matrix_finite(features.to_batches(max_chunksize=n), n)
    assert not finite and X.flags.c_contiguous and X.tobytes() == want.tobytes()
    text = {**cols, "bmi": bmi, "age": [("" if gap else str(v)) for v, gap in zip(cols["age"], nulls)]}
    csv = load_csv(DataSpec(to_csv(text, tmp_path / "big.csv"), "y", "sick", ignore=("Id",), missing="drop"))
    got = load_data(DataSpec(None, "y", "sick", ignore=("Id",), parquet=path, missing="drop"))
    same(got, csv)
    assert got.rows_dropped == 5 and got.X.shape == (n - 5, 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from(["yes", " yes", "no", "no ", "", "x"]),
                                   st.text(max_size=3)), max_size=40), min_size=1, max_size=4))
def test_dictionary_label_codes_are_the_decoded_columns(groups: list[list]) -> None:
    """A text label read as a dictionary is coded group by group (_DictCodes): the codes and
    values in order of first appearance that `_label_codes` gives for the decoded column — with
    nulls, values equal once stripped, and more distinct values than a scan each (np.unique)."""
    from fedpeer.data.sources import csv_arrow as _arrow
    from fedpeer.data.sources import parquet as parquetsource

    chunks = []
    for g in groups:      # a dictionary in another order than first appearance, with an unused value
        encoded = pa.array(g, pa.string()).dictionary_encode()
        values = encoded.dictionary.to_pylist() + ["unused"]
        order = list(reversed(range(len(values))))
        where = {old: new for new, old in enumerate(order)}
        indices = pa.array([None if i is None else where[i] for i in encoded.indices.to_pylist()], pa.int32())
        chunks.append(pa.DictionaryArray.from_arrays(indices, pa.array([values[i] for i in order], pa.string())))
    n = sum(len(g) for g in groups)
    coder, start = _arrow._DictCodes(n, parquetsource._label_from_text), 0
    for chunk in chunks:
        start = coder.add(start, chunk)
    codes, uniques = _arrow._label_codes(pa.chunked_array([pa.array(g, pa.string()) for g in groups]),
                                         parquetsource._label_from_text)
    assert start == n and coder.codes.tolist() == codes.tolist() and coder.uniques == uniques


def test_a_label_of_many_values_read_as_a_dictionary(tmp_path: Path) -> None:
    """More label values per row group than _FIRST_SCANS_MAX, over several row groups, some null."""
    from fedpeer.data.sources import csv_arrow as _arrow

    n = 5_000
    rng = np.random.default_rng(3)
    labels = [None if v == 0 else f" c{v}" for v in rng.integers(0, 3 * _arrow._FIRST_SCANS_MAX, n)]
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"a": rng.normal(size=n), "y": labels}), path, row_group_size=1_200)
    got = load_data(DataSpec(None, "y", None, parquet=path, missing="drop"), binary=False)
    want = [v.strip() for v in labels if v is not None]
    assert got.labels.tolist() == want and got.rows_dropped == labels.count(None)
