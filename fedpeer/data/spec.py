"""What every source of a site's rows shares: where the data is and how to read it (`DataSpec`),
the missing-value tokens, opening a file, and the checks and wording of a header's columns.

The sources (fedpeer/data/sources/) and the layer that finishes their output
(fedpeer/data/dataset.py) both build on this module; it imports neither.
"""

from __future__ import annotations

import codecs
import difflib
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from fedpeer.errors import DataError

MISSING_POLICIES = ("error", "drop", "impute")


# Cell texts (stripped, lower-cased) that mean "no value".
MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null", "?"})


_BOM = codecs.BOM_UTF8


_LIST_MAX = 12              # names/values quoted in one message before "... and N more"


@dataclass(frozen=True)
class DataSpec:
    """Where a site's data is and how to read it (from the job's configuration)."""

    csv: Path | None               # the CSV file (None when the data is a Parquet source)
    label: str | None              # None: the file has no label column (scoring new rows)
    positive: str | None = None    # the positive class value (as text in the CSV); required for binary jobs
    ignore: tuple[str, ...] = ()   # columns that are not features (identifiers like "Id")
    missing: str = "error"         # "error": a missing value or +/-Inf stops the job;
                                   # "drop": rows with one are dropped (and counted);
                                   # "impute": missing feature values are filled site-locally (MICE)
    parquet: Path | None = None    # a Parquet file or a directory of part files, instead of csv
    sql: str | None = None         # or: a PostgreSQL query whose result columns are the data (data/sources/sql.py)
    dsn_file: Path | None = None   # sql: the 0600 file holding the connection string
    sql_timeout_ms: int = 60_000   # sql: the server cancels a statement running longer
    empty_ok: bool = False         # no data rows (none in the file, or all dropped) is an empty Dataset,
                                   # not an error: one partition of a Dask site (data/dask.py)

    @property
    def source(self) -> Path:
        """The file (or Parquet directory) messages name."""
        if self.sql is not None:
            return "[data] sql"     # type: ignore[return-value]
        return self.csv if self.csv is not None else self.parquet   # type: ignore[return-value]

    def __post_init__(self) -> None:
        if [self.csv, self.parquet, self.sql].count(None) != 2:
            raise DataError(f"{self.csv or self.parquet or '[data] sql'}: data spec: give exactly one of csv, "
                            "parquet and sql")
        for name in ("csv", "parquet"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        where = f"{self.source}: data spec"
        if self.label is not None and (not isinstance(self.label, str) or not self.label.strip()):
            raise DataError(f"{where}: label must be the name of a column, got {self.label!r}")
        if self.positive is not None and not isinstance(self.positive, str):
            raise DataError(f"{where}: positive must be the positive class as text, got {self.positive!r}")
        if isinstance(self.ignore, str) or not all(isinstance(c, str) for c in self.ignore):
            raise DataError(f"{where}: ignore must be a list of column names, got {self.ignore!r}")
        object.__setattr__(self, "ignore", tuple(self.ignore))
        if self.missing not in MISSING_POLICIES:
            raise DataError(f"{where}: missing must be \"error\", \"drop\" or \"impute\", got {self.missing!r}")


def _quote_list(values: Sequence[str]) -> str:
    shown = ", ".join(repr(v) for v in values[:_LIST_MAX])
    more = len(values) - _LIST_MAX
    return shown + (f", ... and {more} more" if more > 0 else "")


def _example(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def near_column(name: str, columns: Sequence[str]) -> str:
    """" (did you mean 'X'?)": a column spelled alike but for case and spaces, else a close one."""
    close = [c for c in columns if c.strip().lower() == name.strip().lower()]
    if not close:
        lowered = {c.strip().lower(): c for c in columns}
        close = [lowered[c] for c in difflib.get_close_matches(name.strip().lower(), list(lowered), n=1, cutoff=0.75)]
    return f" (did you mean {close[0]!r}?)" if close else ""


def not_in_header(subject: str, name: str, header: Sequence[str]) -> str:
    """The words for a column [data] names that the header lacks (`data check`, a job's load, `init`,
    `reload`): the nearest name, and every column of the header (never cut short)."""
    return (f"{subject} not found{near_column(name, header)}; the columns are "
            f"{', '.join(repr(c) for c in header) or 'none'}")


def _parse_float(text: str) -> float | None:
    """float(text) for plain ASCII decimal notation; None if it is not a number."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not text.isascii() or "_" in text:      # float() also takes "1_000" and non-ASCII digits
        return None
    return value


def _is_missing_label(value: str) -> bool:
    if value.lower() in MISSING_TOKENS:
        return True
    number = _parse_float(value)
    return number is not None and not math.isfinite(number)


UNREADABLE = "its [data] file cannot be read; fix [data] in its peers.toml or the file's permissions"


def _open(path: Path) -> BinaryIO:
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataError(public=UNREADABLE, message=f"{path}: file not found; check the data path in the job or site "
                        "configuration") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a CSV file", UNREADABLE) from None
    except PermissionError:
        raise DataError(f"{path}: cannot be read (permission denied); let the fedpeer user read it",
                        UNREADABLE) from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read: {e.strerror or e}", UNREADABLE) from None
    return f


class RowPlaces(Protocol):
    """How a reader names a data row in messages: "data row N, line L" (CSV), "row N" (Parquet)."""

    def where(self, index: int) -> str: ...


class _NeedLines(Exception):
    """A message needs the line of a row, which only the Python parser knows."""


class _NoLines:
    """`_Rows` of the pyarrow path: it has no lines; asking for one sends the file to the Python parser.
    all_finite: the reader found every value of X finite while filling it (saves `_finish` a pass)."""

    def __init__(self, all_finite: bool = False) -> None:
        self.all_finite = all_finite

    def where(self, index: int) -> str:
        raise _NeedLines()


EXTRA_HINT = "pip install 'fedpeer[{extra}]'"


def need_extra(module: str, extra: str, what: str):
    """Import `module`, a library of one of fedpeer's optional extras (pyproject.toml: parquet, sql,
    dask), or raise a DataError naming the extra that installs it: only the feature that needs it
    fails (a job at this site, `fedpeer data check`), never the daemon."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        hint = EXTRA_HINT.format(extra=extra)
        raise DataError(f"{what} needs {module.partition('.')[0]}, which is not installed on this site: {hint}",
                        public=f"{what} needs fedpeer[{extra}], which is not installed there: {hint}") from None


def check_columns(where: object, header: Sequence[str], spec: DataSpec,
                  unique_fix: str = "column names must be unique") -> dict[str, int]:
    """Every source's column checks (CSV, Parquet, sql): unique names, the label and every ignored
    column present (with "did you mean"); returns name -> position. The label also listed in
    ignore is each caller's own message."""
    seen: dict[str, int] = {}
    for i, name in enumerate(header):
        if name in seen:
            raise DataError(f"{where}: column name {name!r} appears twice (columns {seen[name] + 1} and "
                            f"{i + 1}); {unique_fix}",
                            public=f"column {name!r} appears twice in its data's header; rename one")
        seen[name] = i
    if spec.label is not None and spec.label not in seen:
        raise DataError(f"{where}: {not_in_header(f'label column {spec.label!r}', spec.label, header)}",
                        public=f"its data has no label column {spec.label!r}; fix [data] label there")
    for name in spec.ignore:
        if name not in seen:
            raise DataError(f"{where}: {not_in_header(f'column {name!r} listed in ignore', name, header)}",
                            public=f"[data] ignore lists column {name!r}, which its data does not have")
    return seen


# The schema fingerprint every vertical site shows (fedpeer/data/vertical.py): its columns are its own by
# design, so the members of a vertical job agree on the partition, not on the columns.
VERTICAL_FINGERPRINT = hashlib.sha256(b"fedpeer.schema.vertical.v1\x00").digest()


def data_difference(mine_fp: bytes, mine: tuple[str, ...], theirs_fp: bytes, theirs: list[str], their_name: str,
                    my_name: str) -> str:
    """What differs between two members' data whose fingerprints differ, and the fix: one vertical
    and one horizontal ([data] partition), or their columns (`schema_difference`)."""
    if VERTICAL_FINGERPRINT in (mine_fp, theirs_fp):
        theirs_is = "vertical" if theirs_fp == VERTICAL_FINGERPRINT else "horizontal"
        mine_is = "vertical" if mine_fp == VERTICAL_FINGERPRINT else "horizontal"
        return (f"its data is {theirs_is}, {my_name}'s is {mine_is} ([data] partition); every member of a job "
                f"holds the same partition: set [data] partition = \"{mine_is}\" at {their_name}"
                + (" with its id_column" if mine_is == "vertical" else "")
                + ", or propose the job to the members that match")
    return schema_difference(mine, theirs, their_name, my_name)


def schema_difference(mine: tuple[str, ...], theirs: list[str], their_name: str, my_name: str) -> str:
    """What differs between two schemas whose fingerprints differ, and how to align them."""
    missing = [c for c in mine if c not in theirs]
    extra = [c for c in theirs if c not in mine]
    if missing or extra:
        return (f"columns differ from {my_name}'s: {their_name} lacks {missing[:10]} and has extra {extra[:10]}; "
                "align the CSV columns or use [data] ignore")
    if list(mine) != list(theirs):
        return f"same columns as {my_name} but in another order; reorder the CSV columns"
    return f"schema fingerprint differs from {my_name}'s (column types differ)"


def not_numeric(column: str) -> str:
    """The public words of a text value in a feature column (every source)."""
    return (f"column {column!r} holds a value that is not a number; fix it at that site, or list the column "
            "in [data] ignore if it is not a feature")
