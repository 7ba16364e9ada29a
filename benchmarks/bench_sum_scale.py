"""The secure sum at scale, simulated: n members over the in-memory network in virtual time
(fedpeer/testing/sumsim.py), with 0 % and 10 % of the members crashing at seeded random moments
of the protocol (any member, the initiator included; drops uniform over the time the same sum
takes without drops).

Per row: whether every survivor returned the same exact total, how many vectors it holds, the
initiator's attempts, delivered messages, frame bytes sent per member (mean; and the most any
member sent: the initiator), the bytes of the re-runs' announcements, virtual time until the
last survivor returned, and the real time the simulation took (it varies with the machine's
load). Vectors of --length uint64 entries (one chunk); hop timeout 1 s, failure detector 0.5 s.
Each figure is over --seeds seeds: messages, bytes and virtual time are medians, "ok" counts the
seeds where the sum completed.

Note: the wire caps a sum's participants at PARTICIPANTS_MAX (securesum/wire.py); the in-memory
network does not pass messages through the gate, so rows above it simulate the protocol only.

--wire: "full" announces every re-run's whole participant list to every survivor (what members
of releases without the compact messages run), "compact" only who is dropped (secure_sum's
`compact`). attempts_max is the protocol's default (3) unless given: attempts that lose members
do not count against it.

Run: .venv/bin/python benchmarks/bench_sum_scale.py [--sizes 10 100 1000] [--modes ring pairwise sparse]
     [--drops 0 0.1] [--seeds 1] [--attempts-max 3] [--wire full compact]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.testing.sumsim import simulate_sum  # noqa: E402

ATTEMPTS_MAX_DEFAULT = 3        # secure_sum's default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--modes", nargs="+", default=["ring", "pairwise"])
    ap.add_argument("--drops", type=float, nargs="+", default=[0.0, 0.1], help="fraction of members that crash")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--length", type=int, default=16, help="vector entries (uint64)")
    ap.add_argument("--attempts-max", type=int, default=ATTEMPTS_MAX_DEFAULT)
    ap.add_argument("--wire", nargs="+", choices=["full", "compact"], default=["compact"])
    args = ap.parse_args()
    print(f"attempts_max {args.attempts_max}, vector {args.length} x uint64, seeds {args.seeds}")
    print("| n | mode | wire | drop | dropped | ok | vectors in sum | attempts | messages | bytes/member (mean) "
          "| bytes (initiator) | announcements (bytes) | virtual s | real s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for mode in args.modes:
            for wire, drop in ((w, d) for d in args.drops for w in args.wire):
                started = time.perf_counter()
                runs = [simulate_sum(n, mode=mode, drop_fraction=drop, seed=s, length=args.length,
                                     attempts_max=args.attempts_max, compact=wire == "compact")
                        for s in range(args.seeds)]
                real = (time.perf_counter() - started) / len(runs)

                def med(field: str, runs: list = runs) -> float:
                    return statistics.median(getattr(r, field) for r in runs)
                print(f"| {n} | {mode} | {wire} | {drop:.0%} | {runs[0].dropped} "
                      f"| {sum(r.ok for r in runs)}/{len(runs)} "
                      f"| {med('participants'):.0f} | {med('attempts'):.0f} | {med('messages'):.0f} "
                      f"| {med('bytes_mean'):,.0f} | {med('bytes_max'):,.0f} | {med('announce_bytes'):,.0f} "
                      f"| {med('virtual_s'):.3f} | {real:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
