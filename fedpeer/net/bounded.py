"""Bounds for the local listeners (the daemon's TCP admin API and /metrics, and `fedpeer console`),
like the peer port's; the three are served through this module and share every rule below.

Any local user can open connections to a loopback port. Without bounds, one holding thousands of
idle connections made the daemon hold as many descriptors and `fedpeer status` wait seconds or
time out; one holding 64 request heads it never finished held every slot, and 59 of 64 operator
requests were refused. So each listener keeps at most LOCAL_CONNECTIONS_MAX connections (counted
in FDS_RESERVED, fedpeer/net/http1.py); a connection must have sent its whole request head (up
to the blank line) within REQUEST_HEAD_MS of being accepted, silent or not, or it is closed; and a
new connection at the cap sheds the oldest connection whose head has not ended (an honest client
writes its head at once, so what is shed is waiting on its client, never on us), or is closed
itself if every connection holds a request being answered. Each connection carries one request:
every answer says `Connection: close` (`local_runner`), so a connection is only ever waiting for
its head or being answered, never idle between requests.
"""

from __future__ import annotations

import asyncio
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from fedpeer.net.http1 import END_OF_HEAD

LOCAL_CONNECTIONS_MAX = 16        # per local listener (admin, metrics, console): within FDS_RESERVED
REQUEST_HEAD_MS = 4_000           # from accept to a request head's blank line, or the connection is closed
HEAD_PEEK_BYTES = 16 * 1024       # what a new connection's socket is peeked for a whole head (a CLI's is ~200)
LOCAL_KEEPALIVE_S = 5.0           # aiohttp's keepalive_timeout: unused while every answer closes, kept as a bound


def local_runner(app: web.Application) -> web.AppRunner:
    """The AppRunner of a local listener: no access log, no signal handlers, one request per
    connection (every answer closes it). Serve it with `serve`."""
    app.on_response_prepare.append(_close_after)
    return web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=LOCAL_KEEPALIVE_S)


async def _close_after(request: web.Request, response: web.StreamResponse) -> None:
    response.force_close()                  # the connection ends after this answer ...
    response.headers["Connection"] = "close"    # ... and the answer says so (its headers are not yet sent)


class Bounded:
    """A protocol factory around `factory` (an aiohttp web.Server) that enforces the bounds above."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limit: int = LOCAL_CONNECTIONS_MAX,
                 head_ms: int = REQUEST_HEAD_MS) -> None:
        self.factory, self.limit, self.head_ms = factory, limit, head_ms
        self.live: set[Any] = set()                           # transports counted against the cap
        # connections whose request head has not ended (silent ones too), oldest first, with the
        # timer that closes them at their deadline
        self.waiting: OrderedDict[Any, asyncio.TimerHandle] = OrderedDict()
        self.refused = 0                                      # connections closed at once (cap, all answering)
        self.shed = 0                                         # waiting connections closed to make room
        self.expired = 0                                      # waiting connections closed at their deadline

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self, self.factory())

    def _head_ended(self, transport: Any) -> None:
        timer = self.waiting.pop(transport, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, transport: Any) -> None:
        if self.waiting.pop(transport, None) is not None:
            self.expired += 1
        self.live.discard(transport)
        transport.abort()

    def _shed_oldest(self) -> bool:
        if not self.waiting:
            return False
        transport, timer = self.waiting.popitem(last=False)
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


def _head_arrived(transport: Any) -> bool:
    """Whether a whole request head already waits in the socket (peeked, not read): an honest
    client writes its head with its connect, so its connection is never among those a flood of
    newcomers accepted in the same batch may shed."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    peek = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.fileno())
    try:
        return END_OF_HEAD in peek.recv(HEAD_PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    finally:
        peek.detach()        # the descriptor stays the transport's


class _Guarded(asyncio.Protocol):
    """One connection: counted, timed until its request head has ended (its blank line seen), and
    everything passed to `inner` (aiohttp's request handler, whose slots forbid wrapping its
    methods in place)."""

    def __init__(self, bound: Bounded, inner: asyncio.Protocol) -> None:
        self.bound, self.inner = bound, inner
        self.transport: Any = None
        self._tail = b""       # the head's last bytes so far: its blank line may span two reads

    def connection_made(self, transport: Any) -> None:
        bound = self.bound
        if len(bound.live) >= bound.limit and not bound._shed_oldest():
            bound.refused += 1
            transport.abort()
            return
        self.transport = transport
        bound.live.add(transport)
        if not _head_arrived(transport):
            bound.waiting[transport] = asyncio.get_running_loop().call_later(
                bound.head_ms / 1000, bound._expire, transport)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport in self.bound.waiting:
            seen = self._tail + data     # a local request's reads are small: the copy costs little
            if END_OF_HEAD in seen:
                self.bound._head_ended(self.transport)
                self._tail = b""
            else:
                self._tail = seen[-(len(END_OF_HEAD) - 1):]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.transport is not None else None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.transport is None:
            return                      # refused at connection_made: the server never saw it
        self.bound._head_ended(self.transport)
        self.bound.live.discard(self.transport)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
