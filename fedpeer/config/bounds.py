"""Public feature bounds ([data] bounds; docs/operator-guide.md): what a differentially private job
may assume of a column without looking at the rows (histogram XGBoost places its cut points evenly
between them). A column's bounds are two finite numbers, low < high. They are configuration (read
with peers.toml, config/load.py) and travel in a proposal as canonical JSON (`dp_bounds`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

BOUNDS_COLUMNS_MAX = 10_000     # columns a bounds table may name
BOUNDS_TEXT_MAX = 60 * 1024     # characters of a proposal's dp_bounds (its canonical JSON, ASCII): below the
                                # 64 KiB a string may take on the wire (fedpeer/wire/frame.py STR_BYTES_MAX)


def parse_bounds(table: object, where: str = "bounds") -> dict[str, tuple[float, float]]:
    """A bounds table ({column: [low, high]}, from peers.toml or a proposal's JSON) checked:
    ValueError in one line naming the first bad entry."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table of column = [low, high], e.g. {{ age = [0, 120] }}")
    if len(table) > BOUNDS_COLUMNS_MAX:
        raise ValueError(f"{where}: {len(table)} columns, more than BOUNDS_COLUMNS_MAX {BOUNDS_COLUMNS_MAX}")
    out = {}
    for name, value in table.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}: a column name must be non-empty text")
        pair = value if isinstance(value, (list, tuple)) else ()
        numbers = [v for v in pair if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(pair) != 2 or len(numbers) != 2 or not all(math.isfinite(float(v)) for v in numbers) \
                or not float(numbers[0]) < float(numbers[1]):
            raise ValueError(f"{where}.{name}: expected [low, high], two finite numbers with low < high")
        out[name] = (float(numbers[0]), float(numbers[1]))
    return out


def bounds_text(bounds: dict[str, tuple[float, float]]) -> str:
    """The canonical text of a bounds table (a proposal's dp_bounds): JSON, columns sorted, every
    number as Python writes a float (it reads back exactly)."""
    import json

    return json.dumps({k: [float(v[0]), float(v[1])] for k, v in sorted(bounds.items())}, separators=(",", ":"),
                      ensure_ascii=True)


def parse_bounds_text(text: str) -> dict[str, tuple[float, float]]:
    """A proposal's dp_bounds back to a table; ValueError in one line if it is not one."""
    import json

    if len(text) > BOUNDS_TEXT_MAX:
        raise ValueError(f"dp_bounds: more than BOUNDS_TEXT_MAX {BOUNDS_TEXT_MAX} characters")
    try:
        table = json.loads(text)
    except (ValueError, RecursionError):     # RecursionError: "[[[[..." nested past the parser's depth
        raise ValueError('dp_bounds: expected JSON such as {"age":[0,120]}') from None
    return parse_bounds(table, "dp_bounds")


def bounds_difference(job: dict[str, tuple[float, float]], mine: dict[str, tuple[float, float]],
                      features: Sequence[str]) -> str | None:
    """The first of `features` whose bounds in a job's dp_bounds are missing or differ from this
    site's [data] bounds, in words with the fix (no value: the line may cross to other sites)."""
    for f in features:
        if f not in mine:
            return (f"column {f!r} has no [data] bounds here; add {f} = [low, high] to [data] bounds in its "
                    "peers.toml, the same as the job's dp_bounds")
        if f not in job:
            return f"the job's dp_bounds have no bounds for column {f!r}; every site's [data] bounds must name it"
        if job[f] != mine[f]:
            return (f"its [data] bounds for column {f!r} differ from the job's dp_bounds; public bounds must be "
                    "the same at every site")
    return None
