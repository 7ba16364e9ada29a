"""Survivors never split (issue 41): the seeded simulation of a leaderless job's epochs
(fedpeer/testing/epochsim.py) over many seeds, with and without views (fedpeer/protocols/epochs.py,
"Views"). Each seed draws 3 to 6 members, kills 1 to n - 2 of them at random moments of the job
(half of them restart, as a new incarnation without the job), 2 to 5 steps, any secure-sum mode;
each failure detector declares a crash 0.5 to 3.5 s after it.

Prints, per setting and mode, how the runs ended at the members never killed: done (all the same
result), done-without (the same, except survivors the others went on without, which failed
knowing it), failed (all failed) and split (some done and some failed, or different results),
with the first seeds of each end that is not done (each replays with simulate_random(seed)).

With --rejoin (views on): each restarted member runs its part again and asks back in (epochs.py,
"Rejoins"; 4 to 12 steps, restarts three times in four); also prints how many came back with the
survivors' result and the reasons of those left out.

Run: .venv/bin/python benchmarks/bench_epoch_splits.py [--seeds 2000] [--start 0] [--views both|on|off] [--rejoin]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.testing.epochsim import ENDS, simulate_random  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=2000)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--views", choices=("both", "on", "off"), default="both")
    ap.add_argument("--rejoin", action="store_true", help="restarted members ask back in (views on)")
    args = ap.parse_args()
    settings = (True,) if args.rejoin else {"both": (False, True), "on": (True,), "off": (False,)}[args.views]
    back, restarted, reasons = 0, 0, collections.Counter()
    print("| views | mode | runs | " + " | ".join(ENDS) + " | real s | first seeds not done |")
    print("|---|---|---|" + "---|" * len(ENDS) + "---|---|")
    for views in settings:
        ends: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        odd: dict[str, list[int]] = collections.defaultdict(list)
        started = time.perf_counter()
        for seed in range(args.start, args.start + args.seeds):
            run = simulate_random(seed, views=views, rejoin=args.rejoin)
            back, restarted = back + run.rejoined, restarted + run.restarted
            reasons.update(reason.split(":")[0] for reason in run.left_out)
            for mode in (run.mode, "all"):
                ends[mode][run.end] += 1
                if run.end not in ("done", "done-without") and len(odd[mode]) < 5:
                    odd[mode].append(seed)
        real = time.perf_counter() - started
        for mode in ("allreduce", "ring", "pairwise", "all"):
            counts = ends[mode]
            print(f"| {'on' if views else 'off'} | {mode} | {sum(counts.values())} | "
                  + " | ".join(str(counts[e]) for e in ENDS)
                  + f" | {f'{real:.0f}' if mode == 'all' else ''} | {' '.join(map(str, odd[mode])) or '-'} |",
                  flush=True)
    if args.rejoin:
        print(f"\n{restarted} members restarted, {back} rejoined; left out: "
              + (", ".join(f"{why} ({n})" for why, n in reasons.most_common()) or "none"))


if __name__ == "__main__":
    main()
