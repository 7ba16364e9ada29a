"""Text every kind's `describe` and harness table share: aligned columns, scores that may be
missing, a metric with the rows it rests on. (What the lines say is each kind's own: fedpeer/kinds/.)"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

# How a metric's key is written for people, in the order lines list them
METRIC_NAMES = {"auc": "AUC", "logloss": "log-loss", "accuracy": "accuracy", "rmse": "RMSE", "mae": "MAE",
                "sensitivity": "sensitivity", "specificity": "specificity", "mcc": "MCC"}
REGRESSION_METRICS = ("rmse", "mae")
CLASSIFICATION_METRICS = ("auc", "logloss", "accuracy")


def table(rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Rows as left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


DEFAULT_CLASS_NAMES = ("negative", "positive")


def class_names(result: Mapping[str, Any]) -> tuple[str, str]:
    """(other class, positive class) of a binary result as people call them: the site's [data]
    positive class and the label's other value, when the text view was given them
    (fedpeer/app/jobtext.py puts them in as "class_names"), else negative and positive."""
    names = result.get("class_names")
    return (str(names[0]), str(names[1])) if isinstance(names, (list, tuple)) and len(names) == 2 \
        else DEFAULT_CLASS_NAMES


def evaluated(rows: Sequence[Sequence[Any]], first_score: int) -> list[Sequence[Any]]:
    """A table (header first) shown with its evaluated rows only: the rows with a score in columns
    `first_score`.. (other rows are dropped when some row has one), and no score column that is "-"
    in every row."""
    head, body = rows[0], list(rows[1:])
    scored = [r for r in body if any(str(v) != "-" for v in r[first_score:])]
    body = scored or body
    keep = [i for i in range(len(head)) if i < first_score or any(str(r[i]) != "-" for r in body)]
    return [tuple(r[i] for i in keep) for r in [head, *body]]


def size(n: float) -> str:
    """A byte count for people: "512 bytes", "12.3 KiB", "4.5 MiB", "1.2 GiB"."""
    if n < 1024:
        return f"{int(n)} bytes"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    return f"{n:.1f} GiB"


def score(value: float | None, digits: int = 4) -> str:
    """A metric, or "-" when there is none (or what is there is no number: a history entry another
    member sent is checked for its round only)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):     # numpy's scalars are Real too
        return "-"
    return f"{value:.{digits}f}"


def raw(result: Mapping[str, Any]) -> list[str]:
    """The `describe` of a kind that has no words of its own: its result as `key: value` lines
    (nested blocks indented, lists joined, floats to 6 significant digits); `--json` has it whole."""
    def value(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.6g}"
        if isinstance(v, (list, tuple)):
            shown = ", ".join(value(x) for x in v[:8]) + (f", ... ({len(v)} in all)" if len(v) > 8 else "")
            return shown or "none"
        return "none" if v is None else str(v)

    def lines(block: Mapping[str, Any], indent: str) -> list[str]:
        out: list[str] = []
        for key, v in block.items():
            if isinstance(v, Mapping):
                out += [f"{indent}{key}:" + ("" if v else " none")] + lines(v, indent + "  ")
            else:
                out.append(f"{indent}{key}: {value(v)}")
        return out
    return lines(result, "  ")


def metrics(block: Mapping[str, Any] | None, keys: Sequence[str], digits: int = 4) -> str:
    """The metrics of `keys` a block holds, in words: "AUC 0.9987, log-loss 0.0799" ("-" with none)."""
    shown = [f"{METRIC_NAMES.get(k, k)} {score(block[k], digits)}" for k in keys
             if block is not None and k in block]
    return ", ".join(shown) or "-"


def evaluated_rows(block: Mapping[str, Any]) -> tuple[int | None, str]:
    """(rows, on what) of an evaluation block: {"rows": N, "on": "the sites' test parts"}, or
    xgboost's {"test_rows": N, "rows": "the sites' test parts"}, or [data] test_csv's {"rows": N}."""
    if isinstance(block.get("rows"), str):
        return block.get("test_rows"), block["rows"]
    return block.get("rows"), str(block.get("on") or "")


def evaluation_lines(result: Mapping[str, Any], keys: Sequence[str], indent: str = "  ") -> list[str]:
    """A result's scores, each with the rows it rests on: the federated evaluation (summed over
    the sites, `federated_eval`) and this site's [data] test_csv (`test_csv`), where there are."""
    lines = []
    federated = result.get("federated_eval")
    if isinstance(federated, Mapping):
        n, on = evaluated_rows(federated)
        trained = "training" in on
        lines.append(f"{indent}{metrics(federated, keys)} — federated, on {rows_text(n)}: {on or 'the sites'}"
                     + ("; the rows it was trained on, an optimistic figure" if trained else ""))
    test_csv = result.get("test_csv")
    if isinstance(test_csv, Mapping):
        lines.append(f"{indent}{metrics(test_csv, keys)} — on {rows_text(test_csv.get('rows'))} of this site's "
                     "[data] test_csv")
    if not lines and any(result.get(k) is not None for k in keys):     # a result of before the blocks
        source = result.get("auc_source") or result.get("score_source") or "rows not recorded"
        lines.append(f"{indent}{metrics(result, keys)} ({source})")
    if not lines:
        lines.append(f"{indent}no rows scored the model")
    return lines


def rows_text(n: Any) -> str:
    """"114 rows", "1 row", "? rows"."""
    return f"{n} row{'' if n == 1 else 's'}" if isinstance(n, int) else "? rows"


def plain_sites(sites: Sequence[Mapping[str, Any]]) -> str:
    """The harness table of a kind that has no table of its own: each site's state and rows."""
    rows = [("SITE", "STATE", "ROWS")]
    rows += [(s["name"], s.get("state", "-"), "-" if s.get("rows") is None else s["rows"]) for s in sites]
    return table(rows)


def lead_block(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """The evaluation a result leads with: [data] test_csv's when the site has one, else the federated one."""
    for key in ("test_csv", "federated_eval"):
        if isinstance(result.get(key), Mapping):
            return result[key]
    return {}


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
