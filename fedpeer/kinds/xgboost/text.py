"""What people read of an xgboost job: `job show` lines and the harness table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedpeer.jobs.report import series, table


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines for an xgboost result: the model, its AUC, and the rounds (bagging)."""
    lines: list[str] = []
    auc = "-" if result.get("auc") is None else f"{result['auc']:.4f}"
    lines.append(f"  model: {result['rounds']} rounds, {result['trees']} trees, SHA-256 {result['model_sha256']}")
    lines.append(f"  AUC {auc} ({result.get('auc_source') or '-'}); model file {result.get('model_file', '-')}")
    if result.get("mode") == "histogram":
        lost = ", ".join(result["lost"]) or "none"
        lines.append(f"  histogram mode: {result['secure_sums']} secure sums over {', '.join(result['members'])}; "
                     f"members lost: {lost}")
        return lines
    rows = [("ROUND", "TERM", "LEADER", "SITES", "TREES", "FED. AUC", "LOGLOSS", "ACCURACY")]
    for h in result["history"]:
        scores = ("-" if h.get(k) is None else f"{h[k]:.4f}" for k in ("auc", "logloss", "accuracy"))
        rows.append((h["round"], h["term"], h["leader"], len(h["participants"]), h["trees_added"], *scores))
    lines.append(table(rows, indent="  "))
    for h in result["history"]:
        for site, why in (h.get("excluded") or {}).items():
            lines.append(f"  round {h['round']}: {site} left out: {why}")
    return lines


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    rows = [("SITE", "ROWS", "STATE", "ROUNDS", "AUC", "AUC OF", "FED. LOGLOSS", "FED. ACCURACY", "TREES",
             "MODEL SHA-256")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), *["-"] * 7))
            continue
        fed = r.get("federated_eval") or {}
        rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), r["rounds"],
                     "-" if r.get("auc") is None else f"{r['auc']:.4f}", r.get("auc_source") or "-",
                     f"{fed['logloss']:.4f}" if fed else "-", f"{fed['accuracy']:.4f}" if fed else "-", r["trees"],
                     r["model_sha256"][:16]))
    return table(rows)


def history(result: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """The curves of an xgboost result: the federated evaluation of each committed round."""
    return series(result.get("history") or [], "round", ("auc", "logloss", "accuracy"))
