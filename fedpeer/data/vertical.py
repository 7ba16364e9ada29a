"""A vertical site's rows ([data] partition = "vertical"): its own columns of entities whose other
columns other sites hold, each row named by its ID ([data] id_column). The sites' rows are aligned
by a private set intersection of the IDs (fedpeer/protocols/psi.py) before a job uses them.

Rules of this module:
- The ID column is read as text, surrounding spaces stripped, and compared as such: "0042" and
  "42" are two IDs. It is never a feature; nor is the label column, when one is set (the jobs
  that run over vertical sites need none).
- Every ID names one row. An ID twice, or a row without one, is refused with the file, the
  column and the fix (missing = "drop" drops rows without an ID, as for any missing value);
  the words other sites read name neither the ID nor the row.
- Every other check is the horizontal one (fedpeer/data/dataset.py `load_data`): the same
  sources, limits and missing-value policies for the feature columns.
- The schema fingerprint is VERTICAL_FINGERPRINT at every vertical site: a vertical job's members
  hold other columns by design, so what the job's start compares is the partition.
- Pure: the block holds the site's rows; `aligned` gives them in the order a job's intersection
  derived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from fedpeer.data.dataset import Dataset, DataSpec, load_data
from fedpeer.data.spec import VERTICAL_FINGERPRINT
from fedpeer.errors import DataError

__all__ = ["VerticalBlock", "load_vertical", "id_problem"]

_SHOWN_IDS_MAX = 3          # duplicate IDs quoted in one (local) message


@dataclass(frozen=True, eq=False)
class VerticalBlock:
    """One vertical site's checked rows: its feature columns and each row's ID. Quacks like a
    `Dataset` for what the job lifecycle and `fedpeer data check` read (features, rows,
    fingerprint, rows_dropped, cells_imputed, missing_counts)."""

    features: tuple[str, ...]
    X: np.ndarray                   # float64 (rows, features), finite, read-only
    ids: np.ndarray                 # str (rows,): each row's ID, unique
    id_column: str
    rows_dropped: int = 0
    cells_imputed: int = 0
    missing_counts: tuple[tuple[str, int], ...] = ()
    # the fewest aligned rows this site agrees to reveal and compute on ([policy] rows_min): the
    # intersection is refused below it before any common ID is revealed
    aligned_rows_min: int = 0
    # the most IDs another member may announce ([policy] ids_max): refused before any ID is blinded
    aligned_ids_max: int = 1_000_000
    source: str = field(default="", repr=False)

    partition: ClassVar[str] = "vertical"
    engine: ClassVar[str] = "memory"
    fingerprint: ClassVar[bytes] = VERTICAL_FINGERPRINT
    y: ClassVar[None] = None

    @property
    def rows(self) -> int:
        return int(self.X.shape[0])

    def aligned(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """This site's rows in the order `positions` gives (indices into its rows, the order of a
        job's intersection), read-only."""
        X = np.ascontiguousarray(self.X[np.asarray(positions, dtype=np.int64)])
        X.setflags(write=False)
        return X


def id_problem(ids: np.ndarray, where: object, id_column: str) -> DataError | None:
    """The DataError for IDs that are not unique (None: they are): locally the IDs repeated and how
    often, publicly only that some repeat."""
    values, counts = np.unique(ids, return_counts=True)
    repeated = counts > 1
    if not repeated.any():
        return None
    first = zip(values[repeated][:_SHOWN_IDS_MAX], counts[repeated])
    shown = ", ".join(f"{str(v)!r} ({int(c)} rows)" for v, c in first)
    more = int(repeated.sum()) - _SHOWN_IDS_MAX
    return DataError(f"{where}: ID column {id_column!r} holds the same ID on more than one row: {shown}"
                     + (f" and {more} more" if more > 0 else "")
                     + "; a vertical site holds one row per entity: merge or remove the repeated rows",
                     public=f"its ID column {id_column!r} names some entity on more than one row; a vertical "
                            "site holds one row per entity: fix the data there")


def load_vertical(spec: DataSpec, id_column: str, *, rows_max: int, bytes_max: int,
                  aligned_rows_min: int = 0, aligned_ids_max: int = 1_000_000) -> VerticalBlock:
    """Read and check a vertical site's rows: `spec` as for a job without a label (its label, if
    any, among the ignored columns), `id_column` the ID column. DataError for every problem."""
    spec = DataSpec(csv=spec.csv, parquet=spec.parquet, sql=spec.sql, dsn_file=spec.dsn_file,
                    sql_timeout_ms=spec.sql_timeout_ms, label=id_column, positive=None,
                    ignore=tuple(c for c in spec.ignore if c != id_column), missing=spec.missing)
    try:   # the ID column is read as the label is: text, checked, rows without one dropped or refused
        dataset = load_data(spec, binary=False, rows_max=rows_max, bytes_max=bytes_max)
    except DataError as exc:
        raise _as_id_error(exc, id_column) from None
    problem = id_problem(dataset.labels, spec.source, id_column)
    if problem is not None:
        raise problem
    return replace(_block(dataset, id_column, spec, aligned_rows_min), aligned_ids_max=aligned_ids_max)


def _block(dataset: Dataset, id_column: str, spec: DataSpec, aligned_rows_min: int) -> VerticalBlock:
    ids = np.asarray(dataset.labels, dtype=str)
    ids.setflags(write=False)
    return VerticalBlock(dataset.features, dataset.X, ids, id_column, dataset.rows_dropped, dataset.cells_imputed,
                         dataset.missing_counts, aligned_rows_min, str(spec.source))


_WORDING = (("the label column", "the ID column"), ("label column", "ID column"), ("[data] label", "[data] id_column"),
            ("is it really the class column?", ""), ("really the class column?", "really the ID column?"))


def _as_id_error(exc: DataError, id_column: str) -> DataError:
    """A DataError of the loader about the label column, in the words of the ID column it was."""
    def reword(text: str) -> str:
        for old, new in _WORDING:
            text = text.replace(old, new)
        return text
    message, public = str(exc), getattr(exc, "public", None)
    if "label" not in message and (public is None or "label" not in public):
        return exc
    return DataError(reword(message), public=reword(public) if public else None)
