"""What the console's page shows, shaped from the daemon's answers (fedpeer/app/console/server.py
serves it): the job kinds and their parameters for the form, a proposal checked as `fedpeer run`
checks its command line, a job's curves, its model card and its per-site results.

Presentation only: every number comes from a daemon's job records and every kind's parameters,
curves and tables from the kind's own declaration (fedpeer/kinds/catalog.py, the `JobKind`
contract in fedpeer/jobs/kind.py); nothing here knows a kind by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedpeer.errors import JobError

STEP_KEYS = ("round", "iteration", "step")   # what a per-round history entry names its step by
CURVE_POINTS_MAX = 5_000     # per series sent to the page (the last ones: a curve's end matters)
METRICS_MAX = 64             # metrics on the model card
MEMBERS_TEXT_CHARS_MAX = 4_096
MODEL_DIGEST_KEYS = ("model_sha256", "model_file_sha256")   # where a result names its stored model's digest
# What a chart says of its series: the y axis' title, whether its values lie in [0, 1], and the
# rows it is measured on: "test" (the evaluated rows; the chart says how many), "train" (the
# training rows, counted by `train_rows` where the result has it) or None
SERIES_TITLES = {
    "auc": ("AUC", True, "test"), "test_auc": ("AUC", True, "test"),
    "accuracy": ("accuracy (share of rows right)", True, "test"),
    "logloss": ("log-loss (nats per row)", False, "test"), "rmse": ("RMSE (label units)", False, "test"),
    "mae": ("MAE (label units)", False, "test"), "f1": ("F1", True, "test"), "precision": ("precision", True, "test"),
    "recall": ("recall", True, "test"), "mcc": ("MCC", False, "test"),
    "inertia": ("inertia (sum of squared distances)", False, None),
    "log_likelihood": ("log-likelihood (nats, all rows)", False, None),
    "objective": ("objective (sum of squares)", False, None),
    "loss": ("training loss (per training row)", False, None),
    "train_loss": ("training loss (per training row)", False, None),
    "train_logloss": ("training log-loss (nats per row)", False, "train"),
    "train_rmse": ("training RMSE (label units)", False, "train"),
    "grad_max": ("largest |gradient| (training rows)", False, None),
}
ROW_SERIES = ("test_rows", "rows", "eval_rows")     # counts a point rests on: said on the axis, never drawn
TRAIN_ROW_SERIES = ("train_rows",)                   # the training rows a training loss rests on: likewise
NOT_METRICS = ("base_score",)                        # a model's constant, not a measure of it


def kinds_doc() -> list[dict]:
    """Every kind the catalogue lists, with its parameters as the form needs them."""
    from fedpeer.kinds.catalog import job_kinds

    return [{"name": kind.name, "help": kind.help, "needs_data": kind.needs_data, "needs_label": kind.needs_label,
             "curves": kind.history is not None,
             "params": [{"name": name, "type": p.type.__name__, "default": p.default, "help": p.help,
                         "choices": list(p.choices) if p.choices is not None else None, "low": p.low, "high": p.high}
                        for name, p in kind.params.items()]}
            for kind in job_kinds().values()]


def proposal(doc: Any) -> tuple[str, dict[str, Any], list[str] | None]:
    """The form's {kind, params, members} as `fedpeer run` would send it: the kind known, each
    parameter of its declared type (the form's text converted) and in range; JobError (one line)
    naming what is wrong, before any daemon is asked."""
    from fedpeer.kinds.catalog import job_kinds

    if not isinstance(doc, dict):
        raise JobError("expected a JSON object {kind, params, members}")
    kinds = job_kinds()
    name = doc.get("kind")
    kind = kinds.get(name) if isinstance(name, str) else None
    if kind is None:
        raise JobError(f"unknown job kind {name!r}; known kinds: {', '.join(kinds)}")
    given = doc.get("params") or {}
    if not isinstance(given, dict):
        raise JobError("params: expected an object {name: value}")
    params: dict[str, Any] = {}
    for key, value in given.items():
        if key not in kind.params:
            raise JobError(f"{kind.name}: unknown parameter {key!r}; known: {', '.join(sorted(kind.params))}")
        params[key] = _typed(key, kind.params[key].type, value)
    kind.check_params(params)
    return kind.name, params, _members(doc.get("members"))


def _typed(name: str, typ: type, value: Any) -> Any:
    """A form value (text, or already a JSON value) as the parameter's type."""
    if not isinstance(value, str) or typ is str:
        return value            # check_params judges it
    text = value.strip()
    try:
        if typ is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes", "on")
        return typ(text)
    except ValueError:
        raise JobError(f"parameter {name}: expected {typ.__name__}, got {value!r}") from None


def _members(value: Any) -> list[str] | None:
    """`--members`: comma-separated names (or a list); none: this site and every alive peer."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str) and len(value) <= MEMBERS_TEXT_CHARS_MAX:
        names = [m.strip() for m in value.split(",") if m.strip()]
        return names or None
    if isinstance(value, list) and all(isinstance(m, str) for m in value):
        return [m.strip() for m in value if m.strip()] or None
    raise JobError("members: expected comma-separated site names")


# -- one job ----------------------------------------------------------------------------------


def job_list(doc: Mapping[str, Any]) -> dict:
    """The daemon's job list with each job's ε spent at this site, as text (`epsilon_spent`:
    fedpeer/app/jobtext.py `epsilon_text`, the words `fedpeer jobs` prints)."""
    from fedpeer.app.jobtext import epsilon_text

    return {**doc, "jobs": [{**j, "epsilon_spent": epsilon_text(j.get("privacy_spent"))}
                            for j in doc.get("jobs") or ()]}


def privacy(record: Mapping[str, Any], readings: Sequence[tuple[str | None, str, dict | None, str | None]]
            ) -> dict | None:
    """A DP job's privacy on its page: what each site the console reads has charged its ledger
    (privacy_spent), and what the job's own accountant counted; None for a job without DP."""
    result = record.get("result") or {}
    counted = result.get("privacy") if isinstance(result.get("privacy"), Mapping) else None
    charged = [{"name": name, "epsilon": doc["privacy_spent"]["epsilon"], "delta": doc["privacy_spent"]["delta"]}
               for _, name, doc, _ in readings if doc is not None and doc.get("privacy_spent")]
    if not charged and counted is None:
        return None
    return {"here": record.get("privacy_spent"), "sites": charged,
            "counted": None if counted is None else {"epsilon": counted.get("epsilon"), "delta": counted.get("delta"),
                                                     "split": counted.get("split")}}


def job_view(record: dict, readings: Sequence[tuple[str | None, str, dict | None, str | None]]) -> dict:
    """The daemon's record of a job with what the page draws of it: `curves`, `card`, `sites`
    and the kind's own `site_table`. readings: (fingerprint, site name, that site's record or
    None, why there is none) for each site the console reads, this site first."""
    from fedpeer.kinds.catalog import job_kinds

    kind = job_kinds().get(record["kind"])
    drawn = curves(kind, record)
    return {**record, "curves": drawn, "charts": charts(drawn, record), "card": card(kind, record),
            "sites": sites(record, readings), "site_table": site_table(kind, readings),
            "privacy": privacy(record, readings)}


def curves(kind: Any, record: Mapping[str, Any]) -> dict[str, list[list[float]]]:
    """series name -> [[step, value], ...]: the kind's own curves of a finished result, else the
    per-round entries the record holds (`history`, while the job runs), every numeric field a series."""
    result = record.get("result") or {}
    if result and kind is not None and kind.history is not None:
        try:
            drawn = kind.history(result)
        except (KeyError, TypeError, ValueError, AttributeError):
            drawn = {}   # a result this build's kind does not read (an older record): the generic view
        if drawn:
            return {name: [[float(x), float(y)] for x, y in points[-CURVE_POINTS_MAX:] if _number(x) and _number(y)]
                    for name, points in drawn.items()}
    entries = record.get("history")
    if not isinstance(entries, list) or not entries:
        entries = result.get("history") if isinstance(result.get("history"), list) else []
    return series(entries)


def series(entries: Sequence[Any]) -> dict[str, list[list[float]]]:
    """Per-round dicts of metric -> number as curves: x the entry's round (iteration, step), else
    its position from 1; every other numeric field a series."""
    rows = [e for e in entries if isinstance(e, Mapping)]
    step = next((k for k in STEP_KEYS if rows and all(_number(e.get(k)) for e in rows)), None)
    out: dict[str, list[list[float]]] = {}
    for i, entry in enumerate(rows):
        x = float(entry[step]) if step is not None else float(i + 1)
        for key, value in entry.items():
            if key != step and _number(value):
                out.setdefault(str(key), []).append([x, float(value)])
    return {k: v[-CURVE_POINTS_MAX:] for k, v in out.items()}


def charts(drawn: Mapping[str, list[list[float]]], record: Mapping[str, Any]) -> list[dict]:
    """What the page draws of `curves`: one chart per series that varies, each with its axes'
    titles (units, and the rows each point rests on) and its y range ([0, 1] for a bounded metric).
    Row counts and constant whole numbers (`test_rows`, `trees_added`) are not curves."""
    result = record.get("result") or {}
    params = record.get("params") or {}
    rows_points = next((drawn[k] for k in ROW_SERIES if drawn.get(k)), None)
    rows = int(rows_points[-1][1]) if rows_points else _rows(result, "test_rows") or _rows(
        result.get("federated_eval") or {}, "test_rows")
    held_out = isinstance(params.get("test_fraction"), (int, float)) and params["test_fraction"] > 0
    train_points = next((drawn[k] for k in TRAIN_ROW_SERIES if drawn.get(k)), None)
    train_rows = int(train_points[-1][1]) if train_points else None
    bins = _bins_used(result.get("history") if isinstance(result.get("history"), list) else [])
    out = []
    for name, points in drawn.items():
        values = [y for _, y in points]
        constant = len(set(values)) == 1 and all(float(v).is_integer() for v in values) and len(values) > 1
        if name in ROW_SERIES + TRAIN_ROW_SERIES or (constant and name not in SERIES_TITLES):
            continue
        title, bounded, on_rows = SERIES_TITLES.get(name, (name.replace("_", " "), False, None))
        if rows is not None and on_rows == "test":
            title += f" · {rows} {'held-out ' if held_out else ''}rows per point"
        elif train_rows is not None and on_rows == "train":
            title += f" · {train_rows} training rows per point"
        if len(bins) > 1 and name in ("auc", "test_auc"):     # points on different score bins: said, not hidden
            title += f" · score bins differ: {', '.join(f'{b} from round {r}' for b, r in bins)}"
        bounded = bounded and all(0.0 <= v <= 1.0 for v in values)
        out.append({"name": name, "points": points, "x_title": "round", "y_title": title,
                    "y_range": [0.0, 1.0] if bounded else None})
    return out


def _bins_used(entries: Sequence[Any]) -> list[tuple[int, Any]]:
    """(score bins, first round) each time the bins of the evaluated history entries change (an
    entry's `curve`, when it has one, is what the chart draws)."""
    changes: list[tuple[int, Any]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        drawn = entry.get("curve") if isinstance(entry.get("curve"), Mapping) else entry
        b = drawn.get("eval_bins")
        if isinstance(b, int) and (not changes or changes[-1][0] != b):
            changes.append((b, entry.get("round")))
    return changes


def card(kind: Any, record: Mapping[str, Any]) -> dict:
    """The model's card: kind, the parameters that differ from the kind's defaults, the members,
    the data's schema fingerprint at this site, and every metric of the result with its rows."""
    params = record.get("params") or {}
    defaults = {name: p.default for name, p in kind.params.items()} if kind is not None else {}
    result = record.get("result") or {}
    return {
        "kind": record["kind"], "help": kind.help if kind is not None else None,
        "mode": result.get("mode") if isinstance(result.get("mode"), str) else params.get("mode"),
        "params_changed": {k: v for k, v in sorted(params.items()) if k not in defaults or defaults[k] != v},
        "members": [f"{m['name']} ({m['fingerprint']})" for m in record.get("members") or ()],
        "data_fingerprint": record.get("data_fingerprint"),
        "model_sha256": next((result[k] for k in MODEL_DIGEST_KEYS if isinstance(result.get(k), str)), None),
        "metrics": metrics(result, params),
    }


def metrics(result: Mapping[str, Any], params: Mapping[str, Any]) -> list[dict]:
    """Every metric of a result: its real-valued fields (counts are integers, parameters echoed
    are not metrics), top level and one level down (`federated_eval.auc`), each with the rows it
    was measured on where the result says (`test_rows`, or a nested part's `rows`) and its source."""
    found: list[dict] = []
    for key, value in result.items():
        if key.startswith("_") or key in params or key in NOT_METRICS:
            continue
        if _metric(value):
            source = result.get(f"{key}_source")      # "auc_source": where the result says it was measured
            found.append({"name": key, "value": value, "rows": _rows(result, "test_rows"),
                          "source": source if isinstance(source, str) else None})
        elif isinstance(value, Mapping):
            rows = _rows(value, "test_rows", "rows")
            source = next((value[k] for k in ("on", "rows") if isinstance(value.get(k), str)), key)   # where measured
            found += [{"name": f"{key}.{k}", "value": v, "rows": rows, "source": source}
                      for k, v in value.items() if _metric(v) and k not in NOT_METRICS]
    seen: set[tuple[str, float]] = set()       # each metric once: `auc` and `federated_eval.auc` are one
    once = []
    for m in found:
        if (m["name"].rsplit(".", 1)[-1], m["value"]) not in seen:
            seen.add((m["name"].rsplit(".", 1)[-1], m["value"]))
            once.append(m)
    return once[:METRICS_MAX]


def _rows(doc: Mapping[str, Any], *keys: str) -> int | None:
    return next((doc[k] for k in keys if isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool)), None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _metric(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


# -- every site -------------------------------------------------------------------------------


def sites(record: Mapping[str, Any], readings: Sequence[tuple[str | None, str, dict | None, str | None]]) -> list[dict]:
    """One row per member: what the console reads of that site's own record of the job (each
    site keeps its own result), or why it has none."""
    by_fingerprint = {fp: (name, doc, why) for fp, name, doc, why in readings if fp is not None}
    rows = []
    for m in record.get("members") or ():
        name, doc, why = by_fingerprint.get(m["fingerprint"], (m["name"], None, "its result stays at that site"))
        result = (doc or {}).get("result") or {}
        rows.append({"name": m["name"], "fingerprint": m["fingerprint"], "read": doc is not None,
                     "state": (doc or {}).get("state"), "rows": (doc or {}).get("rows"),
                     "elapsed_s": (doc or {}).get("elapsed_s"), "error": (doc or {}).get("error"),
                     "note": why, "metrics": metrics(result, (doc or {}).get("params") or {})})
    return rows


def site_table(kind: Any, readings: Sequence[tuple[str | None, str, dict | None, str | None]]) -> str | None:
    """The kind's own table of every site's result (what `fedpeer harness` prints), over the
    sites the console reads that hold a result."""
    done = [{"name": name, "rows": doc.get("rows"), "state": doc.get("state"), "result": doc.get("result")}
            for _, name, doc, _ in readings if doc is not None and doc.get("result")]
    if kind is None or not done:
        return None
    try:
        return kind.site_table(done)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None      # a result this build's kind does not read: the per-site rows still show


def finite(doc: Any) -> Any:
    """`doc` with every NaN or infinity as None: the browser's JSON has no such numbers."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc
