"""Secure-sum throughput and latency on real daemons, against plain bytes around the same ring.

fedpeer: the `sumcheck` job (a 1 Mi-entry uint64 vector = 8 MiB, secure-summed around N daemons,
with masks and the wire's encryption; the time is the job's own secure-sum time on site 0).
References, same run: N bare aiohttp relay processes in a ring, no masking, no crypto, no
validation; the first sends the same chunks (same chunk size, SENDS_IN_FLIGHT_MAX posts in flight
as the secure sum; each hop answers 204 and forwards in the background):
* "lap": timed until every chunk came back to the first (the plain one-lap relay);
* "lap_and_delivery": one lap, then the first sends the whole vector to every other relay the
  way the secure sum delivers its total (directly, SENDS_IN_FLIGHT_MAX at a time to each),
  timed until every relay has all of it. A secure sum must move (2N-1) x 8 MiB to the lap's
  N x 8 MiB, so this is the fair reference for its ratio (issue 13 item 5: >= 0.7x).
Each figure: best-of and median of --repeats runs, in MiB/s of the 8 MiB vector.
Also: p50/p99 latency of one secure sum of a 16-entry vector over 5 daemons (--small), and the
event-loop lag of every daemon while one --lag-mib MiB pairwise sum runs over 3 daemons.

Run: .venv/bin/python benchmarks/bench_securesum.py --rings 3 5 9 --repeats 5 [--small 0] [--lag-mib 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness, free_ports  # noqa: E402
from fedpeer.jobs.lifecycle.admission import PROPOSAL_REFILL_MS, PROPOSALS_BURST_MAX  # noqa: E402
from fedpeer.net.looplag import LAG_WINDOW_S  # noqa: E402
from fedpeer.protocols.securesum.api import DEFAULT_CHUNK_ENTRIES, SENDS_IN_FLIGHT_MAX  # noqa: E402

ENTRIES = 1 << 20
CHUNK_ENTRIES = DEFAULT_CHUNK_ENTRIES    # the secure sum's default chunk; the relays use the same

RELAY = r"""
import asyncio, sys, time
import aiohttp
from aiohttp import web
me, nxt, chunks, chunk_bytes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
origin = sys.argv[5] == "origin"
ports = [int(p) for p in sys.argv[6].split(",")]    # every relay, ring order, the origin first
window = int(sys.argv[7])                           # sends in flight from the origin to one relay
last = nxt == ports[0]
state = {"back": 0, "done": None, "results": 0, "got": 0, "delivered": None}
session = None
tasks = set()

def background(coro):
    t = asyncio.create_task(coro); tasks.add(t); t.add_done_callback(tasks.discard)

async def post(port, path, body=b""):
    async with session.post(f"http://127.0.0.1:{port}{path}", data=body) as r:
        assert r.status == 204

async def lap(request):                 # one chunk of the lap
    body = await request.read()
    if origin:
        state["back"] += 1
        if state["back"] == chunks:
            state["done"].set()
    else:
        background(post(nxt, "/x", body))
    return web.Response(status=204)

async def result(request):              # one chunk of the total: keep it; in a chain, pass it on
    body = await request.read()
    state["results"] += 1
    if request.query.get("chain") == "1" and not last:
        background(post(nxt, "/r?chain=1", body))
    if state["results"] == chunks:
        state["results"] = 0
        background(post(ports[0], "/got"))
    return web.Response(status=204)

async def got(request):
    state["got"] += 1
    if state["got"] == len(ports) - 1:
        state["delivered"].set()
    return web.Response(status=204)

async def send_all(port, path, payload):     # as the secure sum: `window` posts at a time
    slots = asyncio.Semaphore(window)
    async def one():
        try:
            await post(port, path, payload)
        finally:
            slots.release()
    sends = []
    for _ in range(chunks):
        await slots.acquire()
        sends.append(asyncio.create_task(one()))
    await asyncio.gather(*sends)

async def go(request):
    delivery = request.query.get("delivery", "none")
    state["back"], state["done"] = 0, asyncio.Event()
    state["got"], state["delivered"] = 0, asyncio.Event()
    payload = bytes(chunk_bytes)
    t0 = time.perf_counter()
    await send_all(nxt, "/x", payload)
    await state["done"].wait()
    if delivery == "star":              # the total from the origin to every other relay
        await asyncio.gather(*(send_all(p, "/r", payload) for p in ports[1:]))
        await state["delivered"].wait()
    elif delivery == "chain":           # the total around the ring once more, each keeping a copy
        await send_all(nxt, "/r?chain=1", payload)
        await state["delivered"].wait()
    return web.json_response({"seconds": time.perf_counter() - t0})

async def main():
    global session
    session = aiohttp.ClientSession()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/x", lap)
    app.router.add_post("/r", result)
    app.router.add_post("/got", got)
    app.router.add_post("/go", go)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", me).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def bare_ring(n: int, repeats: int, delivery: str = "none") -> tuple[list[float], list[float]]:
    """Seconds per run of N relay processes: one lap of the vector (`delivery` "none"), or one
    lap then the total to every other relay ("star": from the origin; "chain": around the ring
    once more, each relay keeping a copy and passing it on), timed until every relay has it.
    Returns the seconds of each run and the CPU seconds all relays used in it."""
    ports = free_ports(n)
    chunks = ENTRIES // CHUNK_ENTRIES
    procs = [subprocess.Popen([sys.executable, "-c", RELAY, str(ports[i]), str(ports[(i + 1) % n]), str(chunks),
                               str(CHUNK_ENTRIES * 8), "origin" if i == 0 else "relay",
                               ",".join(map(str, ports)), str(SENDS_IN_FLIGHT_MAX)]) for i in range(n)]
    try:
        out: list[float] = []
        cpu: list[float] = []
        async with aiohttp.ClientSession() as s:
            for port in ports:            # the relays import aiohttp first: seconds on a loaded machine
                for _ in range(200):
                    try:
                        async with s.get(f"http://127.0.0.1:{port}/nothing"):
                            break
                    except aiohttp.ClientConnectorError:
                        await asyncio.sleep(0.1)
            for _ in range(repeats):
                before = cpu_s([p.pid for p in procs])
                async with s.post(f"http://127.0.0.1:{ports[0]}/go?delivery={delivery}") as r:
                    out.append((await r.json())["seconds"])
                cpu.append(cpu_s([p.pid for p in procs]) - before)
        return out, cpu
    finally:
        for p in procs:
            p.terminate()
            p.wait()


async def fedpeer_sums(h: Harness, entries: int, repeats: int, mode: str,
                       sum_cpu: list[float] | None = None) -> list[float]:
    """Site 0's secure-sum seconds of each of `repeats` sumcheck jobs; `sum_cpu` gets, per job, the
    CPU seconds of all daemons' processes while each ran its own sum (sumcheck's `cpu_seconds`:
    its test vector and check are outside, the daemons' background work meanwhile inside)."""
    seconds = []
    for i in range(repeats):
        if i >= PROPOSALS_BURST_MAX - 1:      # members refuse a proposer faster than their token bucket
            await asyncio.sleep(PROPOSAL_REFILL_MS / 1000)
        job_id = await h.propose(0, "sumcheck",
                                 {"entries": entries, "secure_sum": mode, "chunk_entries": CHUNK_ENTRIES})
        records = await h.wait_job(job_id, timeout_s=600)
        record = records[0]
        assert record["state"] == "done", record["error"]
        seconds.append(record["result"]["seconds"])
        if sum_cpu is not None:
            sum_cpu.append(sum(r["result"]["cpu_seconds"] for r in records.values()))
    return seconds


@contextlib.asynccontextmanager
async def federation(n: int) -> AsyncIterator[Harness]:
    """N real daemons, all alive; stopped afterwards whatever happens."""
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), n)
        h.create()
        h.start()
        try:
            await h.wait_all_alive(60)
            yield h
        finally:
            h.stop()


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds used so far by these processes (Linux /proc): the work a run
    costs, which other load on the machine inflates far less than it inflates wall time."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])        # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def _figures(seconds: list[float], cpu: list[float] | None = None, sum_cpu: list[float] | None = None) -> dict:
    mib = ENTRIES * 8 / 2**20
    out = {"best_MiB_s": mib / min(seconds), "median_MiB_s": mib / statistics.median(seconds),
           "seconds": [round(x, 4) for x in seconds]}
    if cpu:
        out["cpu_ms_per_MiB"] = 1000 * statistics.median(cpu) / mib
    if sum_cpu:
        out["sum_cpu_ms_per_MiB"] = 1000 * statistics.median(sum_cpu) / mib
    return out


async def ring(n: int, repeats: int) -> dict:
    """fedpeer's two modes, then the two references (one lap; one lap + the total to every relay),
    each `repeats` times; MiB/s best-of and median, and the ratios of each to each."""
    async with federation(n) as h:
        await h.wait_ml_loaded(180)     # the ML preload's seconds of CPU are not the sums'
        # warm-up, not timed: sessions open
        await fedpeer_sums(h, ENTRIES, 1, "pairwise")
        await asyncio.sleep(PROPOSAL_REFILL_MS / 1000)
        pids = [site.process.pid for site in h.sites]
        seconds: dict[str, list[float]] = {"ring": [], "pairwise": []}
        cpu: dict[str, list[float]] = {"ring": [], "pairwise": []}
        sum_cpu: dict[str, list[float]] = {"ring": [], "pairwise": []}
        for _ in range(repeats):          # the two modes alternate: the machine's load hits both
            for mode in seconds:
                before = cpu_s(pids)      # the whole job (proposal, sum, checks), all daemons
                seconds[mode] += await fedpeer_sums(h, ENTRIES, 1, mode, sum_cpu[mode])
                cpu[mode].append(cpu_s(pids) - before)
                await asyncio.sleep(PROPOSAL_REFILL_MS / 1000)   # members' proposal token bucket
        fed = {mode: _figures(v, cpu[mode], sum_cpu[mode]) for mode, v in seconds.items()}
    ref = {"lap": _figures(*await bare_ring(n, repeats, "none")),
           "lap_and_delivery": _figures(*await bare_ring(n, repeats, "star"))}
    ratios = {f"{mode}/{r}": {stat: fed[mode][f"{stat}_MiB_s"] / ref[r][f"{stat}_MiB_s"] for stat in ("best", "median")}
              for mode in fed for r in ref}
    return {"sites": n, "fedpeer": fed, "relay": ref, "ratios": ratios}


async def small_latency(n: int, count: int) -> dict:
    async with federation(n) as h:
        await h.wait_ml_loaded(180)     # the ML preload's seconds of CPU are not the sums'
        secs = await fedpeer_sums(h, 16, count, "pairwise")
    secs.sort()
    return {"sites": n, "sums": count, "p50_ms": 1000 * secs[len(secs) // 2],
            "p99_ms": 1000 * secs[min(len(secs) - 1, int(0.99 * len(secs)))]}


async def lag_during_sum(n: int, mib: int, mode: str) -> dict:
    """Event-loop lag of every daemon (status `loop_lag_ms`: the last LAG_WINDOW_S of 50 ms
    wake-ups, taken once the daemons' start has left that window, so the worst 1 % are the
    sum's) while one `mib` MiB secure sum runs; and whether any daemon saw a peer other than
    alive meanwhile (a false suspicion)."""
    async with federation(n) as h:
        # status' loop_lag_ms covers the last LAG_WINDOW_S: wait until the daemons' start (their
        # background import of the ML libraries holds the GIL for seconds) has left the window
        await h.wait_ml_loaded(180)     # the ML preload's seconds of CPU are not the sums'
        await asyncio.sleep(LAG_WINDOW_S + 1)
        job_id = await h.propose(0, "sumcheck", {"entries": mib * 2**17, "secure_sum": mode,
                                                 "chunk_entries": CHUNK_ENTRIES})
        not_alive: set[str] = set()
        while True:
            docs = await h.statuses()
            not_alive |= {f"{d['node']['name']} saw {p['name']} {p['state']}" for d in docs.values() if d
                          for p in d["peers"] if p["state"] != "alive"}
            record = await h.job(0, job_id)
            if record is not None and record["state"] in ("done", "failed", "cancelled"):
                break
            await asyncio.sleep(0.2)
        assert record["state"] == "done", record["error"]
        lags = [d["loop_lag_ms"] for d in (await h.statuses()).values()]
    return {"sites": n, "mib": mib, "mode": mode, "seconds": record["result"]["seconds"],
            "loop_lag_p99_ms": [lag["p99"] for lag in lags], "loop_lag_max_ms": [lag["max"] for lag in lags],
            "not_alive_seen": sorted(not_alive)}


async def main(rings: list[int], repeats: int, small: int, lag_mib: int) -> dict:
    out = {"throughput": [await ring(n, repeats) for n in rings]}
    if small:
        out["latency_16"] = await small_latency(5, small)
    if lag_mib:
        out["loop_lag"] = await lag_during_sum(3, lag_mib, "pairwise")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--rings", type=int, nargs="*", default=[3, 5, 9])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", type=int, default=50, help="16-entry sums for the latency figure")
    parser.add_argument("--lag-mib", type=int, default=64, help="event-loop lag during one sum of this size (0: skip)")
    args = parser.parse_args()
    result = asyncio.run(main(args.rings, args.repeats, args.small, args.lag_mib))
    targets = {"ring/lap": 0.3, "pairwise/lap": 0.2, "ring/lap_and_delivery": 0.7, "pairwise/lap_and_delivery": 0.7}
    for r in result["throughput"]:
        print(f"{r['sites']} daemons, 8 MiB, MiB/s best / median:")
        for name, fig in [*(("fedpeer " + k, v) for k, v in r["fedpeer"].items()),
                          *(("relay " + k, v) for k, v in r["relay"].items())]:
            sum_only = f", of the sums alone {fig['sum_cpu_ms_per_MiB']:.1f}" if "sum_cpu_ms_per_MiB" in fig else ""
            print(f"  {name:28s} {fig['best_MiB_s']:7.1f} / {fig['median_MiB_s']:7.1f}   "
                  f"(CPU of all processes: {fig['cpu_ms_per_MiB']:.1f} ms per MiB of vector, median{sum_only})")
        for name, ratio in r["ratios"].items():
            print(f"  ratio {name:22s} {ratio['best']:5.2f}x / {ratio['median']:5.2f}x (target >= {targets[name]}x)")
    lat = result.get("latency_16")
    if lat:
        print(f"16-entry secure sum over {lat['sites']} daemons ({lat['sums']} sums): p50 {lat['p50_ms']:.1f} ms, "
              f"p99 {lat['p99_ms']:.1f} ms")
    lag = result.get("loop_lag")
    if lag:
        print(f"{lag['mib']} MiB {lag['mode']} sum over {lag['sites']} daemons in {lag['seconds']:.1f} s: event-loop "
              f"lag p99 {lag['loop_lag_p99_ms']} ms, max {lag['loop_lag_max_ms']} ms (target p99 < 20 ms); "
              f"peers seen not alive: {lag['not_alive_seen'] or 'none'}")
    print(json.dumps(result))
