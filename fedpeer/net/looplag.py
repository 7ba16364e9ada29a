"""Event-loop lag: how late a periodic wake-up runs — the time every message, heartbeat and
`fedpeer status` waited behind whatever held the loop (crypto, numpy, fsync). Shown in `status`
(`loop_lag_ms`: p50, p99, max over the last LAG_WINDOW_S) and as /metrics'
fedpeer_loop_lag_seconds, so an operator (and the benchmarks) can see it (p99 < 20 ms
while a 64 MiB secure sum runs)."""

from __future__ import annotations

import asyncio
import collections

LAG_INTERVAL_MS = 50            # one wake-up per interval
LAG_WINDOW_S = 60               # the summary covers this many seconds of wake-ups
_SAMPLES_MAX = LAG_WINDOW_S * 1000 // LAG_INTERVAL_MS


class LoopLag:
    def __init__(self) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=_SAMPLES_MAX)
        self.worst_ms = 0.0            # since the daemon started

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = LAG_INTERVAL_MS / 1000
        while True:
            started = loop.time()
            await asyncio.sleep(interval_s)
            self.record(max(0.0, (loop.time() - started - interval_s) * 1000))

    def record(self, lag_ms: float) -> None:
        self.samples.append(lag_ms)
        self.worst_ms = max(self.worst_ms, lag_ms)

    def summary(self) -> dict:
        """{"p50", "p99", "max"} over the window (ms, rounded to 0.1), "max_ever", "samples"."""
        ordered = sorted(self.samples)
        if not ordered:
            return {"p50": None, "p99": None, "max": None, "max_ever": None, "samples": 0}

        def at(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 1), "max_ever": round(self.worst_ms, 1),
                "samples": len(ordered)}
