"""What the peer server admits, and how much of it (fedpeer/net/server.py uses them): its books of
connections (all, and those not yet authenticated, by address), byte budgets counted like a
semaphore, and a per-address token bucket for session handshakes. No sockets here: the server
asks these before it reads, and tells them what it closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["HELLO_BURST_PER_IP", "HELLO_RATE_IPS_MAX", "HELLO_RATE_PER_IP_PER_S", "Books", "ByteBudget", "Conn",
           "HelloRate"]

HELLO_RATE_PER_IP_PER_S = 10.0         # session handshakes one address may open per second, sustained ...
HELLO_BURST_PER_IP = 40                # ... and at once (a restarted site opens one per peer: far fewer)
HELLO_RATE_IPS_MAX = 4096              # addresses whose handshake rate is tracked (the stalest dropped)


class Conn(Protocol):
    """A connection as the books see it: its address, and its sender once a header verified."""

    ip: str
    sender: bytes | None


@dataclass
class Books:
    """Who holds which connection: the budgets the server enforces."""

    conns: dict[Conn, None] = field(default_factory=dict)            # insertion order = age
    unverified: dict[Conn, None] = field(default_factory=dict)
    unverified_by_ip: Counter[str] = field(default_factory=Counter)

    def add(self, conn: Conn) -> None:
        self.conns[conn] = None
        self.unverified[conn] = None
        self.unverified_by_ip[conn.ip] += 1

    def verify(self, conn: Conn, sender: bytes) -> None:
        # counted down once: a connection evicted meanwhile (remove) has already left the counts
        if conn.sender is None and self.unverified.pop(conn, 0) is None:
            self._drop_ip(conn.ip)
        conn.sender = sender

    def remove(self, conn: Conn) -> None:
        self.conns.pop(conn, None)
        if self.unverified.pop(conn, 0) is None:
            self._drop_ip(conn.ip)

    def _drop_ip(self, ip: str) -> None:
        self.unverified_by_ip[ip] -= 1
        if self.unverified_by_ip[ip] <= 0:
            del self.unverified_by_ip[ip]

    def oldest_unverified(self, ip: str | None = None) -> Conn | None:
        """The oldest unauthenticated connection from `ip`, or from the busiest address."""
        if ip is None and self.unverified_by_ip:
            ip = self.unverified_by_ip.most_common(1)[0][0]
        return next((c for c in self.unverified if c.ip == ip), None)


class ByteBudget:
    """An asyncio semaphore counted in bytes (first come, first served)."""

    def __init__(self, total: int) -> None:
        self.total, self._free = total, total
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        n = min(n, self.total)      # a frame larger than the budget waits for all of it
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= n)
            self._free -= n
        try:
            yield
        finally:
            async with self._changed:
                self._free += n
                self._changed.notify_all()


class HelloRate:
    """A token bucket per address for session handshakes: a hello beyond it is refused ("hello_rate",
    HTTP 429) before any cryptography, so a flood of hellos — replayed or forged — costs a counter,
    not a signature check and a key exchange each, on the event loop. `now_s`: monotonic seconds."""

    def __init__(self, rate_per_s: float = HELLO_RATE_PER_IP_PER_S, burst: int = HELLO_BURST_PER_IP,
                 ips_max: int = HELLO_RATE_IPS_MAX) -> None:
        self.rate, self.burst, self.ips_max = rate_per_s, burst, ips_max
        self._buckets: dict[str, tuple[float, float]] = {}    # ip -> (tokens, when), oldest use first

    def allow(self, ip: str, now_s: float) -> bool:
        tokens, then = self._buckets.pop(ip, (float(self.burst), now_s))
        tokens = min(float(self.burst), tokens + (now_s - then) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[ip] = (tokens - 1.0 if allowed else tokens, now_s)   # re-inserted: the newest
        while len(self._buckets) > self.ips_max:
            del self._buckets[next(iter(self._buckets))]
        return allowed
