"""What people read of an xgboost job: `job show` lines and the harness table. Classification
leads with AUC, log-loss and accuracy, regression (reg:squarederror) with RMSE and MAE; every
figure says how many rows it rests on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedpeer.jobs.report import (
    CLASSIFICATION_METRICS,
    METRIC_NAMES,
    REGRESSION_METRICS,
    evaluated,
    evaluated_rows,
    evaluation_lines,
    lead_block,
    score,
    series,
    table,
)


TRAIN_KEYS = ("train_logloss", "train_rmse", "train_rows")    # the training loss, where the job summed it


def metric_keys(result: Mapping[str, Any]) -> tuple[str, ...]:
    """The metrics of this result's objective: RMSE and MAE (regression), else AUC, log-loss, accuracy."""
    return REGRESSION_METRICS if str(result.get("objective", "")).startswith("reg:") else CLASSIFICATION_METRICS


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines for an xgboost result: the model, its scores with their rows, and
    the evaluated rounds (both modes) with the training loss beside them where the job summed it."""
    keys = metric_keys(result)
    lines = [f"  model: {result.get('objective', '-')}, {result['rounds']} rounds, {result['trees']} trees, "
             f"SHA-256 {result['model_sha256']}"]
    p = result.get("privacy")
    if isinstance(p, dict):      # a DP job (fedpeer/kinds/xgboost/hist_dp.py): no federated evaluation
        lines.append(f"  differential privacy: ε {p['epsilon']:.3g} (asked {p['epsilon_asked']:g}), "
                     f"δ {p['delta']:.2g}, {p['releases']} noised histograms of {p['bins']} bins; "
                     f"split rule: {p['split_rule']}")
        local = result.get("local_test")
        if isinstance(local, dict) and local.get("auc") is not None:
            lines.append(f"  this site's own test part (not released): AUC {local['auc']:.4f} on {local['rows']} rows")
    lines += evaluation_lines(result, keys)
    lines.append(f"  model file {result.get('model_file', '-')} (`fedpeer export` writes it for xgboost to load)")
    train = "train_rmse" if "rmse" in keys else "train_logloss"
    train_head = f"TRAIN {METRIC_NAMES[train[6:]].upper()}"      # on the training rows, where the job summed it
    if result.get("mode") == "histogram":
        lost = ", ".join(result["lost"]) or "none"
        lines.append(f"  histogram mode: {result['secure_sums']} secure sums over {', '.join(result['members'])}; "
                     f"members lost: {lost}")
        rows = [("ROUND", "TREES", *(f"FED. {METRIC_NAMES[k].upper()}" for k in keys), train_head)]
        rows += [(h["round"], h.get("trees", "-"), *(score(h.get(k)) for k in keys), score(h.get(train)))
                 for h in result.get("history") or []]
        return lines + _rounds(rows, 2, result["rounds"])
    rows = [("ROUND", "TERM", "LEADER", "SITES", "TREES", *(f"FED. {METRIC_NAMES[k].upper()}" for k in keys),
             train_head)]
    for h in result["history"]:
        rows.append((h["round"], h["term"], h["leader"], len(h["participants"]), h["trees_added"],
                     *(score(h.get(k)) for k in keys), score(h.get(train))))
    lines += _rounds(rows, 5, len(rows) - 1)
    for h in result["history"]:
        for site, why in (h.get("excluded") or {}).items():
            lines.append(f"  round {h['round']}: {site} left out: {why}")
    return lines


def _rounds(rows: list[tuple], first_score: int, rounds: int) -> list[str]:
    """The evaluated rounds' table (the training loss column only where the job summed it), and
    how many rounds it leaves out."""
    shown = evaluated(rows, first_score)
    if len(shown) < 2:
        return []
    lines = [table(shown, indent="  ")]
    left = rounds - len(shown) + 1
    if left > 0:
        lines.append(f"  ({left} round{'s' if left != 1 else ''} without a federated evaluation not shown)")
    return lines


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """One row per site: its rows, state, the model's size, its scores and the rows they rest on."""
    keys = next((metric_keys(s["result"]) for s in sites if s.get("result")), CLASSIFICATION_METRICS)
    rows = [("SITE", "ROWS", "STATE", "ROUNDS", "TREES", *(METRIC_NAMES[k].upper() for k in keys), "ON ROWS",
             "OF", "MODEL SHA-256")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), *["-"] * (len(keys) + 5)))
            continue
        block = lead_block(r)
        n, on = evaluated_rows(block) if "test_csv" not in r else (block.get("rows"), "[data] test_csv")
        rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), r["rounds"], r["trees"],
                     *(score(block.get(k)) for k in keys), "-" if n is None else n, on or "-",
                     r["model_sha256"][:16]))
    return table(rows)


def history(result: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """The curves of an xgboost result: the federated evaluation of each committed round, every
    point at the rounds' bins (the last round, scored finer for the result, also holds its
    `curve` at those bins), and the training loss beside them where the job summed it."""
    entries = [{**h, **h["curve"]} if isinstance(h.get("curve"), Mapping) else h for h in result.get("history") or []]
    return series(entries, "round", (*metric_keys(result), *TRAIN_KEYS))
