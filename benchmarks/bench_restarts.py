"""Issue 41's restart test: a 50-round histogram XGBoost job on 4 real daemons (the harness, on
loopback), one member stopped (kill -TERM, 7 runs) or killed (kill -9, 7 runs) mid-job and started
again at once (fedpeer/testing/restarts.py). Prints one line per run (how, the step it reached and
what its record kept on disk, how the job ended at the survivors, whether the restarted member
came back into the job or why not), then "N of 14 done at the survivors, M rejoined".

The issue measured it in network namespaces (fedpeer/testing/netns.py); this runs it on one
loopback, one federation for all runs, the victim in turn among the members that did not propose.
Daemons are forked from one zygote, as in the test suite (fedpeer/app/harness/zygote.py): a
restart is then a fork (well under a second); a cold `python -m fedpeer start` takes seconds of
imports on a loaded machine, which a short job may not outlast (--cold).

Run: .venv/bin/python benchmarks/bench_restarts.py [--runs 14] [--rounds 50] [--hop-timeout-ms 5000] [--cold]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness import zygote  # noqa: E402
from fedpeer.app.harness.federation import Harness, builtin_csv, split_csv  # noqa: E402
from fedpeer.app.sitefiles import add_peers  # noqa: E402
from fedpeer.config import load as cfg  # noqa: E402
from fedpeer.testing.restarts import restart_mid_job  # noqa: E402

SITES = 4


async def main(args: argparse.Namespace) -> None:
    zygote.share(not args.cold)
    workdir = Path(tempfile.mkdtemp(prefix="bench-restarts-"))
    full = builtin_csv("builtin:breast_cancer", workdir / "bc.csv")
    parts = split_csv(full, "diagnosis", SITES, "stratified", seed=5, out_dir=workdir / "parts")
    h = Harness(workdir / "fed", SITES, {"jobs": {"hop_timeout_ms": args.hop_timeout_ms, "preload_ml": False}})
    h.create()
    for site, path in zip(h.sites, parts):
        (site.dir / "data.csv").write_bytes(path.read_bytes())
        add_peers(site.config_path, [], {"data": {"csv": "data.csv", "label": "diagnosis", "positive": "malignant"}})
        site.config = cfg.load(site.config_path)
    params = {"mode": "histogram", "rounds": args.rounds, "max_depth": 4, "max_bin": 64, "eta": 0.3,
              "test_fraction": 0.0, "nthread": 1}
    runs = []
    try:
        h.start()
        await h.wait_all_alive(timeout_s=60)
        for k in range(args.runs):
            how = "term" if k < args.runs // 2 else "kill9"
            victim = 1 + k % (SITES - 1)
            started = time.monotonic()
            try:
                run = await restart_mid_job(h, 0, victim, params, how, 3, timeout_s=180)
            except Exception as exc:   # noqa: BLE001  (a run that times out is counted, not fatal)
                print(f"{k + 1:2d} {how}: {type(exc).__name__}: {exc}", flush=True)
                runs.append(None)
                await h.wait_all_alive(timeout_s=60)
                continue
            runs.append(run)
            print(f"{k + 1:2d} {h.sites[victim].name} {run.line()} ({time.monotonic() - started:.1f} s)", flush=True)
            await h.wait_all_alive(timeout_s=60)
    finally:
        h.stop()
        zygote.share(False)
    done = sum(r is not None and r.survivors_done for r in runs)
    rejoined = sum(r is not None and r.rejoined for r in runs)
    print(f"{done} of {len(runs)} done at the survivors, {rejoined} rejoined (logs in {workdir})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--hop-timeout-ms", type=int, default=5_000)
    ap.add_argument("--cold", action="store_true", help="each daemon a fresh process, not forked from a zygote")
    asyncio.run(main(ap.parse_args()))
