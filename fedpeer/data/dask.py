"""A site's rows on its own Dask cluster: `[data] engine = "dask"`.

A site bigger than one machine keeps its rows partitioned on its Dask cluster; the daemon holds
futures and small totals only. Rules of this module:

- Partitions are the part files of a Parquet directory (or one Parquet file) or the files a CSV
  glob matches, in sorted order — the order the memory engine reads a Parquet directory in. Each
  is read ON A WORKER by fedpeer's own checked reader (`ml.data.load_data`, binary=False), so a
  partition's matrix, labels, missing-value policy and messages are exactly the memory engine's
  (a message names the part file and its row). The checks that need every row (two classes, the
  positive class present, rows_max) run on the daemon over the parts' small summaries.
- Work whose results are additive runs as one task per partition; the results are summed on the
  workers (a tree of `_add` tasks) and only the total is gathered: `additive(fn, ...)` for stats,
  the label statistics, sketch counts and level histograms of histogram XGBoost, BOFRF's per-tree
  confusion matrices (dask_bofrf.py: its forest is trained on one worker, GATHERED_ROWS_MAX rows).
- State per row that histogram XGBoost keeps between steps (bins, margins, g and h, each row's
  node) stays on the workers: every partition holds a `HistSite` over its rows, and a step
  replaces it by a new one (`_step`: a shallow copy updated by the same method the memory engine
  calls), so a retried or moved task never sees half-updated state. The daemon holds one future
  per partition.
- Every call to the cluster blocks: the daemon makes them in worker threads (asyncio.to_thread),
  never on its event loop. Every wait has a named limit ([data] dask_connect_timeout_ms,
  dask_step_timeout_ms). A failure of the cluster (scheduler unreachable, a worker lost, a step
  past its limit) is a JobError naming the scheduler; a DataError raised in a task (the site's
  data) keeps its own message.

A worker lost mid-job: Dask computes what it held again from the steps that led to it (the
scheduler keeps each state's lineage while a later state depends on it — it grows by one task per
partition and step, small descriptions, not rows), so the job goes on; what cannot be recomputed
(the scheduler gone) fails the job as above.

Sums of integers (counts, quantised gradients) are the same on any partition of the rows, so
histogram XGBoost gives the memory engine's model byte for byte; float sums (stats' Σx, Σx²)
may differ in their last bits (summation order).
"""

from __future__ import annotations

import asyncio
import glob
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.data.dataset import (
    FEATURE_TYPE_FLOAT,
    DataSpec,
    _quote_list,
    binary_label_problem,
    load_data,
    schema_fingerprint,
)
from fedpeer.data.spec import need_extra
from fedpeer.errors import DataError, JobError

__all__ = ["DaskSite", "open_site", "part_files"]

SUM_FAN_IN = 8                 # partial results added per task of the summing tree
CLOSE_TIMEOUT_S = 10           # closing a job's client in its background thread


def part_files(data: Any) -> tuple[str, list[Path]]:
    """("csv" or "parquet", the partitions' files, sorted). DataError if none."""
    if data.parquet:
        from fedpeer.data.sources.parquet import _parquet_files

        path = Path(data.parquet)
        if not path.exists():
            raise DataError(f"{path}: file not found; check the data path in the job or site configuration")
        return "parquet", [Path(p) for p in _parquet_files(path)]
    files = sorted(Path(p) for p in glob.glob(data.csv) if Path(p).is_file())
    if not files:
        raise DataError(f"{data.csv}: no file matches; point csv at a file or a glob such as \"parts/*.csv\"")
    return "csv", files


@dataclass(frozen=True, eq=False)
class _Part:
    """One partition's checked rows, on a worker, and the reader's facts about them."""

    X: np.ndarray
    y: np.ndarray | None               # int8 0/1 when [data] positive is set
    labels: np.ndarray                 # str (rows,)
    features: tuple[str, ...]
    rows_dropped: int
    missing: tuple[tuple[str, int], ...]


def _load_part(kind: str, file: str, label: str | None, positive: str | None, ignore: tuple[str, ...],
               missing: str, rows_max: int, bytes_max: int) -> _Part:
    spec = DataSpec(csv=Path(file) if kind == "csv" else None, parquet=Path(file) if kind == "parquet" else None,
                    label=label, positive=None, ignore=ignore, missing=missing, empty_ok=True)
    ds = load_data(spec, binary=False, rows_max=rows_max, bytes_max=bytes_max)
    y = None if positive is None else (ds.labels == positive).astype(np.int8)
    return _Part(X=ds.X, y=y, labels=ds.labels, features=ds.features, rows_dropped=ds.rows_dropped,
                 missing=ds.missing_counts)


def _facts(part: _Part) -> dict:
    values, counts = np.unique(part.labels, return_counts=True)
    return {"rows": int(part.X.shape[0]), "labels": {str(v): int(c) for v, c in zip(values, counts)},
            "features": part.features, "rows_dropped": part.rows_dropped, "missing": part.missing}


def _add(*parts: Any) -> Any:
    """The sum of partial results: arrays, or tuples of arrays added entry by entry."""
    if isinstance(parts[0], tuple):
        return tuple(_add(*column) for column in zip(*parts))
    total = np.array(parts[0], copy=True)
    for p in parts[1:]:
        total += p
    return total


def _apply(part: _Part, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(part.X, part.y, *args)


class DaskSite:
    """A site's rows on its Dask cluster, as a job sees them (module docstring). Quacks like
    `ml.data.Dataset` for what the registry and `fedpeer data check` read (features,
    fingerprint, rows, rows_dropped), holds futures instead of X."""

    engine = "dask"
    partition = "horizontal"        # [data] partition = "vertical" is memory-engine only

    def __init__(self, client: Any, scheduler: str, parts: list[Any], summary: dict, step_timeout_ms: int) -> None:
        self.client, self.scheduler = client, scheduler
        self.parts = parts
        self.features: tuple[str, ...] = tuple(summary["features"])
        self.fingerprint = schema_fingerprint(self.features, [FEATURE_TYPE_FLOAT] * len(self.features))
        self.rows: int = summary["rows"]
        self.part_rows: list[int] = summary["part_rows"]
        self.rows_dropped: int = summary["rows_dropped"]
        self.label_counts: dict[str, int] = summary["labels"]
        self.missing_counts = tuple(summary["missing"].items())
        self.cells_imputed = 0
        self.step_timeout_ms = step_timeout_ms
        self._closed = False

    # -- talking to the cluster (blocking: call in a worker thread) ----------------------------

    def wait(self, futures: Any) -> Any:
        """Gather futures within the step limit; a cluster failure as a JobError naming the scheduler."""
        return self._guarded(lambda: self.client.gather(_waited(self.client, futures, self.step_timeout_ms)))

    def _guarded(self, call: Callable[[], Any]) -> Any:
        """call(); a failure of the cluster as a JobError naming the scheduler (a task's DataError,
        the site's data, passes as it is)."""
        try:
            return call()
        except (DataError, JobError):
            raise
        except TimeoutError:
            lost = self.client.status != "running"
            raise JobError(f"Dask cluster {self.scheduler}: " + (
                "the connection to the scheduler was lost" if lost else "a step did not finish") +
                f" within [data] dask_step_timeout_ms {self.step_timeout_ms} ms") from None
        except Exception as exc:   # noqa: BLE001  (a worker lost, the scheduler gone: this job fails, not the daemon)
            raise JobError(f"Dask cluster {self.scheduler}: {type(exc).__name__}: {exc}") from None

    def settle(self, futures: Sequence[Any]) -> None:
        """Wait until the futures are computed where they run, within the step limit; raise the
        first failure (a task's own error) without gathering any result."""
        def check() -> None:
            _waited(self.client, futures, self.step_timeout_ms)
            for f in futures:
                if f.status != "finished":
                    f.result()           # raises the task's exception (or CancelledError)
                    raise JobError(f"Dask cluster {self.scheduler}: a task ended {f.status!r}")
        self._guarded(check)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._guarded(lambda: self.client.submit(fn, *args, pure=False))

    def total(self, futures: Sequence[Any]) -> Any:
        """The sum of one partial result per partition, added on the workers; only it is gathered."""
        level = list(futures)
        while len(level) > 1:
            level = [self.submit(_add, *level[i:i + SUM_FAN_IN]) for i in range(0, len(level), SUM_FAN_IN)]
        return self.wait(level[0])

    def map_total(self, fn: Callable[..., Any], states: Sequence[Any], *args: Any) -> Any:
        return self.total([self.submit(fn, s, *args) for s in states])

    def sum_parts(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Σ over partitions of fn(X, y, *args) (blocking)."""
        return self.map_total(_apply, self.parts, fn, *args)

    async def additive(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Σ over partitions of fn(X, y, *args): the memory engine's fn(X, y, *args) on all rows,
        computed where the rows are (off the event loop)."""
        return await asyncio.to_thread(self.sum_parts, fn, *args)

    def close(self) -> None:
        """Release the partitions (the workers free them) and the client in a background thread:
        callable from the event loop, never blocks it. A "local" cluster stays for the next job."""
        if self._closed:
            return
        self._closed = True
        client, self.parts = self.client, []

        def shut() -> None:
            try:
                client.close(timeout=CLOSE_TIMEOUT_S)
            except Exception:   # noqa: BLE001  (best effort: the job has ended either way)
                pass
        threading.Thread(target=shut, name="dask-close", daemon=True).start()


def _waited(client: Any, futures: Any, timeout_ms: int) -> Any:
    from distributed import wait

    with client.as_current():          # the daemon's clients are never the process's default
        wait(futures, timeout=timeout_ms / 1000)
    return futures


_LOCAL_LOCK = threading.Lock()
_LOCAL: dict[int, Any] = {}     # scheduler = "local": one LocalCluster per worker count, kept for the next job


def _local_cluster(workers: int) -> Any:
    """This process's LocalCluster of `workers` worker processes: started by the first job that
    needs it and kept, so the next jobs pay neither its start nor the workers' imports (distributed
    closes it when the daemon exits)."""
    import logging

    from distributed import LocalCluster

    with _LOCAL_LOCK:
        cluster = _LOCAL.get(workers)
        if cluster is None or cluster.status.name not in ("running", "created"):
            cluster = _LOCAL[workers] = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1",
                silence_logs=logging.WARNING)
        return cluster


def connect(data: Any) -> Any:
    """A client of [data] scheduler ("local": this process's LocalCluster of worker processes)."""
    from distributed import Client

    timeout_s = data.dask_connect_timeout_ms / 1000
    try:
        if data.scheduler == "local":
            return Client(_local_cluster(data.dask_workers), timeout=timeout_s, set_as_default=False)
        return Client(data.scheduler, timeout=timeout_s, set_as_default=False)
    except Exception as exc:   # noqa: BLE001
        raise JobError(f"[data] scheduler {data.scheduler}: cannot reach the Dask scheduler within "
                       f"dask_connect_timeout_ms {data.dask_connect_timeout_ms} ms ({type(exc).__name__}: "
                       f"{exc}); start the cluster or fix the address") from None


def open_site(data: Any, limits: Any, *, needs_label: bool, binary: bool) -> DaskSite:
    """Read the site's partitions on its cluster and check them as the memory engine would.
    Blocking (the daemon calls it in a worker thread)."""
    if data.missing not in ("error", "drop"):       # config/load.py refuses it too: one imputer needs every row
        raise DataError(f"{data.parquet or data.csv}: engine = \"dask\" supports missing = \"error\" or \"drop\", "
                        f"not {data.missing!r}")
    need_extra("distributed", "dask", '[data] engine = "dask"')
    kind, files = part_files(data)
    if kind == "parquet":
        need_extra("pyarrow.parquet", "parquet", "[data] parquet")
    label = data.label if needs_label else None
    ignore = tuple(data.ignore) if needs_label else (*data.ignore, *((data.label,) if data.label and
                                                                     data.label not in data.ignore else ()))
    site = DaskSite(connect(data), data.scheduler, [], _EMPTY, data.dask_step_timeout_ms)
    try:
        args = (label, data.positive or None if needs_label else None, ignore, data.missing,
                limits.data_rows_max, limits.data_bytes_max)
        site.parts = [site.submit(_load_part, kind, str(f), *args) for f in files]
        site.settle(site.parts)              # a bad part: the first in file order is the one named
        facts = site.wait([site.submit(_facts, p) for p in site.parts])
        _check_parts(site, data, files, facts, needs_label=needs_label, binary=binary,
                     rows_max=limits.data_rows_max)
        return site
    except BaseException:
        site.close()
        raise


_EMPTY = {"features": (), "rows": 0, "part_rows": [], "rows_dropped": 0, "labels": {}, "missing": {}}


def _check_parts(site: DaskSite, data: Any, files: list[Path], facts: list[dict], *, needs_label: bool,
                 binary: bool, rows_max: int) -> None:
    """The checks that need every row, on the parts' facts; fills in the site's summary."""
    where = data.parquet or data.csv
    first = facts[0]["features"]
    for f, fact in zip(files, facts):
        if fact["features"] != first:
            raise DataError(f"{where}: part file {f.name} has other feature columns than {files[0].name} "
                            f"({_quote_list(list(fact['features']))} against {_quote_list(list(first))}); every "
                            "part must have the same columns")
    rows = sum(fact["rows"] for fact in facts)
    if rows > rows_max:
        raise DataError(f"{where}: has more than {rows_max} data rows (rows_max) in its {len(files)} parts; use a "
                        "sample of the data or raise the limit")
    labels: dict[str, int] = {}
    missing: dict[str, int] = dict.fromkeys(first, 0)
    for fact in facts:
        for k, v in fact["labels"].items():
            labels[k] = labels.get(k, 0) + v
        for k, v in fact["missing"]:
            missing[k] += v
    dropped = sum(fact["rows_dropped"] for fact in facts)
    if rows == 0:      # a part may be empty (Spark writes empty parts) or lose every row to missing = "drop"
        parts = f"its {len(files)} part{'s' * (len(files) != 1)}"
        raise DataError(f"{where}: all {dropped} data rows of {parts} have a missing or infinite value; nothing "
                        "is left after dropping them" if dropped else
                        f"{where}: {parts} {'hold' if len(files) != 1 else 'holds'} no data rows")
    present = sorted(labels)
    if needs_label and binary:
        problem = binary_label_problem(where, data.label, data.positive or None, present, rows)
        if problem is not None:
            raise DataError(problem)
    if needs_label and data.positive and data.positive not in present:
        raise DataError(f"{where}: positive class {data.positive!r} is not a value of label column "
                        f"{data.label!r}; the values are {_quote_list(present)}")
    site.features = tuple(first)
    site.fingerprint = schema_fingerprint(site.features, [FEATURE_TYPE_FLOAT] * len(site.features))
    site.rows, site.part_rows = rows, [fact["rows"] for fact in facts]
    site.rows_dropped = dropped
    site.label_counts = labels if needs_label else {}
    site.missing_counts = tuple(missing.items())
