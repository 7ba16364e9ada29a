"""Secure-sum throughput and latency on real daemons, against plain bytes around the same ring.

fedpeer: the `sumcheck` job (a 1 Mi-entry uint64 vector = 8 MiB, secure-summed around N daemons,
with masks, signatures and encryption; the wall time is the job's own secure-sum time).
Reference, same run: N bare aiohttp relay processes in a ring; the first sends the same chunks
(same chunk size, same pipelining: each hop answers 204 and forwards in the background) and
times until every chunk came back. No masking, no crypto, no validation.
Also: p50/p99 latency of one secure sum of a 16-entry vector over 5 daemons.

Run: .venv/bin/python benchmarks/bench_securesum.py [--rings 3 5 9] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.harness import Harness, free_ports  # noqa: E402
from fedpeer.jobs.registry import PROPOSAL_REFILL_MS, PROPOSALS_BURST_MAX  # noqa: E402

ENTRIES = 1 << 20
CHUNK_ENTRIES = 65_536

RELAY = r"""
import asyncio, sys, time
import aiohttp
from aiohttp import web
me, nxt, chunks, chunk_bytes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
origin = sys.argv[5] == "origin"
state = {"back": 0, "done": None}
session = None
tasks = set()

async def forward(body):
    async with session.post(f"http://127.0.0.1:{nxt}/x", data=body) as r:
        assert r.status == 204

async def handle(request):
    body = await request.read()
    if origin:
        state["back"] += 1
        if state["back"] == chunks:
            state["done"].set()
    else:
        t = asyncio.create_task(forward(body)); tasks.add(t); t.add_done_callback(tasks.discard)
    return web.Response(status=204)

async def go(request):
    state["back"], state["done"] = 0, asyncio.Event()
    payload = bytes(chunk_bytes)
    t0 = time.perf_counter()
    for _ in range(chunks):
        await forward(payload)
    await state["done"].wait()
    return web.json_response({"seconds": time.perf_counter() - t0})

async def main():
    global session
    session = aiohttp.ClientSession()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/x", handle)
    app.router.add_post("/go", go)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", me).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def bare_ring(n: int, repeats: int) -> list[float]:
    ports = free_ports(n)
    chunks = ENTRIES // CHUNK_ENTRIES
    procs = [subprocess.Popen([sys.executable, "-c", RELAY, str(ports[i]), str(ports[(i + 1) % n]), str(chunks),
                               str(CHUNK_ENTRIES * 8), "origin" if i == 0 else "relay"]) for i in range(n)]
    try:
        out = []
        async with aiohttp.ClientSession() as s:
            for _ in range(200):          # the relays import aiohttp first: seconds on a loaded machine
                try:
                    async with s.get(f"http://127.0.0.1:{ports[-1]}/nothing"):
                        break
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            for _ in range(repeats):
                async with s.post(f"http://127.0.0.1:{ports[0]}/go") as r:
                    out.append((await r.json())["seconds"])
        return out
    finally:
        for p in procs:
            p.terminate()
            p.wait()


async def fedpeer_sums(h: Harness, entries: int, repeats: int, mode: str) -> list[float]:
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


async def ring(n: int, repeats: int) -> dict:
    async with federation(n) as h:
        fed = {mode: await fedpeer_sums(h, ENTRIES, repeats, mode) for mode in ("ring", "pairwise")}
    bare = await bare_ring(n, repeats)
    mib = ENTRIES * 8 / 2**20
    best = {k: mib / statistics.median(v) for k, v in fed.items()}
    bare_mib_s = mib / statistics.median(bare)
    return {"sites": n, "fedpeer_ring_MiB_s": best["ring"], "fedpeer_pairwise_MiB_s": best["pairwise"],
            "bare_MiB_s": bare_mib_s, "ratio_ring": best["ring"] / bare_mib_s,
            "ratio_pairwise": best["pairwise"] / bare_mib_s}


async def small_latency(n: int, count: int) -> dict:
    async with federation(n) as h:
        secs = await fedpeer_sums(h, 16, count, "pairwise")
    secs.sort()
    return {"sites": n, "sums": count, "p50_ms": 1000 * secs[len(secs) // 2],
            "p99_ms": 1000 * secs[min(len(secs) - 1, int(0.99 * len(secs)))]}


async def lag_during_sum(n: int, mib: int, mode: str) -> dict:
    """Event-loop lag of every daemon (status `loop_lag_ms`: the last 60 s of 50 ms wake-ups, so
    mostly the sum's own time) while one `mib` MiB secure sum runs; and whether any daemon saw a
    peer other than alive meanwhile (a false suspicion)."""
    async with federation(n) as h:
        await asyncio.sleep(2)
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--rings", type=int, nargs="*", default=[3, 5, 9])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", type=int, default=50, help="16-entry sums for the latency figure")
    parser.add_argument("--lag-mib", type=int, default=64, help="event-loop lag during one sum of this size (0: skip)")
    args = parser.parse_args()
    result = asyncio.run(main(args.rings, args.repeats, args.small, args.lag_mib))
    for r in result["throughput"]:
        print(f"{r['sites']} daemons, 8 MiB: fedpeer ring {r['fedpeer_ring_MiB_s']:.1f} MiB/s, pairwise "
              f"{r['fedpeer_pairwise_MiB_s']:.1f} MiB/s | plain relay {r['bare_MiB_s']:.1f} MiB/s | ratio "
              f"{r['ratio_ring']:.2f}x (ring), {r['ratio_pairwise']:.2f}x (pairwise) (target >= 0.6x)")
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
