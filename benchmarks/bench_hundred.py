"""Up to a hundred real daemons on this machine: how membership, `status` and two jobs grow with n.

For each n of `--sites` (default 10 20 40 70 100), n daemons forked from one zygote
(fedpeer/app/harness/zygote.py: the daemon and its ML libraries imported once, shared copy-on-write)
start together on loopback, each with an equal share of make_classification's rows
(`--rows-per-site`, 20 features). Measured per n:
  - start: seconds from the first fork until every daemon sees every other alive;
  - churn while starting: `peer_state` log lines that took a heard member from alive to suspect,
    and lines that declared a member dead (placeholders included), over all daemons; the daemons'
    refusals of replayed hellos and frames (status `rejected.replay`) and handshakes that failed;
  - `status` latency: one admin request to every daemon in turn, median and worst;
  - memory per daemon (/proc/PID/smaps_rollup): Rss, Pss (shared pages split among sharers) and
    Private (Private_Clean + Private_Dirty: what this daemon alone holds);
  - a stats job and a 5-tree histogram xgboost job (depth 4, max_bin 32): the slowest member's
    elapsed_s, every member done with one result, and reliable bytes sent per site (mean, max).
Then the growth of each time from the smallest to the largest n as a least-squares exponent
(time ~ n^k), beside n log n's (k ~ 1.3 from 10 to 100), and issue 41's targets at the largest n:
converged, both jobs done, the stats job's bytes sent per site per sum against its vector, the
histogram job's time against n log n. `--idle-s S`: once converged, each daemon's CPU (percent of a
core, /proc/PID/stat) and the frames it accepts per second by kind over S seconds. The sites get
the co-located timings of fedpeer/app/harness/colocate.py (`timings_x` in the JSON).

Run: .venv/bin/python benchmarks/bench_hundred.py [--sites 10 20 40 70 100] [--json]
It takes the machine (n daemons on its cores): check `uptime` first. `--dialable` starts the sites
as [network] reachable = "yes" (the default "auto" opens reverse links to every peer until a
peer's dial-back answers). `--profile-site0 FILE` runs
the first site's daemon under cProfile (not forked) and writes its profile to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness import colocate, zygote  # noqa: E402
from fedpeer.app.harness.federation import Harness, HarnessError  # noqa: E402
from fedpeer.errors import FedpeerError  # noqa: E402

DATA = {"label": "label", "positive": "1", "ignore": [], "missing": "error"}
HIST = {"mode": "histogram", "rounds": 5, "max_depth": 4, "eta": 0.3, "max_bin": 32, "test_fraction": 0.0,
        "nthread": 1, "eval_every": 0}
START_TIMEOUT_S = 300
FEATURES = 20                     # make_classification's columns per site
JOB_TIMEOUT_S = 600
STATUS_TIMEOUT_MS = 30_000        # a loaded daemon's status of 99 peers may take seconds


def write_sites(tmp: Path, n: int, rows_per_site: int) -> list[Path]:
    from sklearn.datasets import make_classification
    X, y = make_classification(n_samples=n * rows_per_site, n_features=FEATURES, n_informative=10, random_state=7)
    header = ",".join([f"f{j}" for j in range(X.shape[1])] + ["label"])
    paths = []
    for k in range(n):
        rows = slice(k * rows_per_site, (k + 1) * rows_per_site)
        path = tmp / f"site{k}.csv"
        np.savetxt(path, np.column_stack([X[rows], y[rows]]), delimiter=",", header=header, comments="",
                   fmt=["%.9g"] * X.shape[1] + ["%d"])
        paths.append(path)
    return paths


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        fields[key] = int(rest.split()[0])
    return {"rss": fields["Rss"], "pss": fields["Pss"], "private": fields["Private_Clean"] + fields["Private_Dirty"]}


def churn(h: Harness) -> dict[str, int]:
    suspected = dead = 0
    for site in h.sites:
        for line in site.log_path.read_text(errors="replace").splitlines():
            if "event=peer_state" not in line:
                continue
            suspected += " state=suspect was=alive" in line
            dead += " state=dead " in line
    return {"alive_to_suspect": suspected, "to_dead": dead}


async def status_latency(h: Harness) -> dict[str, float]:
    times, missing = [], 0
    for i in range(h.n_sites):
        started = time.perf_counter()
        try:
            await h.status(i, timeout_ms=30_000)
        except FedpeerError:
            missing += 1
            continue
        times.append(time.perf_counter() - started)
    return {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3), "no_answer": missing}


def cpu_s(pid: int) -> float:
    """utime + stime of a process so far, in seconds (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def frames_by_kind(docs: dict[int, dict | None]) -> dict[str, int]:
    """Frames every daemon accepted, summed over its peers, by message kind."""
    total: dict[str, int] = {}
    for doc in docs.values():
        for peer in (doc or {}).get("peers", []):
            for kind, count in peer["frames_accepted"].items():
                total[kind] = total.get(kind, 0) + count
    return total


async def idle(h: Harness, seconds: float) -> dict:
    """Once converged and preloaded, nothing running: each daemon's CPU share (percent of one core)
    and the frames accepted per second per daemon, by kind, over `seconds` (two status sweeps only)."""
    pids = [s.process.pid for s in h.sites if s.process.poll() is None]
    before_docs, before_cpu = await h.statuses(timeout_ms=STATUS_TIMEOUT_MS), {pid: cpu_s(pid) for pid in pids}
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after_cpu, elapsed = {pid: cpu_s(pid) for pid in pids}, time.monotonic() - started
    after_docs = await h.statuses(timeout_ms=STATUS_TIMEOUT_MS)
    share = sorted(100 * (after_cpu[pid] - before_cpu[pid]) / elapsed for pid in pids)
    before, after = frames_by_kind(before_docs), frames_by_kind(after_docs)
    rates = {k: round((after[k] - before.get(k, 0)) / elapsed / len(pids), 2) for k in sorted(after)}
    lag = [d["loop_lag_ms"]["p99"] for d in after_docs.values() if d and d["loop_lag_ms"]["p99"] is not None]
    return {"cpu_pct_per_daemon_median": round(statistics.median(share), 2),
            "cpu_pct_per_daemon_max": round(share[-1], 2),
            "cpu_pct_all_daemons": round(sum(share), 1), "frames_per_s_per_daemon": rates,
            "loop_lag_p99_ms_median": statistics.median(lag) if lag else None}


async def run_job(h: Harness, kind: str, params: dict) -> dict:
    before = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses(timeout_ms=STATUS_TIMEOUT_MS)).items() if d}
    job_id = await h.propose(0, kind, params)
    records = await h.wait_job(job_id, JOB_TIMEOUT_S)
    after = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses(timeout_ms=STATUS_TIMEOUT_MS)).items() if d}
    states = sorted({(r or {}).get("state", "no record") for r in records.values()})
    sent = [after[i] - before[i] for i in after if i in before]
    done = [r for r in records.values() if r and r["state"] == "done"]
    out = {"states": states, "seconds": max((r["elapsed_s"] for r in done), default=None),
           "bytes_per_site_mean": int(statistics.mean(sent)), "bytes_per_site_max": max(sent)}
    errors = sorted({r["error"] for r in records.values() if r and r.get("error")})
    if errors:
        out["errors"] = errors[:3]
    if kind == "xgboost" and done:
        out["models"] = len({r["result"]["model_sha256"] for r in done})
    return out


def start_profiled(h: Harness, path: Path) -> None:
    """The first site's daemon under cProfile (its profile is written when it stops)."""
    site = h.sites[0]
    log = open(site.log_path, "ab")  # noqa: SIM115 - handed to the child
    site.process = subprocess.Popen(
        [sys.executable, "-m", "cProfile", "-o", str(path), "-m", "fedpeer", "start", "--config",
         str(site.config_path), "--log-level", h.log_level],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    log.close()
    site.starts += 1


async def one_size(n: int, rows_per_site: int, profile: Path | None, dialable: bool, idle_s: float,
                   jobs: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-hundred-") as tmp_name:
        tmp = Path(tmp_name)
        settings = {"network": {"reachable": "yes"}} if dialable else {}
        h = Harness(tmp / "fed", n, settings, site_data=write_sites(tmp, n, rows_per_site), data_settings=DATA)
        h.create()
        out: dict = {"sites": n, "timings_x": colocate.slowdown(n, colocate.cores()),
                     "load_1min_before": os.getloadavg()[0]}
        with h:
            started = time.monotonic()
            if profile is not None:
                start_profiled(h, profile)
            for i in range(1 if profile is not None else 0, n):
                h.start(i)
            out["fork_all_s"] = round(time.monotonic() - started, 2)
            try:
                await h.wait_all_alive(START_TIMEOUT_S)
                out["all_alive_s"] = round(time.monotonic() - started, 2)
            except HarnessError as exc:
                out["all_alive_s"] = None
                out["start_error"] = str(exc)[:200]
            out["churn"] = churn(h)
            docs = await h.statuses(timeout_ms=STATUS_TIMEOUT_MS)
            out["rejected_replay"] = sum((d or {}).get("rejected", {}).get("replay", 0) for d in docs.values())
            out["rejected_hello_rate"] = sum((d or {}).get("rejected", {}).get("hello_rate", 0) for d in docs.values())
            out["handshakes_failed"] = sum((d or {})["sessions"]["failed"] for d in docs.values() if d)
            failed_by: dict[str, int] = {}
            for d in docs.values():
                for reason, count in ((d or {}).get("sessions", {}).get("failed_by") or {}).items():
                    failed_by[reason] = failed_by.get(reason, 0) + count
            out["handshakes_failed_by"] = failed_by
            out["status"] = await status_latency(h)
            mem = [memory_kib(s.process.pid) for s in h.sites if s.process.poll() is None]
            out["memory_mib_per_daemon"] = {k: round(statistics.mean(m[k] for m in mem) / 1024, 1)
                                            for k in ("rss", "pss", "private")}
            out["memory_gib_total_pss"] = round(sum(m["pss"] for m in mem) / 2**20, 2)
            if out["all_alive_s"] is not None:
                await h.wait_ml_loaded(300)
                if idle_s:
                    out["idle"] = await idle(h, idle_s)
                    out["churn_after_idle"] = churn(h)
            if out["all_alive_s"] is not None and jobs:
                out["stats"] = await run_job(h, "stats", {})
                out["histogram_5_trees"] = await run_job(h, "xgboost", HIST)
            out["load_1min"] = round(os.getloadavg()[0], 1)
            out["exited"] = {site.name: code for site in h.sites if (code := site.process.poll()) is not None}
            if out["exited"]:
                out["exited_log_tail"] = h.sites[0].log_path.read_text(errors="replace").splitlines()[-5:]
    return out


def exponent(ns: list[int], ys: list[float | None]) -> float | None:
    """k of y ~ n^k, least squares in log-log over the sizes that have a value."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y]
    if len(pts) < 2:
        return None
    mx, my = statistics.mean(p[0] for p in pts), statistics.mean(p[1] for p in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts), 2)


def stats_vector_bytes(features: int = FEATURES) -> int:
    """Mean bytes of the stats job's two summed vectors (fedpeer/kinds/stats.py): moments, 2 + 2d
    fixed-point values; spread and histograms, d fixed-point values and d x (bins + 2) counts."""
    from fedpeer.kinds.stats import FIXED, PARAMS
    d, bins = features, PARAMS["bins"].default
    return 8 * ((2 + 2 * d) * FIXED.limbs + d * FIXED.limbs + d * (bins + 2)) // 2


def targets(runs: list[dict]) -> str:
    """Issue 41's targets for 100 real daemons on one machine, as measured."""
    ns = [r["sites"] for r in runs]
    big = max(runs, key=lambda r: r["sites"])
    stats, hist = big.get("stats") or {}, big.get("histogram_5_trees") or {}
    n_max = big["sites"]
    lines = [f"targets (issue 41) at n = {n_max}:",
             f"- membership converges: {'yes, in ' + str(big['all_alive_s']) + ' s' if big['all_alive_s'] else 'NO'}",
             f"- stats job ends done: {'yes' if stats.get('states') == ['done'] else 'NO ' + str(stats.get('states'))}",
             f"- 5-tree histogram job ends done: "
             f"{'yes' if hist.get('states') == ['done'] else 'NO ' + str(hist.get('states'))}"]
    if stats.get("bytes_per_site_mean"):
        per_sum, vector = stats["bytes_per_site_mean"] / 2, stats_vector_bytes()
        lines.append(f"- bytes sent per site per sum (stats, 2 sums): {per_sum:.0f} B against a {vector} B vector: "
                     f"{per_sum / vector:.1f}x (target <= 1.1x + headers)")
    if hist.get("bytes_per_site_mean"):
        lines.append(f"- histogram bytes sent per site per tree: {hist['bytes_per_site_mean'] / 5 / 1024:.0f} KiB")
    curve = [(r["sites"], (r.get(name) or {}).get("seconds")) for r in runs for name in ("histogram_5_trees",)]
    lines.append("- job time against n log n (histogram, 5 trees): " + ", ".join(
        f"n={n}: {t} s ({t / (n * math.log(n)) * 1000:.1f} ms per n ln n)" if t else f"n={n}: -" for n, t in curve))
    stats_k = exponent(ns, [(r.get("stats") or {}).get("seconds") for r in runs])
    hist_k = exponent(ns, [(r.get("histogram_5_trees") or {}).get("seconds") for r in runs])
    nlogn = exponent(ns, [n * math.log(n) for n in ns])
    lines.append(f"- growth exponent (time ~ n^k) from {min(ns)} to {max(ns)}: stats k = {stats_k}, histogram k = "
                 f"{hist_k}; n log n: k = {nlogn} (target: k <= {nlogn})")
    return "\n".join(lines)


def table(runs: list[dict]) -> str:
    def job(r: dict, name: str) -> str:
        j = r.get(name)
        if j is None:
            return "not run"
        return (f"{j['seconds']} s {'/'.join(j['states'])}, {j['bytes_per_site_mean'] / 1024:.0f} KiB/site"
                if j["seconds"] is not None else "/".join(j["states"]))
    lines = ["| sites | all alive | alive->suspect / dead | replays | status median / max | MiB per daemon "
             "rss / pss / private | stats | histogram, 5 trees |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r["memory_mib_per_daemon"]
        lines.append(f"| {r['sites']} | {r['all_alive_s']} s | {r['churn']['alive_to_suspect']} / "
                     f"{r['churn']['to_dead']} | {r['rejected_replay']} | {r['status']['median_s']} / "
                     f"{r['status']['max_s']} s | {m['rss']} / {m['pss']} / {m['private']} | {job(r, 'stats')} | "
                     f"{job(r, 'histogram_5_trees')} |")
    ns = [r["sites"] for r in runs]
    nlogn = exponent(ns, [n * math.log(n) for n in ns])
    lines.append(f"growth (time ~ n^k; n log n has k = {nlogn} over these sizes): "
                 f"all alive k = {exponent(ns, [r['all_alive_s'] for r in runs])}, "
                 f"stats k = {exponent(ns, [(r.get('stats') or {}).get('seconds') for r in runs])}, "
                 f"histogram k = {exponent(ns, [(r.get('histogram_5_trees') or {}).get('seconds') for r in runs])}, "
                 f"stats bytes/site k = "
                 f"{exponent(ns, [(r.get('stats') or {}).get('bytes_per_site_mean') for r in runs])}, "
                 f"histogram bytes/site k = "
                 f"{exponent(ns, [(r.get('histogram_5_trees') or {}).get('bytes_per_site_mean') for r in runs])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[10, 20, 40, 70, 100])
    ap.add_argument("--rows-per-site", type=int, default=200)
    ap.add_argument("--profile-site0", type=Path, metavar="FILE")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--idle-s", type=float, default=0.0, metavar="S",
                    help="once converged: each daemon's CPU and frames per second by kind over S seconds")
    ap.add_argument("--no-jobs", action="store_true", help="membership, status and memory only")
    ap.add_argument("--dialable", action="store_true",
                    help='sites start as [network] reachable = "yes" (loopback: they are): no reverse links to '
                         'every peer until a dial-back says so, which 100 sites starting together pay for')
    ap.add_argument("--table-from", type=Path, nargs="+", metavar="FILE",
                    help="print the table and targets of earlier runs: files holding the one-line JSON documents "
                         "this benchmark writes to stderr per n (runs nothing)")
    args = ap.parse_args()
    if args.table_from:
        runs = sorted((json.loads(line) for path in args.table_from for line in path.read_text().splitlines()
                       if line.startswith('{"sites"')), key=lambda r: r["sites"])
        print(table(runs) + "\n\n" + targets(runs))
        return
    zygote.share(True)
    runs = []
    try:
        for n in args.sites:
            runs.append(asyncio.run(one_size(n, args.rows_per_site, args.profile_site0, args.dialable,
                                            args.idle_s, not args.no_jobs)))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        zygote.share(False)
    print(json.dumps(runs, indent=1) if args.json else table(runs) + "\n\n" + targets(runs))


if __name__ == "__main__":
    main()
