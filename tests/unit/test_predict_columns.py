"""`fedpeer predict` finds the model's columns in new data by name: another order is read in the
model's order, and data that lacks some is refused in one line naming every missing column and the
columns the model does not know — never scored on the wrong columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedpeer.app.predict import _rows
from fedpeer.errors import DataError

FEATURES = tuple(f"c{i:02d}" for i in range(30))


def write(path: Path, columns: list[str]) -> Path:
    rows = [",".join(columns)]
    rows += [",".join(str(int(c[1:]) * 100 + r if c[1:].isdigit() else 7) for c in columns) for r in range(4)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_columns_in_another_order_are_read_in_the_models_order(tmp_path: Path) -> None:
    ordered, _ = _rows(write(tmp_path / "a.csv", list(FEATURES)), list(FEATURES), FEATURES)
    shuffled = list(np.random.default_rng(0).permutation(FEATURES)) + ["note"]
    X, _ = _rows(write(tmp_path / "b.csv", shuffled), shuffled, FEATURES)
    assert np.array_equal(X, ordered) and X[0, 29] == 2900


def test_missing_columns_are_refused_naming_every_one_and_the_unknown_ones(tmp_path: Path) -> None:
    header = [f for f in FEATURES if f not in ("c03", "c17", "c28", "c29")] + ["C03", "extra"]
    with pytest.raises(DataError) as err:
        _rows(write(tmp_path / "c.csv", header), header, FEATURES)
    text = str(err.value)
    assert "\n" not in text and "4 of the model's 30" in text
    assert "c03, c17, c28, c29" in text and "does not know: C03, extra" in text


def test_a_model_column_twice_in_the_header_is_refused(tmp_path: Path) -> None:
    header = [*FEATURES, "c05"]
    with pytest.raises(DataError, match="c05 appear more than once"):
        _rows(write(tmp_path / "d.csv", header), header, FEATURES)
