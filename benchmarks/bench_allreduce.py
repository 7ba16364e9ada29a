"""The secure all-reduce against the pairwise ring, side by side on real daemons.

One `sumcheck` job per run (a vector of --mib MiB of uint64, secure-summed over N daemons with
masks and the wire's encryption), alternating secure_sum=pairwise and secure_sum=allreduce, each
--repeats times. Per mode, best-of and median: the job's own secure-sum seconds at site 0, the CPU
seconds of all daemon processes together per MiB summed (their threads' on-CPU nanoseconds from
/proc/PID/task/*/schedstat, before and after the job; proposals paced at the members' proposal
rate), and the bytes each site sent during the job (its reliable-class counter in
`status`): the most any site sent, the mean, and their ratio.

Run: .venv/bin/python benchmarks/bench_allreduce.py --sites 5 --mib 8 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_transport import cpu_seconds  # noqa: E402

from fedpeer.app.harness.federation import Harness  # noqa: E402
from fedpeer.jobs.lifecycle.admission import PROPOSAL_REFILL_MS  # noqa: E402

MODES = ("pairwise", "allreduce")
_last_proposal = [0.0]   # monotonic seconds: proposals are paced at the members' refill rate (else job_limit)


async def sent(h: Harness, n: int) -> list[int]:
    docs = await h.statuses(list(range(n)))
    return [docs[i]["sent_bytes"]["reliable"] for i in range(n)]


async def one(h: Harness, n: int, mode: str, entries: int) -> dict:
    await asyncio.sleep(max(0.0, _last_proposal[0] + PROPOSAL_REFILL_MS / 1000 + 0.1 - time.monotonic()))
    _last_proposal[0] = time.monotonic()
    pids = [site.process.pid for site in h.sites]
    cpu0, sent0 = cpu_seconds(pids), await sent(h, n)
    job = await h.propose(0, "sumcheck", {"entries": entries, "secure_sum": mode})
    records = await h.wait_job(job, timeout_s=600)
    states = {i: (r["state"], r["error"]) if r is not None else ("unknown", "no record") for i, r in records.items()}
    assert {s for s, _ in states.values()} == {"done"}, states
    cpu1, sent1 = cpu_seconds(pids), await sent(h, n)
    per_site = [b - a for a, b in zip(sent0, sent1)]
    return {"seconds": records[0]["result"]["seconds"], "cpu_ms_per_mib": 1000 * (cpu1 - cpu0) / (entries * 8 / 2**20),
            "max_mib": max(per_site) / 2**20, "mean_mib": statistics.mean(per_site) / 2**20}


async def main(args: argparse.Namespace) -> None:
    entries = args.mib * 2**20 // 8
    with tempfile.TemporaryDirectory(prefix="fedpeer-bench-ar-") as work:
        h = Harness(Path(work), args.sites)
        h.create()
        h.start()
        try:
            await h.wait_all_alive(timeout_s=60)
            runs: dict[str, list[dict]] = {m: [] for m in MODES}
            for _ in range(args.repeats):
                for mode in MODES:              # interleaved: the machine's noise hits both alike
                    runs[mode].append(await one(h, args.sites, mode, entries))
        finally:
            h.stop()
    print(f"{args.sites} daemons, {args.mib} MiB vector, {args.repeats} runs per mode (load {os.getloadavg()[0]:.1f})")
    print(f"{'mode':<10} {'s best':>7} {'s median':>9} {'CPU ms/MiB best':>16} {'median':>7} "
          f"{'max MiB sent':>13} {'mean':>6} {'max/mean':>9}")
    for mode, rs in runs.items():
        s = [r["seconds"] for r in rs]
        c = [r["cpu_ms_per_mib"] for r in rs]
        mx, mean = statistics.median(r["max_mib"] for r in rs), statistics.median(r["mean_mib"] for r in rs)
        print(f"{mode:<10} {min(s):>7.3f} {statistics.median(s):>9.3f} {min(c):>16.1f} {statistics.median(c):>7.1f} "
              f"{mx:>13.1f} {mean:>6.1f} {mx / mean:>9.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=5)
    p.add_argument("--mib", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(p.parse_args()))
