"""What `fedpeer harness` prints: the job's report, one table per job kind, and the bytes each site
sent to and received from its peers during the job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedpeer.jobs.report import size, table

if TYPE_CHECKING:
    from fedpeer.app.harness.federation import Site


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
    elif job.get("failover"):
        f = job["failover"]
        lines.append(f"failover: killed the leader {f.get('killed')} (kill -9) in round {f.get('at_round')}; "
                     f"{f.get('new_leader')} elected after {f.get('elected_after_s')} s; next round "
                     f"committed {f.get('next_commit_after_s')} s after the kill" if "error" not in f
                     else f"failover: {f['error']}")
    if job["kind"] != "membership":
        from fedpeer.kinds.catalog import job_kinds

        lines.append(job_kinds()[job["kind"]].site_table(report["sites"]))
        if any(s.get("bytes_sent") is not None for s in report["sites"]):
            lines.append(traffic_table(report["sites"]))
    if not temp:
        lines.append(f"sites, keys and daemon logs: {workdir}")
    return "\n".join(lines)


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
    return table(rows)


def traffic_table(sites: list[dict]) -> str:
    """Each site's bytes of frames to and from its peers while the job ran (membership included),
    and a line with the largest and the mean sent."""
    sent = [s["bytes_sent"] for s in sites if s.get("bytes_sent") is not None]
    rows = [("SITE", "SENT", "RECEIVED")]
    rows += [(s["name"], _size(s.get("bytes_sent")), _size(s.get("bytes_received"))) for s in sites]
    head = (f"bytes to and from peers during the job (frames, membership included): sent per site max "
            f"{_size(max(sent))}, mean {_size(sum(sent) / len(sent))}")
    return head + "\n" + table(rows)


def _size(n: float | None) -> str:
    return "-" if n is None else size(n)
