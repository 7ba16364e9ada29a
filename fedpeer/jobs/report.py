"""Text every kind's `describe` and harness table share: aligned columns, scores that may be
missing. (What the lines say is each kind's own: fedpeer/kinds/.)"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def table(rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Rows as left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def score(value: float | None, digits: int = 4) -> str:
    """A metric, or "-" when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def raw(result: Mapping[str, Any]) -> list[str]:
    """The `describe` of a kind that has no words of its own: its result as indented JSON."""
    return ["  result: " + json.dumps(result, indent=2).replace("\n", "\n  ")]


def plain_sites(sites: Sequence[Mapping[str, Any]]) -> str:
    """The harness table of a kind that has no table of its own: each site's state and rows."""
    rows = [("SITE", "STATE", "ROWS")]
    rows += [(s["name"], s.get("state", "-"), "-" if s.get("rows") is None else s["rows"]) for s in sites]
    return table(rows)


def series(history: Sequence[Mapping[str, Any]], step: str | None,
           keys: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """A result's per-round log as curves: for each of `keys` that some entry holds, the points
    (entry[step], entry[key]) (step None: the entry's position from 1)."""
    curves = {}
    for key in keys:
        points = [(h[step] if step is not None else i + 1, h[key]) for i, h in enumerate(history)
                  if h.get(key) is not None]
        if points:
            curves[key] = points
    return curves
