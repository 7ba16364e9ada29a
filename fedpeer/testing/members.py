"""Run one job's members in one process over the in-memory network, in virtual time (looptime):
the harness the job simulations share (xgboost histogram mode, logreg / fedavg / mlp, clustering),
and a member whose contributions to the secure sums are poisoned."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from unittest import mock

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
        close_loop(loop)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what still runs on `loop` (sends a secure sum left going out, say), let it end, and
    close the loop, as asyncio.run does."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


def after_step(step: int) -> Callable[[MemoryNetwork], bool]:
    """A `crash` condition: some member has reported progress step `step`."""
    return lambda net: any(s >= step for _, _, s, _ in net.progress_log)


@contextlib.contextmanager
def poisoned_sums(module: Any, victim: bytes,
                  poison: Callable[[str, Any], Any]) -> Iterator[list[str]]:
    """Member `victim`'s contribution to every secure sum `module` starts (through its name
    `secure_sum`) passes through `poison(tag, vector)` first, as a lying or broken member would
    send it; yields the tags it poisoned. Other members' contributions are untouched."""
    real = module.secure_sum
    poisoned: list[str] = []

    async def secure_sum(ch: Any, tag: str, vector: Any, *args: Any, **kw: Any) -> Any:
        if ch.me == victim:
            changed = poison(tag, vector)
            if changed is not None:
                poisoned.append(tag)
                vector = changed
        return await real(ch, tag, vector, *args, **kw)

    with mock.patch.object(module, "secure_sum", secure_sum):
        yield poisoned


def poison_entry(vector: Any, at: float, floats: int, limbs: int, amount: int, counts_first: int = 0) -> Any:
    """`vector` (uint64, a secure sum's contribution: `floats` fixed-point values of `limbs` limbs
    each, then counts; with `counts_first`, that many counts before them) with the entry at
    fraction `at` of its values changed as no honest member changes it: a value's top limb plus
    amount mod 2^32 (a fixed-point extreme: 2^31 swaps the sign of the largest magnitude), or a
    count plus `amount` mod 2^64 (huge, or wrapped below zero)."""
    import numpy as np

    out = np.array(vector, dtype=np.uint64, copy=True)
    counts = len(out) - floats * limbs
    entry = min(int(at * (floats + counts)), floats + counts - 1)
    if counts_first <= entry < counts_first + floats:
        i = counts_first + (entry - counts_first) * limbs + limbs - 1
        out[i] = (out[i] + np.uint64(amount % (1 << 32) or 1)) & np.uint64(0xFFFFFFFF)
    else:
        i = entry if entry < counts_first else entry + floats * (limbs - 1)
        out[i] += np.uint64(amount % (1 << 64))
    return out


class TwoFaced:
    """A member's channel that sends one peer (`victim`) the messages `pick` selects with their
    first array entry one higher than everyone else gets them: the two-faced member whose
    digests the all-reduce, the all-to-all and the reduce-map must catch."""

    def __init__(self, inner: Any, victim: bytes, pick: Callable[[Any], bool]) -> None:
        self.inner, self.victim, self.pick = inner, victim, pick

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        if dst == self.victim and self.pick(msg) and len(msg.data):
            data = msg.data.copy()
            data[0] += data.dtype.type(1)
            msg = dataclasses.replace(msg, data=data)
        return await self.inner.send(dst, msg)

