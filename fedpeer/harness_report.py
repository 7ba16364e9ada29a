"""What `fedpeer harness` prints: the job's report, one table per job kind."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .harness import Site


def site_report(site: Site, doc: dict | None) -> dict:
    if doc is None:
        return {"name": site.name, "rows": None, "result": {"error": "no status"}}
    peers = {p["name"]: {"state": p["state"], "rtt_ms": p["rtt_ms"]} for p in doc["peers"]}
    return {"name": site.name, "rows": None, "result": {
        "address": doc["node"]["address"], "fingerprint": doc["node"]["fingerprint"],
        "alive_peers": sum(p["state"] == "alive" for p in doc["peers"]), "peers": peers,
        "rejected": doc["rejected"]}}


def format_report(report: dict, workdir: Path, temp: bool) -> str:
    job = report["job"]
    took = f"the job ran {job['elapsed_s']} s" if job["kind"] != "membership" else f"{job['elapsed_s']} s"
    lines = [f"job {job['kind']}{' ' + job['id'] if job.get('id') else ''}: {job['state']} ({took})"
             + (f" — error: {job['error']}" if job["error"] else "")]
    if job.get("startup_s") is not None:
        lines.append(f"all sites saw each other alive after {job['startup_s']} s")
    if job.get("chaos"):
        c = job["chaos"]
        lines.append(f"chaos: killed {c['killed']} (kill -9); others saw it dead after {c['seen_dead_after_s']} s; "
                     f"restarted, alive again after {c['alive_after_restart_s']} s")
    if job["kind"] == "membership":
        lines.append(_membership_table(report["sites"]))
    elif job["kind"] == "stats":
        lines.append(_stats_table(report["sites"]))
    elif job["kind"] == "bofrf":
        lines.append(bofrf_table(report["sites"]))
    elif job["kind"] == "xgboost":
        if job.get("failover"):
            f = job["failover"]
            lines.append(f"failover: killed the leader {f.get('killed')} (kill -9) in round {f.get('at_round')}; "
                         f"{f.get('new_leader')} elected after {f.get('elected_after_s')} s; next round "
                         f"committed {f.get('next_commit_after_s')} s after the kill" if "error" not in f
                         else f"failover: {f['error']}")
        lines.append(xgboost_table(report["sites"]))
    elif job["kind"] in ("kmeans", "gmm", "dbscan"):
        lines.append(cluster_table(report["sites"]))
    if job["kind"] in ("logreg", "mlp"):
        lines.append(logreg_table(report["sites"]))
    if not temp:
        lines.append(f"sites, keys and daemon logs: {workdir}")
    return "\n".join(lines)


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def logreg_table(sites: list[dict]) -> str:
    """logreg / mlp: one row per site: the fit's end, its federated training log-loss and AUC, and
    the classes the site's own rows lack (the coefficients and weights are in --json)."""
    rows = [("SITE", "ROWS HERE", "STATUS", "ITERATIONS", "SECURE SUMS", "LOGLOSS", "AUC", "AUC ON", "LACKS CLASSES")]
    for s in sites:
        r = s["result"] or {}
        if not r:
            rows.append((s["name"], s["rows"] or "-", s["state"], "-", "-", "-", "-", "-", "-"))
            continue
        last = r["history"][-1] if r.get("history") else {}
        loss = f"{last.get('loss', last.get('logloss')):.6f}" if last else "-"
        auc = "-" if r.get("auc") is None else f"{r['auc']:.4f}"
        rows.append((s["name"], s["rows"], r.get("status", "rounds done"), r.get("iterations", r.get("rounds")),
                     r["secure_sums"], loss, auc,
                     r.get("auc_source") or "-", ", ".join(r["classes_absent_here"]) or "-"))
    return _table(rows)


def _membership_table(sites: list[dict]) -> str:
    rows = [("SITE", "ADDRESS", "FINGERPRINT", "ALIVE PEERS", "MEDIAN RTT")]
    for s in sites:
        r = s["result"]
        if "error" in r:
            rows.append((s["name"], "-", "-", r["error"], "-"))
            continue
        rtts = sorted(p["rtt_ms"] for p in r["peers"].values() if p["rtt_ms"] is not None)
        median = f"{rtts[len(rtts) // 2]:.1f} ms" if rtts else "-"
        rows.append((s["name"], r["address"], r["fingerprint"], f"{r['alive_peers']}/{len(r['peers'])}", median))
    return _table(rows)


def bofrf_table(sites: list[dict]) -> str:
    """Per-site table in the shape of the thesis' tables 7.1–7.6."""
    def auc(block: dict | None) -> str:
        return "-" if not block or block.get("auc") is None else f"{block['auc']:.3f}"
    rows = [("SITE", "ROWS", "LOCAL RF AUC", "BOFRF AUC", "CHANGE", "BOPPID AUC", "MODEL", "TAU", "TREES KEPT")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), "-", "-", "-", "-", "-", "-"))
            continue
        base, final = r["local_rf"].get("auc"), r["final"].get("auc")
        change = f"{100 * (final - base) / base:+.1f} %" if base and final is not None else "-"
        rows.append((s["name"], s.get("rows") or "-", auc(r["local_rf"]), auc(r["final"]), change,
                     auc(r.get("boppid")), r["final"]["model"], f"{r['tau']:.2f}",
                     f"{r['trees_kept']}/{r['trees_total']}"))
    return _table(rows)


def xgboost_table(sites: list[dict]) -> str:
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
    return _table(rows)


def _stats_table(sites: list[dict]) -> str:
    rows = [("SITE", "STATE", "LOCAL ROWS", "FEDERATION ROWS", "POSITIVE SHARE", "FIRST COLUMN MEAN ± STD")]
    for s in sites:
        r = s.get("result") or {}
        first = next(iter(r.get("mean", {})), None)
        spread = f"{first}: {r['mean'][first]:.4g} ± {r['std'][first]:.4g}" if first else "-"
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("count", "-"), f"{r['positive_share']:.3f}" if r else "-", spread))
    return _table(rows)


def cluster_table(sites: list[dict]) -> str:
    """kmeans / gmm / dbscan: every site holds the same model; sizes are federation-wide ("< N": too few)."""
    rows = [("SITE", "STATE", "LOCAL ROWS", "FEDERATION ROWS", "ROUNDS", "INERTIA / LOG-LIKELIHOOD", "CLUSTER SIZES")]
    for s in sites:
        r = s.get("result") or {}
        fit = r.get("inertia", r.get("log_likelihood"))
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("rows", "-"), r.get("iterations", "-"), "-" if fit is None else f"{fit:.6g}",
                     " ".join(str(c) for c in r.get("cluster_sizes", [])) or "-"))
    return _table(rows)
