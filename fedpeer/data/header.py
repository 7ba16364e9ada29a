"""[data] checked against its CSV's header row, without reading the rows: what `fedpeer init`
checks before it writes [data], and what a reload (`fedpeer reload`, SIGHUP) checks before it
takes a new [data] (the file is there and readable, the columns it names are in the header).
Each problem is a ConfigError naming the [data] key and the fix, worded as `data check` words it
(fedpeer/data/spec.py `not_in_header`)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedpeer.data.spec import not_in_header
from fedpeer.errors import ConfigError

HEADER_BYTES_MAX = 1024 * 1024    # the header row is read from at most this much of the file


def read_header(config_path: Path, data: Path, key: str = "data.csv") -> list[str]:
    """The CSV's header row (names stripped), or a ConfigError naming `key`, the file and the fix."""
    try:
        with open(data, encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader([f.readline(HEADER_BYTES_MAX)]), [])
    except FileNotFoundError:
        raise ConfigError(config_path, key, f"{data}: file not found; give the path of an existing CSV (in "
                          "peers.toml, a relative path is relative to its directory)") from None
    except (OSError, UnicodeDecodeError) as exc:
        problem = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(config_path, key, f"cannot read {data}: {problem}; let the fedpeer user read it, "
                          f"or fix [data] {key[5:]}") from None
    return [column.strip() for column in header]


def check_columns(config_path: Path, data: Path, header: Sequence[str], label: str | None,
                  ignore: Sequence[str] = (), id_column: str | None = None) -> None:
    """Every column [data] names (label, ignore, id_column) is in `header`, or a ConfigError naming
    the key, the nearest column and every column of the header."""
    named = [("data.label", f"label column {label!r}", label)] if label else []
    named += [("data.ignore", f"column {c!r} listed in ignore", c) for c in ignore]
    named += [("data.id_column", f"id_column {id_column!r}", id_column)] if id_column else []
    for key, subject, column in named:
        if column not in header:
            raise ConfigError(config_path, key, f"{data}: {not_in_header(subject, column, header)}; "
                              f"fix [data] {key[5:]}")


def check_section(config_path: Path, data: Any) -> None:
    """A loaded [data] (config.load's DataSection, paths resolved) against its CSV files: csv and
    test_csv exist and are readable, and csv's header holds the label, the ignored columns and the
    id_column. Parquet, SQL and Dask sources are checked when a job loads them."""
    if data is None or not data.csv or data.engine != "memory":
        return
    header = read_header(config_path, Path(data.csv))
    check_columns(config_path, Path(data.csv), header, data.label, data.ignore, data.id_column)
    if data.test_csv:
        read_header(config_path, Path(data.test_csv), "data.test_csv")


def other_class(data: Path, label: str, positive: str, rows_max: int = 1_000_000) -> str | None:
    """The label column's first value that is not `positive` (the other class of a binary label,
    for text people read), reading at most `rows_max` rows; None if there is none or the file
    cannot be read."""
    from fedpeer.data.spec import MISSING_TOKENS

    try:
        with open(data, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = [c.strip() for c in next(reader, [])]
            if label not in header:
                return None
            column = header.index(label)
            for i, row in enumerate(reader):
                value = row[column].strip() if len(row) > column else ""
                if value and value != positive and value.lower() not in MISSING_TOKENS:
                    return value
                if i >= rows_max:
                    return None
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None
