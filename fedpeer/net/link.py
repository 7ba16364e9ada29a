"""One kept-alive connection to a peer, as the client's side of it (`Link`), and how an answer is
read (`parse_answer`). A link is the same whoever dialed it: the client's own connections, and the
connections an outbound-only peer dialed to us and handed over for us to send on
(fedpeer/net/reverse.py). Answers are parsed as strictly as any stranger's.
"""

from __future__ import annotations

import asyncio
import socket

from fedpeer.net.http1 import END_OF_HEAD, NO_CONTENT, keep_alive, parse_header_lines

ANSWER_HEAD_BYTES_MAX = 8 * 1024    # status line + headers of an answer
ANSWER_BODY_BYTES_MAX = 64 * 1024   # an answer's body we read (a reason, a welcome); larger ones are not read
ANSWER_BYTES_MAX = ANSWER_HEAD_BYTES_MAX + ANSWER_BODY_BYTES_MAX   # an answer's read buffer at most
ANSWER_BUFFER_BYTES_FIRST = 512     # an answer's first read buffer (our 204: 27 bytes), grown up to ANSWER_BYTES_MAX
STATUS_LINE_CHARS_SHOWN = 40        # characters of a status line we do not read quoted in the error

_NO_BODY = (204, 304)
_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)   # an int once: IntFlag's `|` costs a third of the recv


class BadAnswer(ConnectionError):
    """The peer's address answered with something that is not an HTTP/1.1 answer we understand."""


class Answer:
    __slots__ = ("status", "headers", "body", "keep")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, keep: bool) -> None:
        self.status, self.headers, self.body, self.keep = status, headers, body, keep


_DELIVERED = Answer(204, {}, b"", True)
DELIVERED = _DELIVERED


def replayed(answer: Answer) -> bool:
    """A refusal of a frame as a replay: an earlier try of the same bytes was delivered."""
    return answer.status == 400 and answer.body.startswith(b"replay")




class Link:
    """A kept-alive connection to a peer. It is registered with the event loop for reading once,
    from its connect to its close: `loop.sock_recv_into` would first try a recv (the answer is not
    there yet), then register and unregister the socket for every answer (two epoll_ctl calls and
    a handle each). A request arms a buffer and a future, and the answer is read into that buffer
    as it arrives (the same reads, growth and cap as before). Bytes or an end that arrive when no
    answer is awaited mean the connection is of no further use: it is marked `broken` and
    unregistered (so an unread end does not wake the loop again), and closed by its owner."""

    __slots__ = ("sock", "via", "used", "broken", "_loop", "_fd", "_waiter", "_buf", "_got")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, via: str = "direct") -> None:
        self.sock = sock
        self.via = via                       # how it was opened: "direct", "proxy", "inbound" (the peer dialed it)
        self.used = False                    # an answer came back on it once
        self.broken = False                  # the peer ended it, or sent what no request asked for
        self._loop = loop
        self._fd = sock.fileno()
        self._waiter: asyncio.Future[Answer] | None = None   # set while a request awaits its answer
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

    async def exchange(self, head: bytes, frame: bytes | bytearray) -> Answer:
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
                answer: Answer | None = _DELIVERED
            else:
                answer = parse_answer(buf, got, eof=n == 0)
        except BadAnswer as exc:
            self._fail(waiter, exc)
            return
        if n == 0:
            self._break()                       # the end stays readable: stop listening for it
        if answer is not None:
            waiter.set_result(answer)
        elif n == 0:
            waiter.set_exception(ConnectionError("the peer closed the connection before its answer was complete"))

    def _fail(self, waiter: asyncio.Future[Answer], exc: BaseException) -> None:
        self._break()
        waiter.set_exception(exc)

    def _answer_already_here(self, waiter: asyncio.Future[Answer]) -> Answer | None:
        """After a failed write: the answer the peer sent before it closed, if it is here (read
        by the loop already, or now), never kept."""
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            answer: Answer | None = waiter.result()
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
                answer = parse_answer(buf, got, eof=True)
            except BadAnswer:
                return None
        if answer is None:
            return None
        return Answer(answer.status, answer.headers, answer.body, False)


def parse_answer(buf: bytearray, got: int, eof: bool) -> Answer | None:
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
        return Answer(status, headers, b"", keep)
    length_text = headers.get("content-length")
    if length_text is None or "transfer-encoding" in headers:   # read to the end (or not at all): not kept
        if not eof and got < ANSWER_BYTES_MAX:
            return None
        return Answer(status, headers, bytes(buf[body_at:got])[:ANSWER_BODY_BYTES_MAX], False)
    if not (length_text.isascii() and length_text.isdigit()):   # int() refuses "²"
        raise BadAnswer("bad content-length")
    length = int(length_text)
    if length > ANSWER_BODY_BYTES_MAX:   # not ours to read: the status says enough
        return Answer(status, headers, bytes(buf[body_at:got]), False)
    if have < length:
        if eof:
            raise BadAnswer("answer body cut short")
        return None
    if have > length:
        raise BadAnswer("bytes after the answer")
    return Answer(status, headers, bytes(buf[body_at:got]), keep)
