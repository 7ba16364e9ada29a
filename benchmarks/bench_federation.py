"""A large local federation on this machine: time until every daemon sees every other alive, and
the idle CPU and memory of the whole federation afterwards (gossip must not flood).

Run: .venv/bin/python benchmarks/bench_federation.py [--sites 32] [--idle-s 20] [--preload]

By default the daemons do not import the ML libraries at start ([jobs] preload_ml = false, as in
the tests): 32 daemons importing xgboost and scikit-learn at once on 2 cores measure the imports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS     # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main(n: int, idle_s: float, preload: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), n, {"jobs": {"preload_ml": preload}})
        h.create()
        started = time.monotonic()
        h.start()
        try:
            converge_s = await h.wait_all_alive(timeout_s=120)
            total_s = time.monotonic() - started
            pids = [s.process.pid for s in h.sites]
            before = [cpu_s(p) for p in pids]
            await asyncio.sleep(idle_s)
            after = [cpu_s(p) for p in pids]
            statuses = await h.statuses()
            rss = [rss_mib(p) for p in pids]
        finally:
            h.stop()
    cores = (sum(after) - sum(before)) / idle_s
    alive = [sum(p["state"] == "alive" for p in d["peers"]) for d in statuses.values() if d]
    return {"sites": n, "start_to_all_alive_s": round(total_s, 2), "poll_wait_s": round(converge_s, 2),
            "idle_cpu_cores_total": round(cores, 3), "idle_cpu_pct_of_machine": round(100 * cores / os.cpu_count(), 1),
            "idle_cpu_pct_per_daemon": round(100 * cores / n, 2),
            "rss_mib_mean": round(sum(rss) / n, 1), "rss_mib_max": round(max(rss), 1),
            "alive_peers_min_after_idle": min(alive), "false_suspicions": n * (n - 1) - sum(alive)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--sites", type=int, default=32)
    parser.add_argument("--idle-s", type=float, default=20)
    parser.add_argument("--preload", action="store_true",
                        help="daemons import the ML libraries at start ([jobs] preload_ml, a site's default; "
                             "~4 s of CPU each: 32 on 2 cores spend minutes on it)")
    args = parser.parse_args()
    r = asyncio.run(main(args.sites, args.idle_s, args.preload))
    print(f"{r['sites']} daemons: all see all alive {r['start_to_all_alive_s']} s after start (target < 15 s); "
          f"idle federation uses {r['idle_cpu_cores_total']} cores = {r['idle_cpu_pct_of_machine']} % of this "
          f"{os.cpu_count()}-core machine ({r['idle_cpu_pct_per_daemon']} % of a core per daemon); "
          f"RSS mean {r['rss_mib_mean']} MiB, max {r['rss_mib_max']} MiB; "
          f"after idling, min alive peers seen {r['alive_peers_min_after_idle']}/{r['sites'] - 1}")
    print(json.dumps(r))
