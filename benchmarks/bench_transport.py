"""Transport overhead: two real daemons vs a bare aiohttp POST of the same payload, same run.

fedpeer side: `fedpeer ping` timing inside daemon A: seal (session AEAD) -> HTTP POST (our own
client and server, fedpeer/net/client.py and server.py) -> daemon B's whole gate (header tag, AEAD
open, decode, replay window, typed validation) -> 204. The probe's payload travels in the frame's
raw tail and arrives as a view of the decrypted frame (no copy into `bytes`).
Reference: a bare aiohttp client POSTs the same bytes to a bare aiohttp server process whose
handler reads the body and answers 204 — no encryption, no checks.
Batches are interleaved so both sides see the same machine load; each round gives one ratio, and
the report shows the median and the best of them (64 B: p50 latency; 192 KiB, 1 and 8 MiB:
throughput).
CPU: on-CPU time of both daemons' threads (/proc/PID/task/*/schedstat) over each fedpeer batch —
per POST for the small messages (and a rate batch of --rate-count 64 B probes per round), per MiB
for the large ones; the daemons' CPU only, not the bare server's.

Run: .venv/bin/python benchmarks/bench_transport.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness, free_ports  # noqa: E402
from fedpeer.daemon import admin  # noqa: E402

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


CPU_PIDS: list[int] = []   # the two daemons


def cpu_seconds(pids: list[int]) -> float:
    """On-CPU time of these processes' threads so far, from the scheduler's nanoseconds
    (/proc/PID/task/TID/schedstat; /proc/PID/stat counts 10 ms ticks: too coarse for a batch)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):   # a thread that just ended
                pass
    return total / 1e9


async def fedpeer_batch(h: Harness, size: int, count: int, cpu_s: list[float] | None = None) -> list[float]:
    """`count` probes from site 0 to site 1; appends the daemons' CPU seconds over it to `cpu_s`."""
    before = cpu_seconds(CPU_PIDS)
    doc = await admin.request(h.sites[0].config, "POST", "/v1/diag/ping",
                              {"peer": h.sites[1].name, "count": count, "payload_bytes": size}, timeout_ms=600_000)
    if cpu_s is not None:
        cpu_s.append(cpu_seconds(CPU_PIDS) - before)
    return doc["delivery_ms"]


Rounds = list[tuple[list[float], list[float], float]]   # per round: (fedpeer times, bare times ms, daemons' CPU s)


async def measure(h: Harness, bare_port: int, size: int, count: int, rounds: int) -> Rounds:
    """`rounds` pairs of batches (fedpeer, bare), interleaved: one ratio per round."""
    out = []
    payload = bytes(size)
    async with aiohttp.ClientSession() as session:
        await bare_batch(session, bare_port, payload, 3)       # warm connections on both sides
        await fedpeer_batch(h, size, 3)
        for _ in range(rounds):
            cpu_s: list[float] = []
            fed = await fedpeer_batch(h, size, count, cpu_s)
            out.append((fed, await bare_batch(session, bare_port, payload, count), cpu_s[0]))
    return out


async def rate(h: Harness, count: int, rounds: int) -> dict:
    """CPU of both daemons per 64 B POST, and POSTs per second, over `rounds` batches of `count`."""
    per_post_us, per_s = [], []
    await fedpeer_batch(h, 64, 3)
    for _ in range(rounds):
        cpu_s: list[float] = []
        times = await fedpeer_batch(h, 64, count, cpu_s)
        per_post_us.append(1e6 * cpu_s[0] / count)
        per_s.append(1000 * count / sum(times))
    return {"cpu_us_per_post_best": min(per_post_us), "cpu_us_per_post_median": statistics.median(per_post_us),
            "posts_per_s_median": statistics.median(per_s), "n": count * rounds}


def latency(rounds: Rounds) -> dict:
    ratios = [pct(f, .5) / pct(b, .5) for f, b, _ in rounds]
    fed, bare = [t for f, _, _ in rounds for t in f], [t for _, b, _ in rounds for t in b]
    return {"fedpeer_p50_ms": pct(fed, .5), "fedpeer_p99_ms": pct(fed, .99), "bare_p50_ms": pct(bare, .5),
            "bare_p99_ms": pct(bare, .99), "ratio_median": statistics.median(ratios), "ratio_best": min(ratios),
            "cpu_us_per_post": 1e6 * sum(c for _, _, c in rounds) / len(fed), "n": len(fed)}


def throughput(rounds: Rounds, mib: float) -> dict:
    rate = lambda ts: mib * 1000 / statistics.mean(ts)  # noqa: E731
    ratios = [rate(f) / rate(b) for f, b, _ in rounds]
    cpu_ms_per_mib = [1000 * c / (mib * len(f)) for f, _, c in rounds]
    return {"fedpeer_MiB_s": statistics.median(rate(f) for f, _, _ in rounds),
            "bare_MiB_s": statistics.median(rate(b) for _, b, _ in rounds),
            "ratio_median": statistics.median(ratios), "ratio_best": max(ratios),
            "cpu_ms_per_mib_best": min(cpu_ms_per_mib), "cpu_ms_per_mib_median": statistics.median(cpu_ms_per_mib),
            "n": sum(len(f) for f, _, _ in rounds)}


async def main(rounds: int, rate_count: int) -> dict:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), 2)
        h.create()
        (port,) = free_ports(1)
        bare = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(port)])
        h.start()
        try:
            await h.wait_all_alive(30)
            await asyncio.sleep(3)
            CPU_PIDS[:] = [s.process.pid for s in h.sites]
            idle_rss = [rss_mib(s.process.pid) for s in h.sites]
            small = await measure(h, port, 64, 100, rounds)
            small_rate = await rate(h, rate_count, rounds)
            mid = await measure(h, port, 192 << 10, 40, rounds)   # a histogram all-reduce's typical frame
            large = await measure(h, port, 1 << 20, 10, rounds)
            huge = await measure(h, port, 8 << 20, 4, rounds)
            busy_rss = [rss_mib(s.process.pid) for s in h.sites]
        finally:
            h.stop()
            bare.terminate()
            bare.wait()
    return {"small_64B": latency(small), "small_64B_rate": small_rate, "mid_192KiB": throughput(mid, 0.1875),
            "large_1MiB": throughput(large, 1),
            "large_8MiB": throughput(huge, 8),
            "rss_MiB": {"idle": idle_rss, "after_large_traffic": busy_rss},
            "load_average": {"before": load_before, "after": os.getloadavg()}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved batch pairs per size (one ratio each)")
    parser.add_argument("--rate-count", type=int, default=2000, help="64 B probes per round of the CPU-per-POST batch")
    args = parser.parse_args()
    result = asyncio.run(main(args.rounds, args.rate_count))
    s = result["small_64B"]
    print(f"small 64 B : fedpeer p50 {s['fedpeer_p50_ms']:.3f} ms p99 {s['fedpeer_p99_ms']:.3f} ms | "
          f"bare p50 {s['bare_p50_ms']:.3f} ms p99 {s['bare_p99_ms']:.3f} ms | "
          f"p50 ratio median {s['ratio_median']:.2f}x, best {s['ratio_best']:.2f}x (target <= 1.4x)")
    r = result["small_64B_rate"]
    print(f"small 64 B : CPU of both daemons per POST best {r['cpu_us_per_post_best']:.0f} us, "
          f"median {r['cpu_us_per_post_median']:.0f} us; {r['posts_per_s_median']:.0f} POSTs/s one at a time")
    for key, label in (("mid_192KiB", "192 KiB"), ("large_1MiB", "1 MiB"), ("large_8MiB", "8 MiB")):
        r = result[key]
        print(f"{label:>7}: fedpeer {r['fedpeer_MiB_s']:.1f} MiB/s | bare {r['bare_MiB_s']:.1f} MiB/s | "
              f"ratio median {r['ratio_median']:.2f}x, best {r['ratio_best']:.2f}x (target >= 0.6x) | "
              f"CPU of both daemons per MiB best {r['cpu_ms_per_mib_best']:.2f} ms, "
              f"median {r['cpu_ms_per_mib_median']:.2f} ms")
    print(f"daemon RSS : idle {', '.join(f'{r:.1f}' for r in result['rss_MiB']['idle'])} MiB; "
          f"after the large messages {', '.join(f'{r:.1f}' for r in result['rss_MiB']['after_large_traffic'])} MiB")
    print(f"load average: before {result['load_average']['before'][0]:.2f}, "
          f"after {result['load_average']['after'][0]:.2f} (1 min)")
    print(json.dumps(result))
