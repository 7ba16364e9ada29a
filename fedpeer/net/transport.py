"""The peer port: one POST per frame (and one per session handshake), nothing else — a small
HTTP/1.1 server of our own, and an aiohttp client.

The server is written for strangers as much as for peers (DESIGN §5): it reads the request's head
and the frame's 72-byte header (`wire.HEADER_BYTES`) under a deadline, has the header
authenticated (`admit`: who sent it, how long it is), and only then takes a read slot and reads the
body — also under a deadline sized by the body. So without a member's key nobody makes us read,
buffer or wait for a body. Connections are bounded in total (and under the process's open-files
limit, leaving descriptors for state writes and the admin socket), and connections that have not
yet sent an authenticated header have a small budget of their own: when it is full, the oldest such
connection from the busiest address is closed to make room. A refusal after the header verified is
answered with a tag (`X-Fedpeer-Refusal`) that proves to the sender that this node refused it.

The client keeps connections alive (one pooled session), and retries a reliable send with
exponential backoff and full jitter; best-effort sends (gossip) are tried once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import resource
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from ..config import Address, Limits
from ..errors import RemoteProtocolError
from ..logs import fields
from ..session import HELLO_BYTES, WELCOME_BYTES
from ..wire import HEADER_BYTES, FrameHeader

PATH = "/fedpeer/v1/frame"
HELLO_PATH = "/fedpeer/v1/hello"      # a session's handshake: a hello in, a welcome out (fedpeer/session.py)
REFUSAL_HEADER = "X-Fedpeer-Refusal"
HTTP_HEAD_BYTES_MAX = 8 * 1024          # request line + headers; our client sends ~200 bytes
BODY_BUFFER_BYTES = 1024 * 1024         # read-ahead buffer for an authenticated frame body
LARGE_FRAME_BYTES_MIN = 1024 * 1024    # frames this large also take bytes from the inbound byte budget
FDS_RESERVED = 320                      # descriptors kept for outbound connections, state files, admin
OUTBOUND_CONNECTIONS_MAX = 256          # the client's pool (counted in FDS_RESERVED)
log = logging.getLogger("fedpeer.transport")


class SendError(Exception):
    """A frame could not be delivered (after the allowed retries)."""


class SendRefused(SendError):
    """The peer answered 400: it refused the frame. `tag` proves the refusal if the peer verified us."""

    def __init__(self, address: str, reason: str, tag: str) -> None:
        super().__init__(f"{address} refused the frame: {reason}")
        self.reason, self.tag = reason, tag
        self.frame: bytes | None = None      # set by the node: the refused frame, to check the tag


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one (the usual 1,024 is few for a server);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("open_files_limit", extra=fields(soft=soft, hard=hard, error=str(exc)))
    return soft


class _Reply(Exception):
    """Answer the current request with `status` and `reason`, then close unless `keep`."""

    def __init__(self, status: int, reason: str, keep: bool = False, tag: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason, self.keep, self.tag = status, reason, keep, tag


_STATUS_TEXT = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout",
                405: "Method Not Allowed", 411: "Length Required", 413: "Payload Too Large",
                431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    ip: str
    sender: bytes | None = None            # set once a frame header from this connection verified


@dataclass
class _Books:
    """Who holds which connection: the budgets the server enforces."""

    conns: dict[_Conn, None] = field(default_factory=dict)            # insertion order = age
    unverified: dict[_Conn, None] = field(default_factory=dict)
    unverified_by_ip: Counter[str] = field(default_factory=Counter)

    def add(self, conn: _Conn) -> None:
        self.conns[conn] = None
        self.unverified[conn] = None
        self.unverified_by_ip[conn.ip] += 1

    def verify(self, conn: _Conn, sender: bytes) -> None:
        if conn.sender is None:
            self.unverified.pop(conn, None)
            self._drop_ip(conn.ip)
        conn.sender = sender

    def remove(self, conn: _Conn) -> None:
        self.conns.pop(conn, None)
        if self.unverified.pop(conn, 0) is None:
            self._drop_ip(conn.ip)

    def _drop_ip(self, ip: str) -> None:
        self.unverified_by_ip[ip] -= 1
        if self.unverified_by_ip[ip] <= 0:
            del self.unverified_by_ip[ip]

    def oldest_unverified(self, ip: str | None = None) -> _Conn | None:
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


class PeerServer:
    def __init__(self, listen: Address, limits: Limits,
                 admit: Callable[[bytes], FrameHeader],
                 on_frame: Callable[[bytes, FrameHeader, str], Awaitable[None]],
                 on_reject: Callable[[RemoteProtocolError, str], None],
                 refusal_tag: Callable[[FrameHeader, str], str],
                 on_hello: Callable[[bytes, str], bytes]) -> None:
        """admit(first HEADER_BYTES) authenticates a frame header or raises RemoteProtocolError;
        on_frame(frame, header, peer_ip) raises RemoteProtocolError to refuse a whole frame;
        on_reject(error, peer_ip) counts and logs every refusal; refusal_tag(header, reason)
        proves a refusal to an authenticated sender; on_hello(hello, peer_ip) answers a session
        handshake with its welcome or raises RemoteProtocolError."""
        self._listen = listen
        self._limits = limits
        self._admit = admit
        self._on_frame = on_frame
        self._on_reject = on_reject
        self._refusal_tag = refusal_tag
        self._on_hello = on_hello
        self._reading = asyncio.Semaphore(limits.inbound_concurrent_max)
        self._per_peer: dict[bytes, asyncio.Semaphore] = {}
        self._bytes = ByteBudget(max(limits.inbound_bytes_max, limits.message_bytes_max))
        self._peer_bytes: dict[bytes, ByteBudget] = {}
        self._books = _Books()
        self._server: asyncio.Server | None = None
        self.port: int | None = None
        self.shed = Counter[str]()          # connections closed to keep the budgets, by reason

    def use_limits(self, limits: Limits) -> None:
        """A reloaded [limits]: timeouts apply to the next request; the budgets sized here at
        start (fedpeer/reload.py LIMITS_AT_START) wait for a restart."""
        self._limits = limits

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self._listen.host, self._listen.port, limit=HTTP_HEAD_BYTES_MAX,
            reuse_address=True, backlog=128)   # OSError (e.g. port in use) propagates to the node
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._books.conns):
            conn.writer.transport.abort()
        try:
            async with asyncio.timeout(self._limits.shutdown_grace_ms / 1000):
                await self._server.wait_closed()
        except TimeoutError:
            pass
        self._server = None

    def connections(self) -> dict[str, int]:
        return {"open": len(self._books.conns), "unverified": len(self._books.unverified)}

    # -- admission -----------------------------------------------------------------------------

    def _connections_cap(self) -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]   # read each time: an operator may lower it
        return max(1, min(self._limits.connections_max, soft - FDS_RESERVED))

    def _make_room(self, conn: _Conn) -> bool:
        """Evict unauthenticated connections until `conn` fits every budget; False if it cannot."""
        books, limits = self._books, self._limits
        while True:
            if books.unverified_by_ip[conn.ip] >= limits.unverified_per_ip_max:
                victim, why = books.oldest_unverified(conn.ip), "per_ip"
            elif len(books.unverified) >= limits.unverified_connections_max:
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
            victim.writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = _Conn(writer=writer, ip=str(peer[0]) if peer else "?")
        if not self._make_room(conn):
            writer.transport.abort()
            return
        self._books.add(conn)
        try:
            while await self._one_request(conn, reader):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception:   # a bug: this connection ends, the server goes on
            log.exception("peer_connection_failed", extra=fields(from_ip=conn.ip))
        finally:
            self._books.remove(conn)
            writer.transport.abort()

    # -- one request ---------------------------------------------------------------------------

    async def _one_request(self, conn: _Conn, reader: asyncio.StreamReader) -> bool:
        """Serve one request; False when the connection is to be closed."""
        idle_s = (self._limits.idle_timeout_ms if conn.sender else self._limits.header_timeout_ms) / 1000
        async with asyncio.timeout(idle_s):
            first = await reader.read(1)
        if not first:
            return False
        try:
            return await self._handle(conn, reader, first)
        except _Reply as reply:
            self._on_reject(RemoteProtocolError(reply.reason, f"HTTP {reply.status}"), conn.ip)
            await self._respond(conn, reply.status, reply.reason, reply.keep, reply.tag)
            return reply.keep

    async def _handle(self, conn: _Conn, reader: asyncio.StreamReader, first: bytes) -> bool:
        limits = self._limits
        try:
            async with asyncio.timeout(limits.header_timeout_ms / 1000):
                target, length, keep = _parse_head(first + await reader.readuntil(b"\r\n\r\n"),
                                                   limits.message_bytes_max)
                if target == HELLO_PATH:
                    if length != HELLO_BYTES:
                        raise _Reply(400, "frame")
                    return await self._hello(conn, await reader.readexactly(HELLO_BYTES), keep)
                head = await reader.readexactly(min(length, HEADER_BYTES))
        except asyncio.LimitOverrunError:
            raise _Reply(431, "head_too_large") from None
        except TimeoutError:
            raise _Reply(408, "header_timeout") from None
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
            await self._read_body(conn, reader, header, head)
        except RemoteProtocolError as exc:
            self._on_reject(exc, conn.ip)
            tag = self._refusal_tag(header, exc.reason)
            await self._respond(conn, 400, exc.reason, keep, tag)
            return keep
        await self._respond(conn, 204, "", keep, "")
        return keep

    async def _hello(self, conn: _Conn, hello: bytes, keep: bool) -> bool:
        """Answer a session handshake (small and fixed-size: read within the header deadline)."""
        try:
            welcome = self._on_hello(hello, conn.ip)
        except RemoteProtocolError as exc:
            self._on_reject(exc, conn.ip)
            await self._respond(conn, 400, exc.reason, False, "")
            return False
        self._books.verify(conn, hello[4:4 + 32])
        await self._respond(conn, 200, "", keep, "", welcome)
        return keep

    async def _read_body(self, conn: _Conn, reader: asyncio.StreamReader, header: FrameHeader, head: bytes) -> None:
        """Take read slots (this peer's, then the node's; for a large frame also bytes of the byte
        budgets), read the rest within the deadline into one buffer, and hand the frame over while
        the slots are held (its decoding is what they bound). Raises RemoteProtocolError to refuse."""
        limits = self._limits
        rest = header.length - HEADER_BYTES
        deadline_s = (limits.body_timeout_ms + 1000 * rest / max(1, limits.body_bytes_per_s_min)) / 1000
        per_peer = self._per_peer.setdefault(header.sender, asyncio.Semaphore(limits.inbound_per_peer_max))
        large = header.length >= LARGE_FRAME_BYTES_MIN
        peer_bytes = self._peer_bytes.setdefault(
            header.sender, ByteBudget(max(self._bytes.total // 2, limits.message_bytes_max)))
        # An authenticated body may fill the reader's buffer beyond the head's 8 KiB: with that
        # limit asyncio pauses the socket every 16 KiB (`StreamReader._limit`, CPython's private
        # but long-stable attribute; restored for the next request's head).
        reader._limit = BODY_BUFFER_BYTES   # type: ignore[attr-defined]
        try:
            async with asyncio.timeout(deadline_s), per_peer, self._reading:
                if not large:   # one read, no byte budget: the common small frame
                    await self._on_frame(head + await reader.readexactly(rest), header, conn.ip)
                    return
                async with peer_bytes.hold(header.length), self._bytes.hold(header.length):
                    # one wait for the whole body (the reader resumes the socket while it waits),
                    # one copy out of its buffer: a loop of read()s copied and shifted it per piece
                    await self._on_frame(head + await reader.readexactly(rest), header, conn.ip)
        except TimeoutError:
            raise _Reply(408, "body_timeout") from None
        finally:
            reader._limit = HTTP_HEAD_BYTES_MAX   # type: ignore[attr-defined]

    async def _respond(self, conn: _Conn, status: int, reason: str, keep: bool, tag: str, body: bytes = b"") -> None:
        body = body or (reason.encode() if status != 204 else b"")
        lines = [f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}"]
        if status != 204:
            kind = "application/octet-stream" if status == 200 else "text/plain"
            lines += [f"Content-Type: {kind}", f"Content-Length: {len(body)}"]
        if tag:
            lines.append(f"{REFUSAL_HEADER}: {tag}")
        if not keep:
            lines.append("Connection: close")
        conn.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        async with asyncio.timeout(self._limits.header_timeout_ms / 1000):
            await conn.writer.drain()


def _parse_head(head: bytes, bytes_max: int) -> tuple[str, int, bool]:
    """(path, content length, keep-alive) of a request for one of our paths; raises _Reply otherwise."""
    try:
        text = head.decode("latin-1")
        request_line, *header_lines = text[:-4].split("\r\n")
        method, target, version = request_line.split(" ")
    except ValueError:
        raise _Reply(400, "bad_request") from None
    if target not in (PATH, HELLO_PATH):
        raise _Reply(404, "not_found")
    if method != "POST":
        raise _Reply(405, "method_not_allowed")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _Reply(400, "bad_request")
        name = name.strip().lower()
        if name in headers and name in ("content-length", "transfer-encoding"):
            raise _Reply(400, "bad_request")      # request smuggling shapes: refuse, do not guess
        headers[name] = value.strip()
    if "transfer-encoding" in headers:
        raise _Reply(411, "length_required")     # frames have a length; no chunked bodies
    length_text = headers.get("content-length", "")
    if not length_text.isdigit() or len(length_text) > 12:
        raise _Reply(411, "length_required")
    length = int(length_text)
    if length > bytes_max:
        raise _Reply(413, "oversize")
    connection = headers.get("connection", "").lower()
    keep = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return target, length, keep


class PeerClient:
    def __init__(self, limits: Limits, rng: random.Random | None = None) -> None:
        self._limits = limits
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._best_effort = asyncio.Semaphore(limits.outbound_inflight_max)
        self.dropped_best_effort = 0
        self.sent_bytes = {"reliable": 0, "best_effort": 0}   # frames accepted by peers (for status)
        self.sent_bytes_by_peer: Counter[tuple[bytes, str]] = Counter()   # (peer key, class) -> bytes

    @property
    def retries(self) -> int:
        return self._limits.send_retries_max

    def use_limits(self, limits: Limits) -> None:
        """A reloaded [limits]: retries and backoff apply to the next send; what sized the
        session at start (fedpeer/reload.py LIMITS_AT_START) waits for a restart."""
        self._limits = limits

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._limits.http_timeout_ms / 1000,
                                        sock_connect=self._limits.http_connect_timeout_ms / 1000)
        connector = aiohttp.TCPConnector(limit=OUTBOUND_CONNECTIONS_MAX, limit_per_host=8, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, address: str, frame: bytes, timeout_ms: int | None, path: str = PATH) -> bytes:
        """POST one frame (or hello); the answer's body for a hello (its welcome), else b""."""
        assert self._session is not None, "PeerClient.start() not called"
        timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000) if timeout_ms else None
        want = 200 if path == HELLO_PATH else 204
        body = memoryview(frame) if isinstance(frame, bytearray) else frame   # aiohttp slices it: no copy of a view
        async with self._session.post(f"http://{address}{path}", data=body,
                                      timeout=timeout or aiohttp.helpers.sentinel) as resp:
            if resp.status != want:
                reason = (await resp.text(errors="replace"))[:100]
                if resp.status == 400:
                    raise SendRefused(address, reason, resp.headers.get(REFUSAL_HEADER, "")[:64])
                raise SendError(f"{address} refused the frame: HTTP {resp.status} {reason}")
            if want == 204:
                return b""
            if resp.content_length != WELCOME_BYTES:
                raise SendError(f"{address} answered the hello with {resp.content_length} bytes, not a welcome")
            return await resp.read()

    async def hello(self, address: str, hello: bytes, timeout_ms: int | None, retries: int) -> bytes:
        """A session handshake: the peer's welcome. Retries connection failures like `send`."""
        return await self._with_retries(address, retries, lambda: self._post(address, hello, timeout_ms, HELLO_PATH))

    async def _with_retries(self, address: str, retries: int, attempt_fn: Callable[[], Awaitable[bytes]]) -> bytes:
        limits = self._limits
        for attempt in range(retries + 1):
            try:
                return await attempt_fn()
            except SendError:
                raise
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                if attempt == retries:
                    raise SendError(f"{address}: {type(exc).__name__}: {exc}") from None
            cap = min(limits.send_backoff_ms_max, limits.send_backoff_ms * 2 ** attempt)
            await asyncio.sleep(self._rng.uniform(0, cap) / 1000)   # "full jitter"
        raise AssertionError("unreachable")

    async def send(self, address: str, frame: bytes, peer: bytes = b"") -> None:
        """Reliable send: retries connection failures with backoff and jitter; raises SendError.

        A 400 (the peer rejected the frame) is not retried: the same bytes would be rejected again.
        A retry refused as a replay was delivered by an earlier try whose answer was lost (the
        peer records a frame's counter only once the whole frame was accepted).
        """
        tries = 0

        async def attempt() -> bytes:
            nonlocal tries
            tries += 1
            try:
                return await self._post(address, frame, None)
            except SendRefused as exc:
                if tries > 1 and exc.reason == "replay":
                    return b""
                if exc.reason == "stale":   # held back so long that the peer's window moved on: not delivered
                    raise SendError(f"{address}: too late for the peer's replay window (stale)") from None
                raise

        await self._with_retries(address, self._limits.send_retries_max, attempt)
        self.sent_bytes["reliable"] += len(frame)
        self.sent_bytes_by_peer[peer, "reliable"] += len(frame)

    async def send_best_effort(self, address: str, frame: bytes, timeout_ms: int, peer: bytes = b"",
                               on_refused: Callable[[str | None], None] | None = None) -> bool:
        """One try, short timeout, never raises. Drops (and counts) when too many are in flight.
        `on_refused(reason)` hears a peer's 400 (news an operator needs: the peer does not list
        us, or holds another key), `on_refused(None)` a delivery."""
        if self._best_effort.locked():
            self.dropped_best_effort += 1
            return False
        async with self._best_effort:
            try:
                await self._post(address, frame, timeout_ms)
                self.sent_bytes["best_effort"] += len(frame)
                self.sent_bytes_by_peer[peer, "best_effort"] += len(frame)
                if on_refused is not None:
                    on_refused(None)
                return True
            except SendRefused as exc:
                if on_refused is not None:
                    on_refused(exc.reason)
                log.debug("best-effort send to %s refused: %s", address, exc.reason)
                return False
            except (TimeoutError, SendError, aiohttp.ClientError, OSError) as exc:
                log.debug("best-effort send to %s failed: %s", address, exc)
                return False
