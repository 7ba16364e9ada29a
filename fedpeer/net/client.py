"""The peer port's client: a small keep-alive HTTP/1.1 client for one POST per frame (and one per
session handshake), speaking to the server of fedpeer/net/server.py — or to whatever answers at a
peer's address, so its answer is parsed as strictly as any stranger's.

Connections are kept alive and pooled per peer address (at most OUTBOUND_PER_PEER_MAX in use per
peer and OUTBOUND_CONNECTIONS_MAX in all; a send waits for one within its timeout; an idle one is
closed after KEEPALIVE_S, or when the peer closed it). A frame is written with one `sendmsg` of the
request head and the frame (no join, no copy into a transport's buffer; the rest of a large frame
with `loop.sock_sendall`, which sends from the frame itself). A connection stays registered with the
event loop for reading from its connect to its close (`_Link`), so an answer costs no epoll_ctl
calls: it is read as it arrives into the buffer its request armed. A reliable send retries connection
failures with exponential backoff and full jitter; a peer's answer (a 400 with its reason and its
refusal tag) is not retried; best-effort sends (gossip) are tried once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import socket
from collections import Counter
from collections.abc import Awaitable, Callable

from fedpeer.config.load import Limits, parse_address
from fedpeer.net.http1 import (
    END_OF_HEAD,
    HELLO_PATH,
    NO_CONTENT,
    OUTBOUND_CONNECTIONS_MAX,
    OUTBOUND_PER_PEER_MAX,
    PATH,
    REFUSAL_HEADER,
    SendError,
    SendRefused,
    keep_alive,
    parse_header_lines,
)
from fedpeer.wire.session import WELCOME_BYTES

KEEPALIVE_S = 30.0                  # an idle connection is closed after this long (the server waits 60 s)
IDLE_SWEEP_S = KEEPALIVE_S / 2      # how often idle connections are looked for (one lives at most 1.5x KEEPALIVE_S)
ANSWER_HEAD_BYTES_MAX = 8 * 1024    # status line + headers of an answer
ANSWER_BODY_BYTES_MAX = 64 * 1024   # an answer's body we read (a reason, a welcome); larger ones are not read
ANSWER_BYTES_MAX = ANSWER_HEAD_BYTES_MAX + ANSWER_BODY_BYTES_MAX   # an answer's read buffer at most
ANSWER_BUFFER_BYTES_FIRST = 512     # an answer's first read buffer (our 204: 27 bytes), grown up to ANSWER_BYTES_MAX
HEAD_PREFIXES_MAX = 4096            # request-head prefixes cached, one per (address, path); cleared beyond that
REFUSAL_BODY_BYTES_READ = 400       # bytes of a refusal's body decoded for its reason ...
REFUSAL_REASON_CHARS_MAX = 100      # ... and the characters of it kept
REFUSAL_TAG_CHARS_MAX = 64          # characters of a refusal's X-Fedpeer-Refusal tag kept (ours are 32 hex digits)
STATUS_LINE_CHARS_SHOWN = 40        # characters of a status line we do not read quoted in the error
log = logging.getLogger("fedpeer.transport")

_NO_BODY = (204, 304)
_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)   # an int once: IntFlag's `|` costs a third of the recv


class BadAnswer(ConnectionError):
    """The peer's address answered with something that is not an HTTP/1.1 answer we understand."""


class _Answer:
    __slots__ = ("status", "headers", "body", "keep")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, keep: bool) -> None:
        self.status, self.headers, self.body, self.keep = status, headers, body, keep


_DELIVERED = _Answer(204, {}, b"", True)


class PeerClient:
    def __init__(self, limits: Limits, rng: random.Random | None = None) -> None:
        self._limits = limits
        self._rng = rng or random.Random()
        self._best_effort = asyncio.Semaphore(limits.outbound_inflight_max)
        self._in_use = asyncio.Semaphore(OUTBOUND_CONNECTIONS_MAX)
        self._per_peer: dict[str, asyncio.Semaphore] = {}
        self._idle: dict[str, list[tuple[_Link, float]]] = {}   # address -> (connection, idle since), LIFO
        self._heads: dict[tuple[str, str], bytes] = {}                   # (address, path) -> request head prefix
        self._sweep: asyncio.TimerHandle | None = None
        self._running = False
        self.dropped_best_effort = 0
        self.sent_bytes = {"reliable": 0, "best_effort": 0}   # frames accepted by peers (for status)
        self.sent_bytes_by_peer: Counter[tuple[bytes, str]] = Counter()   # (peer key, class) -> bytes

    @property
    def retries(self) -> int:
        return self._limits.send_retries_max

    def use_limits(self, limits: Limits) -> None:
        """A reloaded [limits]: timeouts, retries and backoff apply to the next send; what was
        sized at start (fedpeer/daemon/reload.py LIMITS_AT_START) waits for a restart."""
        self._limits = limits

    async def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False
        for idle in self._idle.values():
            for link, _ in idle:
                link.close()
        self._idle.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    # -- connections ---------------------------------------------------------------------------

    def _take_idle(self, address: str, now: float) -> _Link | None:
        idle = self._idle.get(address)
        while idle:
            link, since = idle.pop()
            if now - since < KEEPALIVE_S and link.still_open():
                return link
            link.close()
        return None

    def _release(self, address: str, link: _Link, now: float) -> None:
        if not self._running:
            link.close()
            return
        self._idle.setdefault(address, []).append((link, now))
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(KEEPALIVE_S, self._sweep_idle)

    def _sweep_idle(self) -> None:
        """Close connections idle for KEEPALIVE_S (or closed by the peer meanwhile)."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        for address in list(self._idle):
            keep = []
            for link, since in self._idle[address]:
                if now - since < KEEPALIVE_S and link.still_open():
                    keep.append((link, since))
                else:
                    link.close()
            if keep:
                self._idle[address] = keep
            else:
                del self._idle[address]
        if self._idle:
            self._sweep = asyncio.get_running_loop().call_later(IDLE_SWEEP_S, self._sweep_idle)

    async def _connect(self, address: str) -> _Link:
        loop = asyncio.get_running_loop()
        try:
            where = parse_address(address)     # 'host:port' or '[v6]:port'
        except ValueError as exc:
            raise ConnectionError(str(exc)) from None    # an OSError: failed like an unreachable peer
        host, port = where.host, where.port
        try:
            ip = ipaddress.ip_address(host)
            targets = [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]
        except ValueError:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise ConnectionError(f"cannot resolve {host}: {exc}") from None
            targets = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
        error: OSError = ConnectionError(f"no address for {address}")
        for family, sockaddr in targets:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, sockaddr)
                return _Link(loop, sock)
            except OSError as exc:
                sock.close()
                error = exc
            except BaseException:
                sock.close()
                raise
        raise error

    def _head(self, address: str, path: str, length: int) -> bytes:
        prefix = self._heads.get((address, path))
        if prefix is None:
            if len(self._heads) > HEAD_PREFIXES_MAX:
                self._heads.clear()
            prefix = f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: ".encode()
            self._heads[(address, path)] = prefix
        return b"%s%d\r\n\r\n" % (prefix, length)

    # -- one request ---------------------------------------------------------------------------

    async def _post(self, address: str, frame: bytes | bytearray, timeout_ms: int | None, path: str = PATH) -> bytes:
        """POST one frame (or hello); the answer's body for a hello (its welcome), else b""."""
        loop = asyncio.get_running_loop()
        limits = self._limits
        per_peer = self._per_peer.get(address)
        if per_peer is None:
            per_peer = self._per_peer[address] = asyncio.Semaphore(OUTBOUND_PER_PEER_MAX)
        async with asyncio.timeout((timeout_ms or limits.http_timeout_ms) / 1000), per_peer, self._in_use:
            link = self._take_idle(address, loop.time())
            if link is None:
                async with asyncio.timeout(limits.http_connect_timeout_ms / 1000):
                    link = await self._connect(address)
            answer = None
            try:
                answer = await link.exchange(self._head(address, path, len(frame)), frame)
            finally:
                if answer is not None and answer.keep and not link.broken:
                    self._release(address, link, loop.time())
                else:
                    link.close()
        want = 200 if path == HELLO_PATH else 204
        if answer.status != want:
            reason = answer.body[:REFUSAL_BODY_BYTES_READ].decode("utf-8", "replace")[:REFUSAL_REASON_CHARS_MAX]
            if answer.status == 400:
                tag = answer.headers.get(REFUSAL_HEADER.lower(), "")[:REFUSAL_TAG_CHARS_MAX]
                raise SendRefused(address, reason, tag)
            raise SendError(f"{address} refused the frame: HTTP {answer.status} {reason}")
        if want == 204:
            return b""
        if len(answer.body) != WELCOME_BYTES or answer.headers.get("content-length") != str(WELCOME_BYTES):
            raise SendError(f"{address} answered the hello with {answer.headers.get('content-length')} bytes, "
                            "not a welcome")
        return answer.body

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
            except (TimeoutError, OSError) as exc:
                if attempt == retries:
                    raise SendError(f"{address}: {type(exc).__name__}: {exc}") from None
            cap = min(limits.send_backoff_ms_max, limits.send_backoff_ms * 2 ** attempt)
            await asyncio.sleep(self._rng.uniform(0, cap) / 1000)   # "full jitter"
        raise AssertionError("unreachable")

    async def send(self, address: str, frame: bytes | bytearray, peer: bytes = b"") -> None:
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

    async def send_best_effort(self, address: str, frame: bytes | bytearray, timeout_ms: int, peer: bytes = b"",
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
            except (TimeoutError, SendError, OSError) as exc:
                log.debug("best-effort send to %s failed: %s", address, exc)
                return False


class _Link:
    """A kept-alive connection to a peer. It is registered with the event loop for reading once,
    from its connect to its close: `loop.sock_recv_into` would first try a recv (the answer is not
    there yet), then register and unregister the socket for every answer (two epoll_ctl calls and
    a handle each). A request arms a buffer and a future, and the answer is read into that buffer
    as it arrives (the same reads, growth and cap as before). Bytes or an end that arrive when no
    answer is awaited mean the connection is of no further use: it is marked `broken` and
    unregistered (so an unread end does not wake the loop again), and closed by its owner."""

    __slots__ = ("sock", "broken", "_loop", "_fd", "_waiter", "_buf", "_got")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.sock = sock
        self.broken = False                  # the peer ended it, or sent what no request asked for
        self._loop = loop
        self._fd = sock.fileno()
        self._waiter: asyncio.Future[_Answer] | None = None   # set while a request awaits its answer
        self._buf = bytearray()
        self._got = 0
        loop.add_reader(self._fd, self._readable)

    def close(self) -> None:
        self._stop_reading()     # before the close: the descriptor's number may be reused at once
        self.sock.close()

    def still_open(self) -> bool:
        """An idle connection the peer has not closed (nor sent anything on): asked of the socket,
        not only of what the loop has seen (the peer may have closed it since the loop last looked)."""
        if self.broken:
            return False
        try:
            self.sock.recv(1, _PEEK_NOW)   # b"": closed; a byte: not an answer of ours
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _stop_reading(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._fd = -1

    def _break(self) -> None:
        self.broken = True
        self._stop_reading()

    async def exchange(self, head: bytes, frame: bytes | bytearray) -> _Answer:
        """Write one request (head, then the frame from its own memory) and read its answer."""
        waiter = self._waiter = self._loop.create_future()
        self._buf, self._got = bytearray(ANSWER_BUFFER_BYTES_FIRST), 0
        try:
            try:
                await self._send(head, frame)
            except OSError:
                # the peer may have answered before reading the whole frame (a refusal from its
                # header, or oversize) and closed: that answer, if it is here already, says why
                answer = self._answer_already_here(waiter)
                if answer is None:
                    raise
                return answer
            return await waiter
        finally:
            self._waiter = None
            if not waiter.done():
                waiter.cancel()
            elif not waiter.cancelled():
                waiter.exception()       # retrieved (an answer that failed while the frame was still sent)
            self._buf = bytearray()

    async def _send(self, head: bytes, frame: bytes | bytearray) -> None:
        sock = self.sock
        try:
            sent = sock.sendmsg((head, frame), (), socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(head):
            await self._loop.sock_sendall(sock, memoryview(head)[sent:])
            sent = len(head)
        if sent < len(head) + len(frame):
            with memoryview(frame) as view:
                await self._loop.sock_sendall(sock, view[sent - len(head):])

    def _readable(self) -> None:
        """The loop saw bytes (or the end) on the socket: read them into the armed answer."""
        waiter = self._waiter
        if waiter is None or waiter.done():    # no answer awaited: the peer closed, or sent what is no answer
            self._break()
            return
        buf, got = self._buf, self._got
        if got == len(buf):
            if len(buf) >= ANSWER_BYTES_MAX:
                self._fail(waiter, BadAnswer("answer too large"))
                return
            bigger = bytearray(min(2 * len(buf), ANSWER_BYTES_MAX))    # (not extend: a view of buf may still be alive)
            bigger[:got] = buf
            buf = self._buf = bigger
        try:
            n = self.sock.recv_into(memoryview(buf)[got:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(waiter, exc)
            return
        got = self._got = got + n
        try:
            if n and got == len(NO_CONTENT) and buf.startswith(NO_CONTENT):
                answer: _Answer | None = _DELIVERED
            else:
                answer = _parse_answer(buf, got, eof=n == 0)
        except BadAnswer as exc:
            self._fail(waiter, exc)
            return
        if n == 0:
            self._break()                       # the end stays readable: stop listening for it
        if answer is not None:
            waiter.set_result(answer)
        elif n == 0:
            waiter.set_exception(ConnectionError("the peer closed the connection before its answer was complete"))

    def _fail(self, waiter: asyncio.Future[_Answer], exc: BaseException) -> None:
        self._break()
        waiter.set_exception(exc)

    def _answer_already_here(self, waiter: asyncio.Future[_Answer]) -> _Answer | None:
        """After a failed write: the answer the peer sent before it closed, if it is here (read
        by the loop already, or now), never kept."""
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            answer: _Answer | None = waiter.result()
        else:
            buf = bytearray(ANSWER_BYTES_MAX)
            got = self._got
            buf[:got] = self._buf[:got]
            try:
                while got < len(buf):
                    n = self.sock.recv_into(memoryview(buf)[got:], 0, socket.MSG_DONTWAIT)
                    if n == 0:
                        break
                    got += n
            except OSError:
                pass
            try:
                answer = _parse_answer(buf, got, eof=True)
            except BadAnswer:
                return None
        if answer is None:
            return None
        return _Answer(answer.status, answer.headers, answer.body, False)


def _parse_answer(buf: bytearray, got: int, eof: bool) -> _Answer | None:
    """The answer in buf[:got], None while incomplete; BadAnswer when it is not one we read."""
    end = buf.find(END_OF_HEAD, 0, min(got, ANSWER_HEAD_BYTES_MAX))
    if end < 0:
        if got >= ANSWER_HEAD_BYTES_MAX:
            raise BadAnswer("answer head too large")
        if eof and got:
            raise BadAnswer("answer cut short")
        return None
    try:
        status_line, *lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        version, status_text, *_ = status_line.split(" ", 2)
        status = int(status_text)
    except ValueError:
        raise BadAnswer("not an HTTP answer") from None
    if not version.startswith("HTTP/1.") or not 200 <= status <= 599:
        raise BadAnswer(f"not an HTTP/1.x answer: {status_line[:STATUS_LINE_CHARS_SHOWN]!r}")
    try:
        headers = parse_header_lines(lines, unique=("content-length", "transfer-encoding"))   # as the server
    except ValueError:
        raise BadAnswer("malformed answer header") from None
    keep = keep_alive(version, headers)
    body_at = end + len(END_OF_HEAD)
    have = got - body_at
    if status in _NO_BODY:
        if have:
            raise BadAnswer("bytes after a bodiless answer")
        return _Answer(status, headers, b"", keep)
    length_text = headers.get("content-length")
    if length_text is None or "transfer-encoding" in headers:   # read to the end (or not at all): not kept
        if not eof and got < ANSWER_BYTES_MAX:
            return None
        return _Answer(status, headers, bytes(buf[body_at:got])[:ANSWER_BODY_BYTES_MAX], False)
    if not length_text.isdigit():
        raise BadAnswer("bad content-length")
    length = int(length_text)
    if length > ANSWER_BODY_BYTES_MAX:   # not ours to read: the status says enough
        return _Answer(status, headers, bytes(buf[body_at:got]), False)
    if have < length:
        if eof:
            raise BadAnswer("answer body cut short")
        return None
    if have > length:
        raise BadAnswer("bytes after the answer")
    return _Answer(status, headers, bytes(buf[body_at:got]), keep)
