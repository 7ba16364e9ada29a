"""Bounds for the daemon's local listeners (the TCP admin API, /metrics), like the peer port's.

Any local user can open connections to a loopback port. Without bounds, one holding thousands of
idle connections made the daemon hold as many descriptors and `fedpeer status` wait seconds or
time out. So each listener keeps at most LOCAL_CONNECTIONS_MAX connections (counted in
FDS_RESERVED, fedpeer/net/http1.py); a connection must send its first bytes within
FIRST_BYTES_MS or it is closed; and a new connection at the cap sheds the oldest one that has
sent nothing yet (an honest client writes its request at once), or is closed itself if every
connection is busy. After a request, the HTTP server's keep-alive timeout closes an idle
connection (LOCAL_KEEPALIVE_S).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

LOCAL_CONNECTIONS_MAX = 16        # per local listener (admin, metrics): within FDS_RESERVED
FIRST_BYTES_MS = 2_000            # a connection that sends nothing for this long is closed
LOCAL_KEEPALIVE_S = 5.0           # an idle connection after a request (aiohttp's keepalive_timeout)


class Bounded:
    """A protocol factory around `factory` (an aiohttp web.Server) that enforces the bounds above."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limit: int = LOCAL_CONNECTIONS_MAX,
                 first_bytes_ms: int = FIRST_BYTES_MS) -> None:
        self.factory, self.limit, self.first_bytes_ms = factory, limit, first_bytes_ms
        self.live: set[Any] = set()                           # transports counted against the cap
        self.silent: OrderedDict[Any, asyncio.TimerHandle] = OrderedDict()   # sent nothing yet, oldest first
        self.refused = 0                                      # connections closed at once (cap, all busy)
        self.shed = 0                                         # silent connections closed to make room

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self, self.factory())

    def _heard(self, transport: Any) -> None:
        timer = self.silent.pop(transport, None)
        if timer is not None:
            timer.cancel()

    def _close_silent(self, transport: Any) -> None:
        self.silent.pop(transport, None)
        self.live.discard(transport)
        transport.abort()

    def _shed_oldest(self) -> bool:
        if not self.silent:
            return False
        transport, timer = self.silent.popitem(last=False)
        timer.cancel()
        self.live.discard(transport)        # no longer counted: its connection_lost comes later
        self.shed += 1
        transport.abort()
        return True


async def serve(runner: Any, *, sock: Any = None, host: str | None = None, port: int | None = None,
                limit: int = LOCAL_CONNECTIONS_MAX) -> tuple[asyncio.Server, Bounded]:
    """Serve an aiohttp AppRunner (set up with keepalive_timeout=LOCAL_KEEPALIVE_S) through Bounded,
    on a bound socket or a host and port. Close the returned server before the runner's cleanup."""
    bounded = Bounded(runner.server, limit)
    loop = asyncio.get_running_loop()
    if sock is not None:
        server = await loop.create_server(bounded, sock=sock)
    else:
        server = await loop.create_server(bounded, host, port, reuse_address=True)
    return server, bounded


async def close(server: asyncio.Server | None, runner: Any) -> None:
    """Stop a listener made by `serve`: no new connections, then the runner's own shutdown."""
    if server is not None:
        server.close()
    if runner is not None:
        await runner.cleanup()


class _Guarded(asyncio.Protocol):
    """One connection: counted, timed until its first bytes, then everything passed to `inner`
    (aiohttp's request handler, whose slots forbid wrapping its methods in place)."""

    def __init__(self, bound: Bounded, inner: asyncio.Protocol) -> None:
        self.bound, self.inner = bound, inner
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        bound = self.bound
        if len(bound.live) >= bound.limit and not bound._shed_oldest():
            bound.refused += 1
            transport.abort()
            return
        self.transport = transport
        bound.live.add(transport)
        bound.silent[transport] = asyncio.get_running_loop().call_later(
            bound.first_bytes_ms / 1000, bound._close_silent, transport)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.bound._heard(self.transport)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.transport is not None else None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.transport is None:
            return                      # refused at connection_made: the server never saw it
        self.bound._heard(self.transport)
        self.bound.live.discard(self.transport)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
