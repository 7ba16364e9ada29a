"""Reach, measured on emulated site networks (network namespaces, fedpeer/testing/netns.py; root):
how soon a site whose firewall drops inbound connections is `alive` at every site after it starts,
and how soon the links it keeps open for its peers are back after they are dropped.

- Alive: a federation of `--sites` daemons runs; the outbound-only site (the last) is started,
  and the clock runs until every other site's status shows it alive (`--starts` times: it is
  stopped and started again, its peers keep running).
- Back: each drop destroys the site's links to its peers with `ss -K` in its namespace (the kernel
  aborts the sockets and resets them, as a middlebox that sends a reset does), and the clock runs
  until its status shows every link open again (`--drops` times). A middlebox that forgets a flow
  without a word is noticed by the TCP keep-alive instead: after `[network] keepalive_ms` (20 s)
  of silence plus 3 probes 1 s apart; tests/integration/test_netns.py shows the keep-alive keeping
  such links through 40 s idle behind a middlebox that forgets flows after 30 s.
- Paths (`--repeats` > 0): the same jobs (stats, k-means, exact logreg, 5 histogram trees; one
  `make_classification` set of `--rows` x 20 split evenly; the same site keys every time) on three
  networks, alternating, each a federation of its own: flat; the last site behind a firewall that
  drops inbound connections and able to leave only through Debian's tinyproxy ("proxied"); sites 2
  and 3 cut both ways, relayed by members ("relayed"). Per job: seconds (slowest member's
  elapsed_s) and bytes on the wire (an iptables counter on each site's OUTPUT: every TCP byte it
  sent, headers, handshakes and membership included); medians, and each variant's ratio to flat:
  for the proxied site the bytes it sent (to the proxy) against what it sent flat, for the relayed
  pair what the two sent, and the federation's total. No delay is emulated here (no netem in this
  kernel's modules): times are at loopback speed, where a relay's cost is its CPU, not its extra
  leg; bench_wan.py --cut measures the relayed pair over an emulated 25 ms WAN.
Prints p50, p95 and max of each, in seconds, and the whole output as JSON on the last line.

Run (root): .venv/bin/python benchmarks/bench_reach.py [--sites 5] [--starts 5] [--drops 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedpeer.app.harness.federation import Harness
from fedpeer.testing import netns

POLL_S = 0.02


def quantiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"n": len(s), "p50": round(statistics.median(s), 3), "p95": round(s[min(len(s) - 1, int(0.95 * len(s)))], 3),
            "max": round(s[-1], 3)}


async def until(h: Harness, i: int | None, predicate, timeout_s: float = 60) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        docs = await h.statuses(None if i is None else [i])
        if predicate(docs):
            return time.monotonic() - started
        await asyncio.sleep(POLL_S)
    raise TimeoutError("not reached")


async def main(args: argparse.Namespace) -> dict:
    reason = netns.skip_reason()
    if reason:
        sys.exit(f"bench_reach: {reason}")
    n, last = args.sites, args.sites - 1
    out: dict = {"sites": n}
    with tempfile.TemporaryDirectory(prefix="fedpeer-reach-") as tmp, netns.SiteNet(n) as net:
        h = Harness(Path(tmp) / "fed", n, {"jobs": {"preload_ml": False}},
                    hosts=[net.host(k) for k in range(1, n + 1)], wraps=[net.exec(k) for k in range(1, n + 1)])
        h.create()
        net.block_inbound(n)
        try:
            for i in range(last):
                h.start(i)
            await h.wait_all_alive(timeout_s=60, among=list(range(last)))
            alive = []
            for _ in range(args.starts):
                h.start(last)
                alive.append(await until(h, None, lambda d: all(
                    d[i] is not None and {p["name"]: p["state"] for p in d[i]["peers"]}[h.sites[last].name] == "alive"
                    for i in range(last))))
                await until(h, last, lambda d: d[last] is not None and d[last]["reach"]["state"] == "outbound-only")
                h.stop(last)
                # the next start counts from a site its peers hold dead (else "alive" is their old view)
                await until(h, None, lambda d: all(
                    d[i] is not None and {p["name"]: p["state"] for p in d[i]["peers"]}[h.sites[last].name] == "dead"
                    for i in range(last)), 60)
            out["alive_after_start_s"] = quantiles(alive) if alive else None
            print(f"outbound-only site alive at every site after its start: {out['alive_after_start_s']}", flush=True)
            h.start(last)
            full = 2 * last
            await until(h, last, lambda d: d[last] is not None and d[last]["reach"]["links_dialed_for_peers"] == full)
            back = []
            for _ in range(args.drops):
                await asyncio.sleep(0.5)
                opened = (await h.status(last))["reach"]["links_opened"]
                started = time.monotonic()
                subprocess.run([*net.exec(n), "ss", "-K", "state", "established"], capture_output=True, check=True)
                await until(h, last, lambda d, opened=opened: d[last] is not None
                            and d[last]["reach"]["links_opened"] >= opened + full
                            and d[last]["reach"]["links_dialed_for_peers"] == full)
                back.append(time.monotonic() - started)
            out["links_back_after_drop_s"] = quantiles(back) if back else None
            print(f"links back after a drop (reset), {args.drops} drops: {out['links_back_after_drop_s']}", flush=True)
        finally:
            h.stop()
    if args.repeats:
        out["paths"] = await paths(args)
    return out


JOBS = [("stats", {"bins": 10}), ("kmeans", {"k": 5, "n_init": 1, "max_iter": 10, "standardize": False}),
        ("logreg", {}), ("xgboost", {"rounds": 5, "max_depth": 6})]


def wire_bytes(net: netns.SiteNet, k: int) -> int:
    """What site k sent over TCP since its counter was set (the first OUTPUT rule's bytes)."""
    text = subprocess.run([*net.exec(k), "iptables", "-nvxL", "OUTPUT"], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    return int(text[2].split()[1])


async def one_variant(variant: str, tmp: Path, parts: list[Path], n: int) -> dict[str, dict]:
    with netns.SiteNet(n) as net:
        settings: dict = {"jobs": {"preload_ml": False}}
        h = Harness(tmp / variant, n, settings, key_seed=3, site_data=parts,
                    data_settings={"label": "label", "positive": "1"},
                    hosts=[net.host(k) for k in range(1, n + 1)], wraps=[net.exec(k) for k in range(1, n + 1)])
        h.create()
        if variant == "proxied":
            proxy = net.start_proxy(tmp / variant)
            from fedpeer.app.sitefiles import add_peers
            add_peers(h.sites[n - 1].config_path, [], {"network": {"proxy": proxy}})
            net.block_inbound(n)
            net.only_through_proxy(n)
        elif variant == "relayed":
            net.cut(2, 3)
        for k in range(1, n + 1):
            net.iptables(k, "-I", "OUTPUT", "1", "-p", "tcp")     # a counter, no verdict
        rows = {}
        try:
            h.start()
            await h.wait_all_alive(timeout_s=60)
            for kind, params in JOBS:
                before = [wire_bytes(net, k) for k in range(1, n + 1)]
                job_id = await h.propose(0, kind, params)
                records = await h.wait_job(job_id, timeout_s=600)
                after = [wire_bytes(net, k) for k in range(1, n + 1)]
                if {r["state"] for r in records.values() if r} != {"done"}:
                    rows[kind] = {"error": str([r and r.get("error") for r in records.values()])[:300]}
                    continue
                rows[kind] = {"s": max(r["elapsed_s"] for r in records.values()),
                              "wire": [b - a for a, b in zip(before, after)]}
        finally:
            h.stop()
    return rows


async def paths(args: argparse.Namespace) -> dict:
    from sklearn.datasets import make_classification
    import numpy as np
    n = args.sites
    runs: dict[str, list[dict]] = {"flat": [], "proxied": [], "relayed": []}
    with tempfile.TemporaryDirectory(prefix="fedpeer-paths-") as tmp_name:
        tmp = Path(tmp_name)
        X, y = make_classification(n_samples=args.rows, n_features=20, n_informative=10, random_state=7)
        per, parts = args.rows // n, []
        for k in range(n):
            path = tmp / f"site{k}.csv"
            np.savetxt(path, np.column_stack([X[k * per:(k + 1) * per], y[k * per:(k + 1) * per]]), delimiter=",",
                       header=",".join([f"f{j}" for j in range(20)] + ["label"]), comments="",
                       fmt=["%.17g"] * 20 + ["%d"])
            parts.append(path)
        for r in range(args.repeats):
            for variant in runs:
                runs[variant].append(await one_variant(variant, tmp / f"r{r}", parts, n))
                print(f"  paths: {variant} run {r + 1}: " + ", ".join(
                    f"{k} {v.get('s', v.get('error'))}" for k, v in runs[variant][-1].items()), file=sys.stderr,
                    flush=True)
    out: dict = {}
    print(f"{n} sites on namespaces (no delay), {args.repeats} runs of each network, alternating; medians; "
          "x = ratio to flat")
    print(f"  {'JOB':8} {'FLAT S':>7} {'PROXIED S':>9} {'x':>5} {'RELAYED S':>9} {'x':>5}  "
          f"{'PROXIED SITE BYTES x':>20} {'PAIR BYTES x':>12} {'ALL BYTES x (relayed)':>21}")
    for kind, _ in JOBS:
        ok = {v: [run[kind] for run in runs[v] if "s" in run[kind]] for v in runs}
        if not all(ok.values()):
            print(f"  {kind:8} failed: {[run[kind].get('error') for v in runs for run in runs[v]]}")
            continue
        sec = {v: statistics.median(r["s"] for r in ok[v]) for v in runs}
        site = {v: statistics.median(r["wire"][n - 1] for r in ok[v]) for v in runs}
        pair = {v: statistics.median(r["wire"][1] + r["wire"][2] for r in ok[v]) for v in runs}
        total = {v: statistics.median(sum(r["wire"]) for r in ok[v]) for v in runs}
        out[kind] = {"s": sec, "proxied_site_bytes": site, "pair_bytes": pair, "all_bytes": total}
        print(f"  {kind:8} {sec['flat']:7.3f} {sec['proxied']:9.3f} {sec['proxied'] / sec['flat']:5.2f} "
              f"{sec['relayed']:9.3f} {sec['relayed'] / sec['flat']:5.2f}  "
              f"{site['proxied'] / site['flat']:20.3f} {pair['relayed'] / pair['flat']:12.3f} "
              f"{total['relayed'] / total['flat']:21.3f}", flush=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--drops", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each network for the paths' table (0: none)")
    ap.add_argument("--rows", type=int, default=20_000)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
