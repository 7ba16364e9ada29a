"""The event-loop lag monitor (fedpeer/net/looplag.py): what `status` and /metrics show."""

from __future__ import annotations

import asyncio
import time

from fedpeer.net.looplag import LoopLag


def test_summary_quantiles_over_the_window():
    lag = LoopLag()
    assert lag.summary()["samples"] == 0 and lag.summary()["p99"] is None
    for v in [1.0] * 98 + [30.0, 200.0]:
        lag.record(v)
    s = lag.summary()
    assert (s["p50"], s["p99"], s["max"], s["samples"]) == (1.0, 200.0, 200.0, 100)
    for _ in range(5000):             # the window forgets, the worst ever does not
        lag.record(0.5)
    s = lag.summary()
    assert s["max"] == 0.5 and s["max_ever"] == 200.0 and s["samples"] == 1200


def test_a_blocked_loop_shows_as_lag():
    async def go() -> dict:
        lag = LoopLag()
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.12)
        time.sleep(0.15)              # what a 150 ms fsync or seal on the loop would do
        await asyncio.sleep(0.12)
        task.cancel()
        return lag.summary()

    s = asyncio.run(go())
    assert s["max"] >= 100, s
