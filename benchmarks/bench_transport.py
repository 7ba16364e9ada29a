"""Transport overhead: two real daemons vs a bare aiohttp POST of the same payload, same run.

fedpeer side: `fedpeer ping` timing inside daemon A: seal (encrypt + sign) -> HTTP POST ->
daemon B's whole gate (verify, decrypt, decode, replay, typed validation) -> 204.
Reference: a bare aiohttp client POSTs the same bytes to a bare aiohttp server process whose
handler reads the body and answers 204 — no signing, no encryption.
Batches are interleaved so both sides see the same machine load.

Run: .venv/bin/python benchmarks/bench_transport.py [--rounds 10]
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

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.harness import Harness, free_ports  # noqa: E402
from fedpeer.net import admin  # noqa: E402

BARE_SERVER = """
import sys
from aiohttp import web
async def handle(request):
    await request.read()
    return web.Response(status=204)
app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post("/x", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def bare_batch(session: aiohttp.ClientSession, port: int, payload: bytes, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        async with session.post(f"http://127.0.0.1:{port}/x", data=payload) as resp:
            assert resp.status == 204
        times.append((time.perf_counter() - started) * 1000)
    return times


async def fedpeer_batch(h: Harness, size: int, count: int) -> list[float]:
    doc = await admin.request(h.sites[0].config, "POST", "/v1/diag/ping",
                              {"peer": h.sites[1].name, "count": count, "payload_bytes": size}, timeout_ms=600_000)
    return doc["delivery_ms"]


async def measure(h: Harness, bare_port: int, size: int, count: int, rounds: int) -> tuple[list[float], list[float]]:
    fed, bare = [], []
    payload = bytes(size)
    async with aiohttp.ClientSession() as session:
        await bare_batch(session, bare_port, payload, 3)       # warm connections on both sides
        await fedpeer_batch(h, size, 3)
        for _ in range(rounds):
            fed += await fedpeer_batch(h, size, count)
            bare += await bare_batch(session, bare_port, payload, count)
    return fed, bare


async def main(rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), 2)
        h.create()
        (port,) = free_ports(1)
        bare = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(port)])
        h.start()
        try:
            await h.wait_all_alive(30)
            await asyncio.sleep(3)
            idle_rss = [rss_mib(s.process.pid) for s in h.sites]
            fed_s, bare_s = await measure(h, port, 64, 100, rounds)
            fed_l, bare_l = await measure(h, port, 1 << 20, 10, rounds)
            busy_rss = [rss_mib(s.process.pid) for s in h.sites]
        finally:
            h.stop()
            bare.terminate()
            bare.wait()
    mib_s = lambda ts: 1000 / statistics.mean(ts)  # noqa: E731  (1 MiB per message)
    return {
        "small_64B": {"fedpeer_p50_ms": pct(fed_s, .5), "fedpeer_p99_ms": pct(fed_s, .99),
                      "bare_p50_ms": pct(bare_s, .5), "bare_p99_ms": pct(bare_s, .99),
                      "overhead_p50": pct(fed_s, .5) / pct(bare_s, .5), "n": len(fed_s)},
        "large_1MiB": {"fedpeer_MiB_s": mib_s(fed_l), "bare_MiB_s": mib_s(bare_l),
                       "ratio": mib_s(fed_l) / mib_s(bare_l), "n": len(fed_l)},
        "rss_MiB": {"idle": idle_rss, "after_1MiB_traffic": busy_rss},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    result = asyncio.run(main(parser.parse_args().rounds))
    s, l = result["small_64B"], result["large_1MiB"]
    print(f"small 64 B : fedpeer p50 {s['fedpeer_p50_ms']:.3f} ms p99 {s['fedpeer_p99_ms']:.3f} ms | "
          f"bare p50 {s['bare_p50_ms']:.3f} ms p99 {s['bare_p99_ms']:.3f} ms | "
          f"overhead at p50 {s['overhead_p50']:.2f}x (target <= 1.3x)")
    print(f"large 1 MiB: fedpeer {l['fedpeer_MiB_s']:.1f} MiB/s | bare {l['bare_MiB_s']:.1f} MiB/s | "
          f"ratio {l['ratio']:.2f}x (target >= 0.75x)")
    print(f"daemon RSS : idle {', '.join(f'{r:.1f}' for r in result['rss_MiB']['idle'])} MiB (target < 150); "
          f"after 1 MiB traffic {', '.join(f'{r:.1f}' for r in result['rss_MiB']['after_1MiB_traffic'])} MiB")
    print(json.dumps(result))
