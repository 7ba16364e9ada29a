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
  of silence plus 3 probes 1 s apart, or at the first request written on it (5 s unacknowledged,
  fedpeer/net/dial.py UNACKED_MS_MAX); tests/integration/test_netns.py shows the keep-alive keeping
  such links through 40 s idle behind a middlebox that forgets flows after 30 s.
Prints p50, p95 and max of each, in seconds, and the whole output as JSON on the last line.

Run (root): .venv/bin/python benchmarks/bench_reach.py [--sites 5] [--starts 5] [--drops 20]
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
            out["alive_after_start_s"] = quantiles(alive)
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
            out["links_back_after_drop_s"] = quantiles(back)
            print(f"links back after a drop (reset), {args.drops} drops: {out['links_back_after_drop_s']}", flush=True)
        finally:
            h.stop()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--drops", type=int, default=20)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
