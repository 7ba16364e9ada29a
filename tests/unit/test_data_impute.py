"""missing = "impute": each site fills its own gaps with an IterativeImputer fitted on its own rows
only; a test file is filled by the imputer of the site's data file, never fitted on test rows. And
`fedpeer data check`, run as an operator runs it, prints what a job would load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.experimental import enable_iterative_imputer  # noqa: F401
from sklearn.impute import IterativeImputer

from fedpeer.app.sitefiles import init_site
from fedpeer.config import load as cfg
from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.data.site import load_site
from fedpeer.errors import ConfigError, DataError


def write(tmp_path: Path, text: str, name: str = "site.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def table(rows: list[list[object]], header: str = "a,b,c,y") -> str:
    return header + "\n" + "".join(",".join(str(v) for v in row) + "\n" for row in rows)


def correlated(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n)
    return np.c_[a, 2 * a + rng.normal(scale=0.01, size=n), rng.normal(size=n)]


def test_impute_fills_gaps_from_this_sites_rows(tmp_path: Path) -> None:
    X = correlated(60, 1)
    y = (X[:, 2] > 0).astype(int)
    raw = X.copy()
    raw[3, 1] = raw[10, 0] = np.nan
    raw[20, 2] = np.inf
    cells = [["NA" if v != v else ("inf" if v == np.inf else repr(v)) for v in row] + [lab]
             for row, lab in zip(raw.tolist(), y.tolist())]
    cells[30][3] = "?"                                     # a missing label: that row is dropped, not imputed
    path = write(tmp_path, table(cells))
    with pytest.raises(DataError, match="missing"):
        load_csv(DataSpec(path, "y", "1"))
    ds = load_csv(DataSpec(path, "y", "1", missing="impute"))
    assert ds.rows == 59 and ds.rows_dropped == 1 and ds.cells_imputed == 3 and np.isfinite(ds.X).all()
    assert dict(ds.missing_counts) == {"a": 1, "b": 1, "c": 1}
    keep = np.arange(60) != 30
    want = raw[keep].copy()
    want[~np.isfinite(want)] = np.nan
    expected = IterativeImputer(max_iter=10, random_state=0, keep_empty_features=True).fit(want).transform(want)
    assert np.array_equal(ds.X, expected)
    assert abs(ds.X[3, 1] - 2 * X[3, 0]) < 0.1             # MICE used the a-b relation, not the mean
    assert ds.X[2].tolist() == X[2].tolist()              # observed values untouched
    # The fingerprint is the one of error/drop: imputing is site-local, the schema is not changed.
    assert ds.fingerprint == load_csv(DataSpec(path, "y", "1", missing="drop")).fingerprint


def test_test_rows_are_filled_by_the_sites_imputer_never_fitted_on_them(tmp_path: Path) -> None:
    X = correlated(80, 2)
    train_cells = [[repr(v) for v in row] + [i % 2] for i, row in enumerate(X.tolist())]
    train_cells[5][0] = "NA"
    train = write(tmp_path, table(train_cells), "train.csv")
    T = correlated(10, 3) * 100                         # test rows from elsewhere: a fit on them would differ
    test_cells = [[repr(v) for v in row] + [i % 2] for i, row in enumerate(T.tolist())]
    test_cells[4][1] = ""
    test = write(tmp_path, table(test_cells), "test.csv")
    spec = DataSpec(train, "y", "1", missing="impute")
    ds = load_csv(spec)
    filled = load_csv(DataSpec(test, "y", "1", missing="impute"), impute_from=ds)
    raw = T.copy()
    raw[4, 1] = np.nan
    assert np.array_equal(filled.X, ds.imputer.transform(raw))
    alone = load_csv(DataSpec(test, "y", "1", missing="impute"))          # what a fit on test rows would give
    assert filled.X[4, 1] != alone.X[4, 1]

    # A site whose data file has no gaps: its test gaps are filled by an imputer fitted on its rows.
    clean = write(tmp_path, table([[repr(v) for v in row] + [i % 2] for i, row in enumerate(X.tolist())]), "clean.csv")
    ds = load_csv(DataSpec(clean, "y", "1", missing="impute"))
    assert ds.imputer is None and ds.cells_imputed == 0
    filled = load_csv(DataSpec(test, "y", "1", missing="impute"), impute_from=ds)
    fitted = IterativeImputer(max_iter=10, random_state=0, keep_empty_features=True).fit(X)
    assert np.array_equal(filled.X, fitted.transform(raw))


def test_a_jobs_own_test_rows_never_take_part_in_fitting_the_imputer(tmp_path: Path) -> None:
    """A job that splits off test rows (bofrf, xgboost: test_fraction) fits the imputer again on its
    training part; the load's imputer, fitted on all rows, is not the one that fills the parts."""
    from types import SimpleNamespace

    from fedpeer.data.dataset import split_mask, split_train_test
    from fedpeer.jobs.kind import site_seed
    from fedpeer.kinds.xgboost import kind as xgb

    X = correlated(120, 5)
    y = np.arange(120) % 2
    in_test = split_mask(120, (y == 1).astype(np.int8), 0.25, 7)     # as the Dataset's y will split
    tests, trains = np.flatnonzero(in_test), np.flatnonzero(~in_test)
    raw = X.copy()
    for r, c in ((trains[1], 1), (trains[20], 0), (trains[50], 2), (tests[2], 1), (tests[9], 0), (tests[20], 1)):
        raw[r, c] = np.nan

    def load(rows: np.ndarray):   # noqa: ANN202
        cells = [["NA" if v != v else repr(v) for v in row] + [lab] for row, lab in zip(rows.tolist(), y.tolist())]
        return load_csv(DataSpec(write(tmp_path, table(cells)), "y", "1", missing="impute"))
    ds = load(raw)
    assert np.array_equal(in_test, split_mask(120, ds.y, 0.25, 7)) and in_test.sum() == 30
    assert np.isnan(raw[in_test]).any() and np.isnan(raw[~in_test]).any()
    train, test = split_train_test(ds, 0.25, seed=7)
    fitted = IterativeImputer(max_iter=10, random_state=0, keep_empty_features=True).fit(raw[~in_test])
    assert np.array_equal(train.X, fitted.transform(raw[~in_test]))
    assert np.array_equal(test.X, fitted.transform(raw[in_test]))
    assert (train.cells_imputed, test.cells_imputed) == (int(np.isnan(raw[~in_test]).sum()),
                                                         int(np.isnan(raw[in_test]).sum()))
    assert not np.array_equal(train.X, ds.X[~in_test])   # the load's imputer (all rows) fills otherwise

    # The test rows' values change nothing in the training part.
    far = raw.copy()
    far[in_test] *= 100
    train_far, test_far = split_train_test(load(far), 0.25, seed=7)
    assert np.array_equal(train_far.X, train.X) and not np.array_equal(test_far.X, test.X)

    # xgboost's split keeps it (it relabels the Dataset before splitting).
    params = {name: param.default for name, param in xgb.PARAMS.items()}
    me = b"\x01" * 32
    site = SimpleNamespace(params=params, ctx=SimpleNamespace(data=ds), me=me)
    xgb.prepare(site)
    mask = split_mask(120, ds.y, params["test_fraction"], site_seed(params["seed"], me))
    fitted = IterativeImputer(max_iter=10, random_state=0, keep_empty_features=True).fit(raw[~mask])
    assert np.array_equal(site.fit[0], fitted.transform(raw[~mask]))
    assert np.array_equal(site.test[0], fitted.transform(raw[mask]))

    # A column whose values all fell in the test part cannot be imputed from the training part.
    lone = raw.copy()
    lone[:, 2] = np.nan
    lone[tests[0], 2] = 1.0
    with pytest.raises(DataError, match="column 'c' has no value in the training part"):
        split_train_test(load(lone), 0.25, seed=7)


def test_load_site_imputes_test_csv_with_the_sites_imputer(tmp_path: Path) -> None:
    X = correlated(40, 4)
    cells = [[repr(v) for v in row] + [i % 2] for i, row in enumerate(X.tolist())]
    cells[0][2] = "NA"
    train = write(tmp_path, table(cells), "train.csv")
    test = write(tmp_path, table([["NA", 1, 2, 0], [1, 2, 3, 1]]), "test.csv")
    data = cfg.DataSection(csv=str(train), label="y", positive="1", missing="impute", test_csv=str(test))
    ds, held = load_site(data, cfg.JobLimits(), needs_label=True, binary=True)
    assert np.array_equal(held.X, ds.imputer.transform(np.array([[np.nan, 1, 2], [1, 2, 3]], dtype=float)))
    other = write(tmp_path, table([["NA", 1, 0], [1, 2, 1]], "a,b,y"), "other.csv")
    with pytest.raises(DataError, match="other.csv: its feature columns"):
        load_site(cfg.DataSection(csv=str(train), label="y", positive="1", missing="impute", test_csv=str(other)),
                  cfg.JobLimits(), needs_label=True, binary=True)


def test_impute_refusals(tmp_path: Path) -> None:
    path = write(tmp_path, table([[1, "NA", 2, 0], [2, "", 3, 1], [3, "?", 4, 1]]))
    with pytest.raises(DataError) as err:
        load_csv(DataSpec(path, "y", "1", missing="impute"))
    assert str(err.value).startswith(f"{path}: column 'b' has no value in any row") and "ignore" in str(err.value)
    with pytest.raises(DataError, match='missing must be "error", "drop" or "impute"'):
        DataSpec(path, "y", missing="mean")


def test_config_takes_impute(tmp_path: Path) -> None:
    conf, _ = init_site(tmp_path / "s", "s", "127.0.0.1:17431")
    conf.write_text(conf.read_text() + '\n[data]\ncsv = "rows.csv"\nlabel = "y"\nmissing = "impute"\n')
    assert cfg.load(conf).data.missing == "impute"
    conf.write_text(conf.read_text().replace('"impute"', '"mean"'))
    with pytest.raises(ConfigError, match="impute"):
        cfg.load(conf)


# ---------------------------------------------------------------------------------------------
# fedpeer data check, as a subprocess.

def fedpeer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedpeer.app.cli", *args], capture_output=True, text=True, timeout=60)


def test_data_check_good_and_bad_files(tmp_path: Path) -> None:
    conf, _ = init_site(tmp_path / "s", "s", "127.0.0.1:17432")
    write(conf.parent, "Id,a,b,y\n1,1.5,NA,yes\n2,2.5,3,no\n3,3.5,4,yes\n4,,5,yes\n", "rows.csv")
    conf.write_text(conf.read_text() + '\n[data]\ncsv = "rows.csv"\nlabel = "y"\npositive = "yes"\n'
                                       'ignore = ["Id"]\nmissing = "drop"\n')
    run = fedpeer("data", "check", "--config", str(conf), "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["rows"] == 2 and doc["features"] == ["a", "b"] and doc["label_counts"] == {"no": 1, "yes": 1}
    assert doc["missing"] == {"a": 1, "b": 1} and doc["rows_dropped"] == 2
    expected = load_csv(DataSpec(conf.parent / "rows.csv", "y", "yes", ignore=("Id",), missing="drop"))
    assert doc["schema_fingerprint"] == expected.fingerprint.hex()
    text = fedpeer("data", "check", "--config", str(conf))
    assert text.returncode == 0 and "2 rows, 2 features" in text.stdout and expected.fingerprint.hex() in text.stdout
    assert "label balance: 'no' 1 (50.0 %), 'yes' 1 (50.0 %)" in text.stdout
    assert doc["binary_jobs"] == ["stats", "bofrf"] and doc["binary_refusal"] is None
    assert "would refuse" not in text.stdout

    # A third class: loaded (xgboost, logreg take it), and the line says what stats and bofrf would say.
    write(conf.parent, "Id,a,b,y\n1,1.5,2,yes\n2,2.5,3,no\n3,3.5,4,maybe\n", "three.csv")
    conf.write_text(conf.read_text().replace('"rows.csv"', '"three.csv"'))
    three = fedpeer("data", "check", "--config", str(conf))
    assert three.returncode == 0, three.stderr
    assert (f"binary jobs (stats, bofrf) would refuse it: {conf.parent / 'three.csv'}: label column 'y' has 3 "
            "distinct values ('maybe', 'no', 'yes'), a binary job needs exactly two") in three.stdout
    conf.write_text(conf.read_text().replace('"three.csv"', '"rows.csv"'))

    conf.write_text(conf.read_text().replace('missing = "drop"', 'missing = "error"'))
    bad = fedpeer("data", "check", "--config", str(conf))
    assert bad.returncode == 1 and bad.stdout == ""
    assert f"{conf.parent / 'rows.csv'}: column 'a' has 1 missing value (first at data row 4, line 5)" in bad.stderr
    assert 'missing = "drop"' in bad.stderr
