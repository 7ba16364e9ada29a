"""What the peer server admits, and how much of it (fedpeer/net/server.py uses them): its books of
connections (all, and those not yet authenticated, by address), byte budgets counted like a
semaphore, and the budgets of session handshakes (by address prefix, by key, node-wide). No sockets here: the server
asks these before it reads, and tells them what it closed."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["HELLO_BURST_NODE", "HELLO_BURST_PER_IP", "HELLO_BURST_PER_KEY", "HELLO_RATE_IPS_MAX",
           "HELLO_RATE_NODE_PER_S", "HELLO_RATE_PER_IP_PER_S", "HELLO_RATE_PER_KEY_PER_S", "Books", "ByteBudget",
           "Conn", "HelloRate", "TokenBuckets", "address_prefix"]

HELLO_RATE_PER_IP_PER_S = 10.0         # session handshakes one address prefix may open per second, sustained ...
HELLO_BURST_PER_IP = 40                # ... and at once (a restarted site opens one per peer: far fewer), or
                                       # one per member when there are more (HelloRate.fit_members)
HELLO_RATE_IPS_MAX = 4096              # address prefixes whose rate is tracked; beyond, new ones share one bucket
IPV4_PREFIX_BITS = 24                  # an IPv4 address counts with its /24 (one host often holds a few) ...
IPV6_PREFIX_BITS = 64                  # ... an IPv6 address with its /64 (one host may hold all of it)
HELLO_RATE_PER_KEY_PER_S = 2.0         # full handshakes (signature check, key exchange) under one member's key,
HELLO_BURST_PER_KEY = 20               # per second and at once: a member renews each session every 2 minutes
HELLO_RATE_NODE_PER_S = 50.0           # full handshakes of all keys together, per second ...
HELLO_BURST_NODE = 200                 # ... and at once (every member restarting together: one each)
OVERFLOW_BUCKET = "overflow"           # the bucket prefixes share while the table is full of active ones


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


def address_prefix(ip: str) -> str:
    """The prefix an address's handshakes are counted under: its /24 (IPv4; an IPv4-mapped IPv6
    address too) or its /64 (IPv6); an address that does not parse counts as itself."""
    try:
        addr = ipaddress.ip_address(ip.partition("%")[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    bits = IPV4_PREFIX_BITS if addr.version == 4 else IPV6_PREFIX_BITS
    return str(ipaddress.ip_network((addr, bits), strict=False))


class TokenBuckets:
    """A token bucket per key (`rate` per second, `burst` at once), at most `keys_max` of them.
    A bucket is forgotten only once it has refilled (forgetting it then gives nothing back); while
    every tracked bucket is in use, a new key shares one overflow bucket, so coming back after
    many others never buys a fresh burst. `now_s`: monotonic seconds."""

    def __init__(self, rate_per_s: float, burst: int, keys_max: int) -> None:
        self.rate, self.burst, self.keys_max = rate_per_s, burst, keys_max
        self._buckets: dict[object, tuple[float, float]] = {}    # key -> (tokens, when), oldest use first

    def allow(self, key: object, now_s: float) -> bool:
        if key not in self._buckets and len(self._buckets) >= self.keys_max and not self._forget_refilled(now_s):
            key = OVERFLOW_BUCKET
        tokens, then = self._buckets.pop(key, (float(self.burst), now_s))
        tokens = min(float(self.burst), tokens + max(0.0, now_s - then) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now_s)   # re-inserted: the newest
        return allowed

    def _forget_refilled(self, now_s: float) -> bool:
        """Drop the stalest bucket if it is full again (as good as none); False if it is not."""
        key = next(iter(self._buckets))
        tokens, then = self._buckets[key]
        if tokens + (now_s - then) * self.rate < self.burst:
            return False
        del self._buckets[key]
        return True


class HelloRate:
    """The budgets of session handshakes. `allow(ip)`: a token bucket per address prefix, asked
    before any cryptography, so a flood of hellos — replayed or forged — costs a counter, not a
    signature check and a key exchange each, on the event loop ("hello_rate", HTTP 429).
    `allow_key(sender)`: a bucket per member key and one for the node, asked once a hello's tag
    under the pair's static key has verified and it is no replay (fedpeer/wire/session.py) — the
    first point where the key is proven (so a stranger cannot spend a member's budget) and the
    last before the signature check and key exchange it bounds. `now_s`: monotonic seconds."""

    def __init__(self, rate_per_s: float = HELLO_RATE_PER_IP_PER_S, burst: int = HELLO_BURST_PER_IP,
                 ips_max: int = HELLO_RATE_IPS_MAX, key_rate_per_s: float = HELLO_RATE_PER_KEY_PER_S,
                 key_burst: int = HELLO_BURST_PER_KEY, node_rate_per_s: float = HELLO_RATE_NODE_PER_S,
                 node_burst: int = HELLO_BURST_NODE) -> None:
        self._prefixes = TokenBuckets(rate_per_s, burst, ips_max)
        self._prefix_burst_min = burst
        self._keys = TokenBuckets(key_rate_per_s, key_burst, ips_max)   # bounded by the allowlist anyway
        self._node = TokenBuckets(node_rate_per_s, node_burst, 1)

    def fit_members(self, members: int) -> None:
        """A federation of `members` sites: an address prefix may open one hello per member at
        once (at least the burst it was made with: HELLO_BURST_PER_IP). One prefix can hold every
        member (one host runs the federation, as `fedpeer harness` does: 100 sites on 127.0.0.1;
        a lab's rack in one /24), and all of them start and say hello together. A stranger's
        hellos from that prefix then cost at most that many more tag checks at once: the per-key
        and node-wide budgets still bound the signature checks and key exchanges."""
        self._prefixes.burst = max(self._prefix_burst_min, members)

    def allow(self, ip: str, now_s: float) -> bool:
        return self._prefixes.allow(address_prefix(ip), now_s)

    def allow_key(self, sender: bytes, now_s: float) -> bool:
        """A full handshake under `sender`'s (verified) key: its own budget, then the node's."""
        return self._keys.allow(sender, now_s) and self._node.allow(None, now_s)
