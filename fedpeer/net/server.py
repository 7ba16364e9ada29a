"""The peer port's server: a small HTTP/1.1 server of our own for one POST per frame (and one per
session handshake), written for strangers as much as for peers (docs/security.md).

It reads a request's head and the frame's 72-byte header (`wire.HEADER_BYTES`) under a deadline,
has the header authenticated (`admit`: who sent it, how long it is), and only then takes a read
slot and reads the body — also under a deadline sized by the body. So without a member's key
nobody makes us read, buffer or wait for a body. Connections are bounded in total (and under the
process's open-files limit, leaving descriptors for state writes and the admin socket), and
connections that have not yet sent an authenticated header have a small budget of their own: when
it is full, the oldest such connection from the busiest address is closed to make room. A refusal
after the header verified is answered with a tag (`X-Fedpeer-Refusal`) that proves to the sender
that this node refused it.

Each connection is an `asyncio.BufferedProtocol`: the kernel copies a request's head into a small
per-connection buffer, and an authenticated body straight into the frame's own buffer (one
`recv_into` per socket read, no stream buffer in between, no copy out of it). A task per
connection runs the requests one after the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.config.load import Address, Limits
from fedpeer.errors import RemoteProtocolError
from fedpeer.net.admission import Books, ByteBudget, HelloRate
from fedpeer.net.http1 import (
    END_OF_HEAD,
    FDS_RESERVED,
    HELLO_PATH,
    HTTP_HEAD_BYTES_MAX,
    NO_CONTENT,
    PATH,
    REFUSAL_HEADER,
    RELAY_PATH,
    REVERSE_ACCEPTED,
    REVERSE_PATH,
    STATUS_TEXT,
    HttpReply,
    parse_request_head,
)
from fedpeer.net.pool import FramePool
from fedpeer.wire.frame import HEADER_BYTES, FrameHeader
from fedpeer.wire.session import HELLO_BYTES

HEAD_BUFFER_BYTES = 2 * HTTP_HEAD_BYTES_MAX   # per connection: a request's head, the frame header after it
LARGE_FRAME_BYTES_MIN = 1024 * 1024    # frames this large also take bytes from the inbound byte budget
PEER_BYTES_SHARE_DIVISOR = 2           # one peer holds at most 1/this of the inbound byte budget (or one message)
DISCARD_BYTES_MAX = 256 * 1024         # unread bytes dropped at a close (what one socket read took before)
DISCARD_READ_BYTES = 64 * 1024         # one read of those: the scratch buffer a close reads them into
LISTEN_BACKLOG = 128                   # connections the kernel queues for us before we accept them
UNVERIFIED_PER_MEMBER = 4              # a member's connections that may be unauthenticated at once while it
                                       # starts: its hello's, and the sends that waited for it and then dial
                                       # together (membership, election, what it runs, its reverse links)
HEADS_REMEMBERED_MAX = 256             # request heads whose parse is remembered (a peer's client sends the same
HEAD_REMEMBERED_BYTES_MAX = 256        # few again and again; ours are ~90 bytes): longer ones are parsed each time

log = logging.getLogger("fedpeer.transport")


# What a handler of a verified frame may return: None (delivered: 204); for a relayed request an
# awaitable of (status, body) awaited once the read slots are free; for a reverse offer a callable
# that takes the connection's socket once it has turned round.
FrameHandler = Callable[[bytes | memoryview, FrameHeader, str], Awaitable[Any]]


class _Conn(asyncio.BufferedProtocol):
    """One peer-port connection: what it has received (a head buffer, or the body being read
    into its frame), and the waits of the task serving it."""

    def __init__(self, server: PeerServer, dialed_to: bytes | None = None) -> None:
        self._server = server
        self.dialed_to = dialed_to                  # a link we dialed to this peer for it to send on (no idle end)
        self.detached = False                       # its socket was handed to the client (a reverse offer)
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.ip = "?"
        self.sender: bytes | None = None            # set once a frame header from this connection verified
        self._buf = bytearray(HEAD_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = self._end = 0                 # unread bytes of the head buffer: [_start, _end)
        self._into: memoryview | None = None        # a body being read, and how much of it has arrived
        self._into_at = 0
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: float | None = None         # the pending wait's (loop time)
        self._timer: asyncio.TimerHandle | None = None   # fires at or before it (`_wait`)
        self._ended = False                         # EOF or connection lost
        self._reading_paused = False
        self._full = False                          # the head buffer filled: a check that pauses reading is due
        self._drained: asyncio.Future[None] | None = None   # set while the transport's writes are paused
        self.task: asyncio.Task | None = None

    # -- the protocol (called by the event loop) ---------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if peer else "?"
        self._server._accepted(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._into is not None:
            return self._into[self._into_at:]
        return self._view[self._end:]     # never empty: reading pauses when the buffer is full

    def buffer_updated(self, nbytes: int) -> None:
        if self._into is not None:
            self._into_at += nbytes
            if self._into_at < len(self._into):
                return
            self._into = None
            self._wake()
            return
        self._end += nbytes
        self._wake()
        if self._end == len(self._buf):
            self._compact()
            if self._end == len(self._buf) and not self._full:
                # Full: no read may come before the task made room or gave a body's buffer. The
                # check runs after the task (woken above, before it was queued) and before any read
                # the next poll finds (queued after both), so the usual frame, a head and header
                # then a body that fills the buffer, gets its body's buffer without reading being
                # paused and resumed (epoll_ctl DEL + ADD per frame); when the task could not (it
                # waits for a read slot, say), the check pauses, and the queued read is cancelled.
                self._full = True
                asyncio.get_running_loop().call_soon(self._pause_if_full)

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return True       # the task closes the connection once it has answered

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._ended = True
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _pause_if_full(self) -> None:
        self._full = False
        if self._into is None and self._end == len(self._buf):
            self._compact()
            if self._end == len(self._buf):
                self._reading_paused = True
                self.transport.pause_reading()   # type: ignore[union-attr]

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _compact(self) -> None:
        if self._start:
            n = self._end - self._start
            self._buf[:n] = bytes(self._view[self._start:self._end])   # (the two ranges may overlap)
            self._start, self._end = 0, n

    def _consume(self, n: int) -> None:
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        if self._reading_paused and self._end < len(self._buf):
            self._reading_paused = False
            self.transport.resume_reading()   # type: ignore[union-attr]

    # -- reads (called by the task) -----------------------------------------------------------

    async def _wait(self, deadline: float | None) -> None:
        """Until more bytes arrive (or a body is complete); TimeoutError at `deadline` (loop time);
        ConnectionError once the peer has ended the connection.

        One timer per connection, not one per wait: a kept-alive connection waits for its next
        request after every frame, each time with a deadline a little later than the last, so
        the timer stays where it is when it fires no later than the new deadline, and a timer
        that fires early sets itself again for the deadline of the wait then pending (if any)."""
        if self._ended:
            raise ConnectionError("the peer closed the connection")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        if deadline is not None:
            self._deadline = deadline
            timer = self._timer
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(deadline, self._timer_fired)
        try:
            await waiter
        finally:
            self._waiter = self._deadline = None

    def _timer_fired(self) -> None:
        self._timer = None
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or deadline is None or waiter.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.call_at(deadline, self._timer_fired)

    async def readable(self, deadline: float | None) -> bool:
        """Whether a next request starts before `deadline` (False: the peer closed)."""
        while self._start == self._end:
            if self._ended:
                return False
            await self._wait(deadline)
        return True

    async def read_head(self, deadline: float) -> bytes:
        """A request's head, its blank line included; 431 when it exceeds HTTP_HEAD_BYTES_MAX."""
        while True:
            at = self._buf.find(END_OF_HEAD, self._start, min(self._end, self._start + HTTP_HEAD_BYTES_MAX))
            if at >= 0:
                end = at + len(END_OF_HEAD)
                head = bytes(self._view[self._start:end])
                self._consume(end - self._start)
                return head
            if self._end - self._start >= HTTP_HEAD_BYTES_MAX:
                raise HttpReply(431, "head_too_large")
            await self._wait(deadline)

    async def read_exactly(self, n: int, deadline: float | None) -> bytes:
        """`n` bytes (at most HEAD_BUFFER_BYTES - HTTP_HEAD_BYTES_MAX) through the head buffer."""
        while self._end - self._start < n:
            await self._wait(deadline)
        data = bytes(self._view[self._start:self._start + n])
        self._consume(n)
        return data

    async def read_into(self, target: memoryview, deadline: float) -> None:
        """Fill `target`: what the head buffer holds already, then the rest straight from the socket."""
        have = min(self._end - self._start, len(target))
        target[:have] = self._view[self._start:self._start + have]
        self._consume(have)
        if have == len(target):
            return
        self._into, self._into_at = target[have:], 0
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()   # type: ignore[union-attr]
        try:
            while self._into is not None:
                await self._wait(deadline)
        finally:
            self._into = None

    # -- writes, and the end -------------------------------------------------------------------

    async def write(self, data: bytes, timeout_s: float) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("connection closed")
        self.transport.write(data)
        if self._drained is not None and not self._drained.done():
            async with asyncio.timeout(timeout_s):
                await self._drained


    def detach(self) -> socket.socket:
        """This connection's socket, for the client to send on (its reads stop here: the server's
        transport lets go of its descriptor, the socket lives on in a duplicate)."""
        assert self.transport is not None
        self.detached = True
        sock = self.transport.get_extra_info("socket").dup()
        self.transport.abort()
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        """End the connection once its answers are sent. What the peer sent and we did not read
        (the rest of a refused body) is read and dropped first, up to DISCARD_BYTES_MAX, so that
        the close is a FIN after our answer rather than a reset that may destroy it."""
        transport = self.transport
        assert transport is not None
        if transport.get_write_buffer_size():
            transport.abort()      # a peer that does not read its answers
            return
        if not self._ended:
            with contextlib.suppress(OSError), transport.get_extra_info("socket").dup() as sock:
                scratch, left = bytearray(DISCARD_READ_BYTES), DISCARD_BYTES_MAX
                while left > 0 and (n := sock.recv_into(scratch, min(left, len(scratch)), socket.MSG_DONTWAIT)):
                    left -= n
        transport.close()


async def _not_here(frame: bytes | memoryview, header: FrameHeader, peer_ip: str) -> None:
    raise RemoteProtocolError("unexpected_kind", "this node does not serve that path")


class PeerServer:
    def __init__(self, listen: Address, limits: Limits,
                 admit: Callable[[bytes], FrameHeader],
                 on_frame: Callable[[bytes | memoryview, FrameHeader, str], Awaitable[None]],
                 on_reject: Callable[[RemoteProtocolError, str], None],
                 refusal_tag: Callable[[FrameHeader, str], str],
                 on_hello: Callable[[bytes, str], bytes],
                 on_reverse: FrameHandler | None = None, on_relay: FrameHandler | None = None) -> None:
        """admit(first HEADER_BYTES) authenticates a frame header or raises RemoteProtocolError;
        on_frame(frame, header, peer_ip) raises RemoteProtocolError to refuse a whole frame, and
        keeps no reference to `frame` once it returned (its memory carries the next frame);
        on_reject(error, peer_ip) counts and logs every refusal; refusal_tag(header, reason)
        proves a refusal to an authenticated sender; on_hello(hello, peer_ip) answers a session
        handshake with its welcome or raises RemoteProtocolError. on_reverse and on_relay take a
        verified frame at REVERSE_PATH and RELAY_PATH (FrameHandler); without them those paths
        are refused as on_frame refuses a frame that is not for it."""
        self._listen = listen
        self._limits = limits
        self._admit = admit
        self._on_frame = on_frame
        self._on_reject = on_reject
        self._refusal_tag = refusal_tag
        self._on_hello = on_hello
        self._handlers: dict[str, FrameHandler] = {PATH: on_frame, REVERSE_PATH: on_reverse or _not_here,
                                                   RELAY_PATH: on_relay or _not_here}
        self._reading = asyncio.Semaphore(limits.inbound_concurrent_max)
        self._per_peer: dict[bytes, asyncio.Semaphore] = {}
        self._bytes = ByteBudget(max(limits.inbound_bytes_max, limits.message_bytes_max))
        self._peer_bytes: dict[bytes, ByteBudget] = {}
        self._books = Books()
        self._heads: dict[bytes, tuple[str, int, bool]] = {}   # request head -> its parse (`_parse_head`)
        self._pool = FramePool()
        self._server: asyncio.Server | None = None
        self._stopping = False
        self.port: int | None = None
        self.shed = Counter[str]()          # connections closed to keep the budgets, by reason
        self.hello_rate = HelloRate()
        self._unverified_min = 0            # the unauthenticated budgets' floor (fit_members)

    def fit_members(self, members: int) -> None:
        """A federation of `members` sites. Every member opens a connection to say hello, and that
        connection is unauthenticated until its first frame; one address can hold every member
        (one host runs the federation: `fedpeer harness`, 100 sites on 127.0.0.1), and they all
        start together. So the unauthenticated budgets ([limits] unverified_per_ip_max and
        unverified_connections_max) are at least UNVERIFIED_PER_MEMBER per member, and an address
        prefix's burst of hellos at least one per member (admission.py HelloRate.fit_members):
        below that, a federation starting on one host evicted its own members' hellos (at 25
        sites on loopback: ~1,000 connections shed, each a hello tried again or relayed, and
        refused as a replay when it had been answered)."""
        self._unverified_min = UNVERIFIED_PER_MEMBER * members
        self.hello_rate.fit_members(members)

    def use_limits(self, limits: Limits) -> None:
        """A reloaded [limits]: timeouts apply to the next request; the budgets sized here at
        start (fedpeer/daemon/reload.py LIMITS_AT_START) wait for a restart."""
        self._limits = limits

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Conn(self), self._listen.host, self._listen.port,
            reuse_address=True, backlog=LISTEN_BACKLOG)   # OSError (e.g. port in use) propagates to the node
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._stopping = True
        self._server.close()
        for conn in list(self._books.conns):
            conn.transport.abort()   # type: ignore[union-attr]
        try:
            async with asyncio.timeout(self._limits.shutdown_grace_ms / 1000):
                await self._server.wait_closed()
        except TimeoutError:
            pass
        self._server = None

    def connections(self) -> dict[str, int]:
        return {"open": len(self._books.conns), "unverified": len(self._books.unverified),
                "dialed_for_peers": sum(1 for c in self._books.conns if c.dialed_to)}   # type: ignore[attr-defined]

    async def serve_dialed(self, sock: socket.socket, peer: bytes) -> _Conn:
        """Serve requests from `peer` on a connection we dialed to it (fedpeer/net/reverse.py): it
        has turned round, the peer sends and we answer, with the same reads and checks as on any
        accepted connection. Returns the connection (`.lost` is done when it ends)."""
        conn: _Conn | None = None

        def made() -> _Conn:
            nonlocal conn
            conn = _Conn(self, dialed_to=peer)
            return conn

        await asyncio.get_running_loop().connect_accepted_socket(made, sock)
        assert conn is not None
        return conn

    # -- admission -----------------------------------------------------------------------------

    def _connections_cap(self) -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]   # read each time: an operator may lower it
        return max(1, min(self._limits.connections_max, soft - FDS_RESERVED))

    def _make_room(self, conn: _Conn) -> bool:
        """Evict unauthenticated connections until `conn` fits every budget; False if it cannot."""
        books, limits = self._books, self._limits
        while True:
            if books.unverified_by_ip[conn.ip] >= max(limits.unverified_per_ip_max, self._unverified_min):
                victim, why = books.oldest_unverified(conn.ip), "per_ip"
            elif len(books.unverified) >= max(limits.unverified_connections_max, self._unverified_min):
                victim, why = books.oldest_unverified(), "unverified"
            elif len(books.conns) >= self._connections_cap():
                victim, why = books.oldest_unverified(), "total"
            else:
                return True
            if victim is None:
                self.shed["refused_" + why] += 1
                return False
            self.shed["evicted_" + why] += 1
            books.remove(victim)
            victim.transport.abort()   # type: ignore[union-attr]

    def _accepted(self, conn: _Conn) -> None:
        if self._stopping or (conn.dialed_to is None and not self._make_room(conn)):
            conn.transport.abort()   # type: ignore[union-attr]
            return
        self._books.add(conn)
        if conn.dialed_to is not None:    # the peer it was dialed to, and verified when it took the offer
            self._books.verify(conn, conn.dialed_to)
        conn.task = asyncio.get_running_loop().create_task(self._serve(conn))

    async def _serve(self, conn: _Conn) -> None:
        try:
            while await self._one_request(conn):
                pass
        except (ConnectionError, TimeoutError):
            pass
        except Exception:   # a bug: this connection ends, the server goes on
            log.exception("peer_connection_failed", extra=fields(from_ip=conn.ip))
        finally:
            self._books.remove(conn)
            if not conn.detached:
                conn.close()

    # -- one request ---------------------------------------------------------------------------

    async def _one_request(self, conn: _Conn) -> bool:
        """Serve one request; False when the connection is to be closed."""
        loop = asyncio.get_running_loop()
        idle_ms = self._limits.idle_timeout_ms if conn.sender else self._limits.header_timeout_ms
        # a link we dialed for the peer to send on stays open while idle: TCP keep-alive watches it
        if not await conn.readable(None if conn.dialed_to else loop.time() + idle_ms / 1000):
            return False
        try:
            return await self._handle(conn)
        except HttpReply as reply:
            self._on_reject(RemoteProtocolError(reply.reason, f"HTTP {reply.status}"), conn.ip)
            await self._respond(conn, reply.status, reply.reason, False, "")
            return False

    async def _handle(self, conn: _Conn) -> bool:
        limits = self._limits
        deadline = asyncio.get_running_loop().time() + limits.header_timeout_ms / 1000
        try:
            target, length, keep = self._parse_head(await conn.read_head(deadline), limits.message_bytes_max)
            if target == HELLO_PATH:
                if length != HELLO_BYTES:
                    raise HttpReply(400, "frame")
                return await self._hello(conn, await conn.read_exactly(HELLO_BYTES, deadline), keep)
            head = await conn.read_exactly(min(length, HEADER_BYTES), deadline)
        except TimeoutError:
            raise HttpReply(408, "header_timeout") from None
        try:
            if length < HEADER_BYTES:
                raise RemoteProtocolError("frame", "truncated or not a fedpeer frame")
            header = self._admit(head)
            if header.length != length:
                raise RemoteProtocolError("frame", f"content-length {length}, the header says {header.length}")
        except RemoteProtocolError as exc:
            self._on_reject(exc, conn.ip)
            await self._respond(conn, 413 if exc.reason == "oversize" else 400, exc.reason, False, "")
            return False
        self._books.verify(conn, header.sender)
        try:
            result = await self._read_body(conn, header, head, self._handlers[target])
        except RemoteProtocolError as exc:
            self._on_reject(exc, conn.ip)
            tag = self._refusal_tag(header, exc.reason)
            await self._respond(conn, 400, exc.reason, keep, tag)
            return keep
        if target == REVERSE_PATH:
            self._turn_round(conn, result)
            return False
        if target == RELAY_PATH:
            status, body = await result
            await self._respond(conn, status, "" if status == 200 else body.decode(), keep, "", body)
            return keep
        if keep:
            await conn.write(NO_CONTENT, limits.header_timeout_ms / 1000)
        else:
            await self._respond(conn, 204, "", keep, "")
        return keep

    async def _hello(self, conn: _Conn, hello: bytes, keep: bool) -> bool:
        """Answer a session handshake (small and fixed-size: read within the header deadline); an
        address over its handshake rate gets 429 before any cryptography."""
        if not self.hello_rate.allow(conn.ip, asyncio.get_running_loop().time()):
            self._on_reject(RemoteProtocolError("hello_rate", "more session handshakes than the address may open"),
                            conn.ip)
            await self._respond(conn, 429, "hello_rate", False, "")
            return False
        try:
            welcome = self._on_hello(hello, conn.ip)
        except RemoteProtocolError as exc:
            self._on_reject(exc, conn.ip)
            await self._respond(conn, 429 if exc.reason == "hello_rate" else 400, exc.reason, False, "")
            return False
        # Not verified here: a hello carries no freshness of its own, so a replayed one must not buy
        # a connection out of the strangers' budgets; its first authenticated frame header does.
        await self._respond(conn, 200, "", keep, "", welcome)
        return keep

    def _turn_round(self, conn: _Conn, take: Callable[[socket.socket], None]) -> None:
        """A verified reverse offer: answer it, and hand the socket to `take` (the client), which
        sends on it from now on; the dialer serves it (`serve_dialed`)."""
        sock = conn.detach()
        try:
            sent = sock.send(REVERSE_ACCEPTED)   # a fresh, idle socket: its send buffer takes 38 bytes
        except OSError:
            sent = 0
        if sent != len(REVERSE_ACCEPTED):
            sock.close()
            return
        take(sock)

    async def _read_body(self, conn: _Conn, header: FrameHeader, head: bytes, handler: FrameHandler) -> Any:
        """Take read slots (this peer's, then the node's; for a large frame also bytes of the byte
        budgets), read the rest within the deadline into the frame's buffer, and hand the frame
        over while the slots are held (its decoding is what they bound). Raises
        RemoteProtocolError to refuse."""
        limits = self._limits
        rest = header.length - HEADER_BYTES
        deadline_s = (limits.body_timeout_ms + 1000 * rest / max(1, limits.body_bytes_per_s_min)) / 1000
        deadline = asyncio.get_running_loop().time() + deadline_s
        per_peer = self._per_peer.get(header.sender)
        if per_peer is None:
            per_peer = self._per_peer[header.sender] = asyncio.Semaphore(limits.inbound_per_peer_max)
        try:
            async with asyncio.timeout_at(deadline), per_peer, self._reading:
                if header.length < LARGE_FRAME_BYTES_MIN:   # no byte budget: the common small frame
                    return await self._deliver(conn, header, head, deadline, handler)
                peer_bytes = self._peer_bytes.get(header.sender)
                if peer_bytes is None:
                    peer_bytes = self._peer_bytes[header.sender] = ByteBudget(
                        max(self._bytes.total // PEER_BYTES_SHARE_DIVISOR, limits.message_bytes_max))
                async with peer_bytes.hold(header.length), self._bytes.hold(header.length):
                    return await self._deliver(conn, header, head, deadline, handler)
        except TimeoutError:
            raise HttpReply(408, "body_timeout") from None

    async def _deliver(self, conn: _Conn, header: FrameHeader, head: bytes, deadline: float,
                       handler: FrameHandler) -> Any:
        """Read the frame's body after its verified header and hand the frame to `handler`."""
        rest = header.length - HEADER_BYTES
        if rest <= conn._end - conn._start:   # a small frame arrives with its header: one copy
            return await handler(head + await conn.read_exactly(rest, None), header, conn.ip)
        buf = self._pool.take(header.length)     # warm memory (fedpeer/net/pool.py)
        frame = memoryview(bytearray(header.length) if buf is None else buf)[:header.length]
        frame[:HEADER_BYTES] = head
        await conn.read_into(frame[HEADER_BYTES:], deadline)
        try:
            result = await handler(frame, header, conn.ip)
        except RemoteProtocolError:
            del frame
            self._pool.give(buf)
            raise
        del frame
        self._pool.give(buf)    # the handler is done with it (not when cancelled: a thread may still read it)
        return result

    def _parse_head(self, head: bytes, bytes_max: int) -> tuple[str, int, bool]:
        """`_parse_head`'s answer, remembered for short heads (a pure function of the bytes: the
        same head is parsed, and refused, exactly as the first time)."""
        parsed = self._heads.get(head)
        if parsed is None:
            parsed = parse_request_head(head)
            if len(head) <= HEAD_REMEMBERED_BYTES_MAX:
                if len(self._heads) >= HEADS_REMEMBERED_MAX:
                    self._heads.clear()
                self._heads[head] = parsed
        if parsed[1] > bytes_max:
            raise HttpReply(413, "oversize")
        return parsed

    async def _respond(self, conn: _Conn, status: int, reason: str, keep: bool, tag: str, body: bytes = b"") -> None:
        body = body or (reason.encode() if status != 204 else b"")
        lines = [f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}"]
        if status != 204:
            kind = "application/octet-stream" if status == 200 else "text/plain"
            lines += [f"Content-Type: {kind}", f"Content-Length: {len(body)}"]
        if tag:
            lines.append(f"{REFUSAL_HEADER}: {tag}")
        if not keep:
            lines.append("Connection: close")
        await conn.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body, self._limits.header_timeout_ms / 1000)

