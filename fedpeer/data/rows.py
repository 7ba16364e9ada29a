"""A site's rows as a job asks them for additive totals, whichever engine holds them.

`rows_of(ctx.data)` is the one place the engine is chosen: a `Dataset` (engine = "memory", the
rows in the daemon) is wrapped in `MemoryRows`, which computes fn(X, y, *args) on all rows with
numpy exactly as the jobs always have (inline: the memory engine's numbers and speed are today's);
a `DaskSite` (engine = "dask", fedpeer/data/dask.py) computes the same function on each
partition where the rows are and returns the sum. So a job's site-local step is written once, as
a function whose result is additive over rows (a sum, or a tuple of sums).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MemoryRows", "rows_of"]


class MemoryRows:
    """A Dataset's rows, in the daemon."""

    engine = "memory"

    def __init__(self, dataset: Any) -> None:
        self.data = dataset

    async def additive(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.data.X, self.data.y, *args)


def rows_of(data: Any) -> Any:
    """MemoryRows of a Dataset, or the DaskSite itself (it has `additive` too)."""
    return data if getattr(data, "engine", "memory") == "dask" else MemoryRows(data)
