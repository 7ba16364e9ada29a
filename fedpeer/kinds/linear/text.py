"""What people read of a logreg or mlp job: `job show` lines and the harness table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.jobs.report import CLASSIFICATION_METRICS, evaluated_rows, evaluation_lines, lead_block, series, table
from fedpeer.kinds.scoring import binary_rows, class_rows


def describe(kind: str, result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines for a logreg or mlp result: the fit, its log and (logreg) the coefficients."""
    lines: list[str] = []
    over = (f"{result['secure_sums']} secure sums over {', '.join(result['members'])}; "
            f"members lost: {', '.join(result.get('lost') or []) or 'none'}")
    if kind == "mlp":
        lines.append(f"  model: MLP {'-'.join(map(str, result['layer_sizes']))} by FedAvg, {result['rounds']} "
                     f"rounds ({over})")
    elif "privacy" in result:
        p = result["privacy"]
        lines.append(f"  model: logistic regression with differential privacy, {result['iterations']} gradient steps "
                     f"of {p['step']:g}, C {result['C']:g} ({over}); about {result['rows']} rows (noised)")
        lines.append(f"  differential privacy: ε {p['epsilon']:.3g}, δ {p['delta']:.2g}; row gradients clipped to "
                     f"L2 {p['grad_clip']:g}; {p['split']}; not released: {p['not_released']}")
    else:
        lines.append(f"  model: {result['mode']} logistic regression, solver {result['solver']}, C "
                     f"{result['C']:g}: {result['status']} after {result['iterations']} iterations ({over})")
    lines += evaluation_lines(result, CLASSIFICATION_METRICS)
    lines.append(f"  model file {result.get('model_file', '-')}")
    if result.get("classes_absent_here"):
        lines.append(f"  this site's rows lack class(es) {', '.join(result['classes_absent_here'])} "
                     "(the federation's sums still hold them)")
    if result["mode"] == "fedavg":
        f = result["fedavg"]
        if f["groups"]:
            lines.append(f"  groups: {' | '.join(', '.join(g) for g in f['groups'])}; {f['global_averages']} "
                         f"federation-wide averages, {f['global_averages_saved']} saved")
        rows = [("ROUND", "SCOPE", "LOGLOSS", "ACCURACY", "AUC")]
        rows += [(h["round"], h["scope"], f"{h['logloss']:.6f}", f"{h['accuracy']:.4f}",
                  "-" if h.get("auc") is None else f"{h['auc']:.4f}") for h in result["history"]]
    else:
        rows = [("ITERATION", "LOGLOSS", "MAX |GRAD|", "STEP", "TEST AUC")]
        for h in result["history"]:     # with DP no log-loss is released: its column shows "-"
            test = "-" if h.get("test_auc") is None else f"{h['test_auc']:.4f}"
            loss = "-" if h.get("loss") is None else f"{h['loss']:.6f}"
            rows.append((h["iteration"], loss, f"{h['grad_max']:.2e}", f"{h['step']:g}", test))
        rows = [r[:4] for r in rows] if all(r[4] == "-" for r in rows[1:]) else rows   # no test rows: no column
    lines.append(table(rows, indent="  "))
    if kind == "mlp":
        return lines
    names = result["classes"] if len(result["classes"]) > 2 else ["coef"]
    rows = [("FEATURE", *names)] + [(f, *(f"{c[j]:.6g}" for c in result["coef"]))
                                    for j, f in enumerate(result["features"])]
    rows.append(("(intercept)", *(f"{b:.6g}" for b in result["intercept"])))
    lines.append(table(rows, indent="  "))
    return lines


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """logreg / mlp: one row per site: the fit's end, its federated training log-loss and AUC, and
    the classes the site's own rows lack (the coefficients and weights are in --json)."""
    rows = [("SITE", "ROWS HERE", "STATUS", "ITERATIONS", "SECURE SUMS", "LOGLOSS", "AUC", "AUC ON ROWS", "OF",
             "LACKS CLASSES")]
    for s in sites:
        r = s["result"] or {}
        if not r:
            rows.append((s["name"], s["rows"] or "-", s["state"], "-", "-", "-", "-", "-", "-", "-"))
            continue
        last = r["history"][-1] if r.get("history") else {}
        loss = last.get("loss", last.get("logloss"))
        loss = "-" if loss is None else f"{loss:.6f}"
        auc = "-" if r.get("auc") is None else f"{r['auc']:.4f}"
        block = lead_block(r)
        n, on = evaluated_rows(block) if block else (None, "")
        rows.append((s["name"], s["rows"], r.get("status", "rounds done"), r.get("iterations", r.get("rounds")),
                     r["secure_sums"], loss, auc, "-" if n is None else n,
                     "[data] test_csv" if "test_csv" in r else on or r.get("auc_source") or "-",
                     ", ".join(r["classes_absent_here"]) or "-"))
    return table(rows)


def history(result: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """The curves of a logreg or mlp result: per FedAvg round, or per solver iteration (exact)."""
    if result.get("mode") == "fedavg":
        return series(result.get("history") or [], "round", ("logloss", "accuracy", "auc"))
    return series(result.get("history") or [], "iteration", ("loss", "grad_max", "test_auc"))


def predict_file(load_model: Callable[[Path], Mapping[str, Any]], predict: Callable[..., np.ndarray], path: Path,
                 result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict` with a stored logreg or mlp model: P(positive) and the prediction, or
    every class's P."""
    model = load_model(path)
    proba = predict(model, rows(model["features"]))
    return binary_rows(proba, model["classes"]) if proba.ndim == 1 else class_rows(proba, model["classes"])
