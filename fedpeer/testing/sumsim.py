"""One secure sum (fedpeer/protocols/securesum/api.py) over the in-memory network in virtual time
(looptime), with members that crash at seeded random moments: what the scale benchmark
(benchmarks/bench_sum_scale.py) and its small-n test (tests/sim/test_sum_scale.py) share.

Every member runs `secure_sum` in one process; a dropping member crashes (MemoryNetwork.crash:
its sends fail, messages to it are lost, the failure detector declares it dead `detect_ms`
later) and its coroutine is cancelled at a virtual time drawn uniformly from [0, drop_window_s):
so drops land anywhere in the protocol, in the ring lap, the seed round or the delivery.
Counts are of delivered messages and their frame bytes as the daemon would seal them
(`frame.pack` + `frame_bytes`), by sender."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum.api import SumChange, SumOutcome, SumRestart, secure_sum
from fedpeer.runtime.channel import RecvTimeout
from fedpeer.testing.memory import MemoryChannel, MemoryNetwork
from fedpeer.wire.frame import frame_bytes, pack

TAG = "scale"
U64 = 1 << 64


class SteadyChannel:
    """A MemoryChannel whose recv deadline is enforced by one asyncio timer.

    Works around a spin in channel.Mailbox.get under looptime: when `deadline - loop.time()` is
    a float remainder like 2e-15 s, its wait_for times out at once without the virtual clock
    moving, and it loops forever. Our timer fires 1 ms before the mailbox's own deadline."""

    def __init__(self, inner: MemoryChannel) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def recv(self, kind: type, tag: str, src: bytes | None = None, timeout_ms: int = 30_000) -> Any:
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await self.inner.recv(kind, tag, src, timeout_ms + 1)
        except TimeoutError:
            raise RecvTimeout(f"no {kind.__name__} '{tag}' within {timeout_ms} ms") from None


def sim_keys(n: int) -> list[bytes]:
    """n distinct sorted 32-byte member keys."""
    return sorted(hashlib.sha256(b"sumsim-%d" % i).digest() for i in range(n))


@dataclass(frozen=True)
class SumRun:
    n: int
    mode: str
    dropped: int                 # members crashed during the sum
    ok: bool                     # every surviving member returned the same exact total
    failed: int                  # surviving members that raised JobError (left out, or the sum failed)
    participants: int            # vectors in the total (0 if nobody got one)
    attempts: int                # attempts of the initiator that delivered (0 if none)
    messages: int                # delivered, all members
    bytes_mean: float            # frame bytes sent per member, mean over all members
    bytes_max: int               # ... by the member that sent most (the initiator)
    announce_bytes: int          # frame bytes of every re-run's announcements (SumRestart, SumChange), all senders
    virtual_s: float             # virtual time until the last survivor returned


def simulate_sum(n: int, *, mode: str = "ring", drop_fraction: float = 0.0, seed: int = 0,
                 length: int = 16, hop_timeout_ms: int = 1_000, attempts_max: int = 3,
                 drop_window_s: float | None = None, detect_ms: float = 500.0, compact: bool = False) -> SumRun:
    """One sum of `length`-entry random vectors over n members, round(n * drop_fraction) of them
    (any member, the initiator included) crashing at seeded random virtual times in
    [0, drop_window_s). By default the window is the time the same sum takes with no drops
    (one clean run first), so every drop lands inside the protocol. `compact`: the sum's compact
    messages (secure_sum's `compact`)."""
    import looptime

    from fedpeer.testing.members import close_loop

    keys = sim_keys(n)
    rng = random.Random(seed)
    gen = np.random.default_rng(seed)
    vectors = {k: gen.integers(0, U64, length, dtype=np.uint64) for k in keys}
    victims = rng.sample(keys, round(n * drop_fraction))
    if victims and drop_window_s is None:
        drop_window_s = simulate_sum(n, mode=mode, seed=seed, length=length, hop_timeout_ms=hop_timeout_ms,
                                     attempts_max=attempts_max, detect_ms=detect_ms, compact=compact).virtual_s
    crash_at = {k: rng.uniform(0.0, drop_window_s or 0.0) for k in victims}
    ended: dict[bytes, float] = {}

    async def go() -> dict[bytes, Any]:
        net = MemoryNetwork(keys, seed=seed, detect_ms=detect_ms)
        loop = asyncio.get_running_loop()

        async def one(node: bytes) -> SumOutcome:
            try:
                return await secure_sum(SteadyChannel(net.channel(node)), TAG, vectors[node], mode=mode,
                                        hop_timeout_ms=hop_timeout_ms, attempts_max=attempts_max,
                                        compact=compact)
            finally:
                ended[node] = loop.time()

        tasks = {k: asyncio.ensure_future(one(k)) for k in keys}

        def crash(node: bytes) -> None:
            net.crash(node)
            tasks[node].cancel()

        for node, at in crash_at.items():
            loop.call_at(at, crash, node)
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        net_sent.extend(net.sent)
        return dict(zip(keys, results))

    net_sent: list[tuple[bytes, bytes, object]] = []
    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        results = loop.run_until_complete(go())
    finally:
        close_loop(loop)
    return _judge(n, mode, vectors, victims, results, ended, net_sent)


def _judge(n: int, mode: str, vectors: dict[bytes, np.ndarray], victims: list[bytes], results: dict[bytes, Any],
           ended: dict[bytes, float], sent: list[tuple[bytes, bytes, object]]) -> SumRun:
    survivors = [k for k in results if k not in set(victims)]
    for k in survivors:
        r = results[k]
        if not isinstance(r, (SumOutcome, JobError)):
            raise AssertionError(f"member {k.hex()[:8]} ended with {r!r}")   # a bug, not a failed sum
    outcomes = [results[k] for k in survivors if isinstance(results[k], SumOutcome)]
    ok = len(outcomes) == len(survivors) and all(o == outcomes[0] for o in outcomes)
    if ok:
        first = outcomes[0]
        exact = [sum(int(vectors[p][i]) for p in first.participants) % U64 for i in range(len(first.total))]
        ok = first.total.tolist() == exact and set(survivors) <= set(first.participants)
    by_sender: Counter[bytes] = Counter()
    announce = 0
    for src, _, msg in sent:
        size = frame_bytes(len(pack(msg, job="job")))
        by_sender[src] += size
        if isinstance(msg, (SumRestart, SumChange)):
            announce += size
    return SumRun(n=n, mode=mode, dropped=len(victims), ok=ok,
                  failed=sum(isinstance(results[k], JobError) for k in survivors),
                  participants=len(outcomes[0].participants) if outcomes else 0,
                  attempts=max((o.attempts for o in outcomes), default=0), messages=len(sent),
                  bytes_mean=sum(by_sender.values()) / n, bytes_max=max(by_sender.values(), default=0),
                  announce_bytes=announce,
                  virtual_s=max((ended[k] for k in survivors), default=0.0))
