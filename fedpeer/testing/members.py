"""Run one job's members in one process over the in-memory network, in virtual time (looptime):
the harness the job simulations share (xgboost histogram mode, logreg / fedavg / mlp, clustering)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from fedpeer.testing.memory import MemoryNetwork


def member_keys(prefix: str, n: int) -> tuple[list[bytes], dict[bytes, str]]:
    """n sorted keys (ring order) and their names site-1..site-n."""
    keys = sorted(hashlib.sha256(f"{prefix}-{i}".encode()).digest() for i in range(n))
    return keys, {k: f"site-{i + 1}" for i, k in enumerate(keys)}


def run_members(keys: list[bytes], member: Callable[[MemoryNetwork, int, bytes], Awaitable[Any]],
                crash: Callable[[MemoryNetwork], bool] | None = None, victim: int = 1,
                **network: Any) -> list[Any]:
    """Every member's result (or exception): `member(net, i, key)` is member i's job coroutine.
    With `crash`, member `victim` crashes as soon as crash(net) holds (e.g. on net.progress_log)."""
    import looptime

    async def go() -> list:
        net = MemoryNetwork(keys, seed=0, **network)
        jobs = [member(net, i, k) for i, k in enumerate(keys)]

        async def crasher() -> None:
            assert crash is not None
            while not crash(net):   # noqa: ASYNC110  (polls a condition on the network; nothing to wait on)
                await asyncio.sleep(0.001)
            net.crash(keys[victim])

        watcher = asyncio.ensure_future(crasher()) if crash is not None else None
        try:
            return await asyncio.gather(*jobs, return_exceptions=True)
        finally:
            if watcher is not None:
                watcher.cancel()

    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


def after_step(step: int) -> Callable[[MemoryNetwork], bool]:
    """A `crash` condition: some member has reported progress step `step`."""
    return lambda net: any(s >= step for _, _, s, _ in net.progress_log)
