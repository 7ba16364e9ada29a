"""The peer port's own HTTP/1.1 client and server (fedpeer/net/client.py, server.py) over real
loopback sockets in one process: frames of every size arrive whole and once, connections are kept
alive and reused, a refusal reaches the sender with its reason (also when the server answered
before reading the body), and the server holds its deadlines and limits against a raw socket."""

from __future__ import annotations

import asyncio
import socket

import pytest

from fedpeer.config.load import Address, Limits
from fedpeer.errors import RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.net import link as link_module
from fedpeer.net.transport import HELLO_PATH, PATH, PeerClient, PeerServer, SendError, SendRefused
from fedpeer.wire import frame as wire
from fedpeer.wire.session import Sessions
from fedpeer.testing import frames

NOW_MS = 1_000


class Site:
    """Bob's peer port in process (his real gate), and Alice's sealed frames to him."""

    def __init__(self, limits: Limits | None = None, bytes_max: int = 64 << 20) -> None:
        self.alice, self.bob = Identity.generate(), Identity.generate()
        self.gate = wire.Gate(self.bob, {self.alice.public_key}.__contains__, Sessions(), message_bytes_max=bytes_max)
        self.forger = frames.Forger(self.alice)
        self.forger.pair(self.gate, self.bob.public_key, NOW_MS)
        self.received: list[object] = []
        self.rejected: list[str] = []
        self.frame_hook = None
        self.server = PeerServer(Address("127.0.0.1", 0), limits or Limits(), self._admit, self._on_frame,
                                 lambda exc, ip: self.rejected.append(exc.reason), self.gate.refusal_tag,
                                 lambda hello, ip: self.gate.hello(hello, NOW_MS))

    def _admit(self, head: bytes) -> wire.FrameHeader:
        return self.gate.open_header(head, NOW_MS)

    async def _on_frame(self, frame: bytes | bytearray, header: wire.FrameHeader, ip: str) -> None:
        if self.frame_hook is not None:
            await self.frame_hook()
        self.received.append(self.gate.open(frame, NOW_MS, header).msg)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def frame(self, payload: bytes) -> bytes:
        return self.forger.seal(self.bob.public_key, wire.DiagProbe(payload))


@pytest.fixture
async def site():
    s = Site()
    await s.server.start()
    yield s
    await s.server.stop()


@pytest.fixture
async def client():
    c = PeerClient(Limits(send_backoff_ms=1, send_backoff_ms_max=2))
    await c.start()
    yield c
    await c.stop()


def payload(n: int) -> bytes:
    return (bytes(range(251)) * (n // 251 + 1))[:n]


@pytest.mark.parametrize("size", [0, 1, 100, 16_000, 70_000, 1 << 20, 9 << 20])
async def test_frames_of_every_size_arrive_whole(site: Site, client: PeerClient, size: int) -> None:
    data = payload(size)
    await client.send(site.address, site.frame(data))
    assert [bytes(m.payload) for m in site.received] == [data]


async def test_one_connection_is_kept_alive_for_many_frames(site: Site, client: PeerClient) -> None:
    for i in range(50):
        await client.send(site.address, site.frame(bytes([i]) * (1 + 3000 * (i % 3))))
    assert len(site.received) == 50
    assert site.server.connections()["open"] == 1 and site.server.connections()["unverified"] == 0


async def test_concurrent_sends_use_at_most_eight_connections_per_peer(site: Site, client: PeerClient) -> None:
    async def slow() -> None:
        await asyncio.sleep(0.02)
    site.frame_hook = slow
    await asyncio.gather(*(client.send(site.address, site.frame(b"x")) for _ in range(40)))
    assert len(site.received) == 40 and site.server.connections()["open"] <= 8


async def test_a_retried_hello_is_a_fresh_one(client: PeerClient) -> None:
    # a loaded peer may answer a try after it timed out: resending the same bytes would be refused
    # as a replay, so every try asks for a new hello
    posted: list[bytes] = []

    async def post(address: str, body: bytes, *rest: object) -> bytes:
        posted.append(body)
        if len(posted) == 1:
            raise TimeoutError
        return b"welcome"
    client._post = post    # type: ignore[method-assign]
    made = iter([b"hello-1", b"hello-2"])
    assert await client.hello("127.0.0.1:9", lambda: next(made), 1_000, 1) == b"welcome"
    assert posted == [b"hello-1", b"hello-2"]


async def test_a_hello_gets_its_welcome(site: Site, client: PeerClient) -> None:
    pending = site.forger.handshakes.hello(site.bob.public_key)
    welcome = await client.hello(site.address, lambda: pending.hello, 2_000, 0)
    out, _ = site.forger.handshakes.finish(pending, welcome, NOW_MS)
    frame = wire.Sealer(site.alice).seal(out, wire.DiagProbe(b"under the new session"))
    await client.send(site.address, frame)
    assert site.received[-1] == wire.DiagProbe(b"under the new session")


async def test_a_refusal_reaches_the_sender_with_its_proof(site: Site, client: PeerClient) -> None:
    frame = frames.flip(site.frame(b"tampered"), -5)      # its AEAD tag: refused after the header verified
    with pytest.raises(SendRefused) as err:
        await client.send(site.address, frame)
    assert err.value.reason == "decrypt"
    assert wire.refusal_verified(site.forger.keys, site.bob.public_key, frame, "decrypt", err.value.tag)
    await client.send(site.address, site.frame(b"the connection still serves"))
    assert site.server.connections()["open"] == 1
    once = site.frame(b"once")
    await client.send(site.address, once)
    with pytest.raises(SendRefused) as err:                # the first try of this send: not "delivered before"
        await client.send(site.address, once)
    assert err.value.reason == "replay" and err.value.tag == ""     # refused from its header: no proof
    assert site.rejected == ["decrypt", "replay"]


@pytest.mark.parametrize("size", [100, 8 << 20])
async def test_a_header_refusal_reaches_the_sender_before_its_body_is_read(client: PeerClient, size: int) -> None:
    """A frame under a session the server does not hold: refused from its 72 bytes, the
    connection closed; a large frame's sender may still be writing, and hears why all the same."""
    site = Site()
    await site.server.start()
    try:
        site.forger.fake_session(site.bob.public_key)
        with pytest.raises(SendRefused) as err:
            await client.send(site.address, site.frame(bytes(size)))
        assert err.value.reason == "unknown_session" and site.received == []
    finally:
        await site.server.stop()


async def test_a_connection_the_server_closed_is_not_reused(site: Site, client: PeerClient) -> None:
    await client.send(site.address, site.frame(b"a"))
    for conn in list(site.server._books.conns):
        conn.transport.close()
    await asyncio.sleep(0.05)
    assert [link.broken for link, _ in client._idle[site.address]] == [True]   # seen by the loop, unregistered
    await client.send(site.address, site.frame(b"b"))
    assert [m.payload for m in site.received] == [b"a", b"b"]


async def test_nothing_listening_is_a_send_error_after_the_retries(client: PeerClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SendError, match="ConnectionRefused"):
        await client.send(f"127.0.0.1:{port}", b"x" * 100)


async def read_request(reader: asyncio.StreamReader) -> None:
    """All of one request (so that closing after the answer is a FIN, not a reset)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length"))
    await reader.readexactly(length)


@pytest.mark.parametrize("answer", [
    b"garbage\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\nextra bytes",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    b"HTTP/1.1 204 No Con",
])
async def test_an_answer_we_do_not_understand_is_a_failed_try(client: PeerClient, answer: bytes) -> None:
    tries = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        await read_request(reader)
        writer.write(answer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        with pytest.raises(SendError):
            await client.send(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", b"x" * 100)
    assert tries == client.retries + 1


async def test_answers_of_other_servers_are_read(client: PeerClient) -> None:
    """A 400 from some other HTTP server (chunked, or to the end of the connection) is a refusal
    without proof; a 500 is an error."""
    answers = [b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nnope!\r\n0\r\n\r\n",
               b"HTTP/1.1 400 Bad Request\r\nX-Pad: " + b"p" * 3000 + b"\r\nContent-Length: 20000\r\n\r\n"
               + b"long" * 5000,
               b"HTTP/1.0 400 Bad Request\r\n\r\nnot yours",
               b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom"]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answers.pop(0))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        with pytest.raises(SendRefused) as refused:
            await client.send(address, b"x")
        assert refused.value.tag == ""
        with pytest.raises(SendRefused) as refused:   # an answer larger than the first read buffer
            await client.send(address, b"x")
        assert refused.value.reason == "long" * 25
        with pytest.raises(SendRefused) as refused:
            await client.send(address, b"x")
        assert refused.value.reason == "not yours"
        with pytest.raises(SendError, match="HTTP 500 boom"):
            await client.send(address, b"x")


async def test_bytes_a_peer_sends_on_an_idle_connection_are_never_taken_as_an_answer(client: PeerClient) -> None:
    """A peer that answers, keeps the connection open, then writes an answer nobody asked for
    (one it would like the next request to read): the client stops using that connection the
    moment the bytes arrive, and the next send goes on a new one and reads its own answer."""
    connections = 0
    stray_sent = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        try:
            while True:
                await read_request(reader)
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                if first:
                    await writer.drain()
                    await asyncio.sleep(0.05)      # after the client took its answer (else one read holds both)
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 6\r\n\r\nforged")
                    await writer.drain()
                    stray_sent.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        await client.send(address, b"x")
        await stray_sent.wait()
        await asyncio.sleep(0.05)
        assert [link.broken for link, _ in client._idle[address]] == [True]   # seen by the loop, unregistered
        await client.send(address, b"y")          # not refused with "forged": its own answer, on a new connection
        await client.send(address, b"z")
        assert connections == 2


def raw(port: int, data: bytes, *, wait_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (or `wait_s`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


async def test_two_requests_in_one_write_are_both_served(site: Site) -> None:
    frames_ = [site.frame(b"first"), site.frame(b"second")]
    data = b"".join(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(f)}\r\n\r\n".encode() + f
                    for f in frames_)
    data += f"POST {PATH} HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".encode()
    got = await asyncio.to_thread(raw, site.server.port, data)
    assert got.count(b"HTTP/1.1 204 No Content\r\n\r\n") == 2 and b" 400 " in got
    assert [m.payload for m in site.received] == [b"first", b"second"]


async def test_many_requests_in_one_write_overflow_the_head_buffer_and_are_all_served(site: Site) -> None:
    """80 pipelined frames (~27 KiB) on one connection: the head buffer fills, reading pauses,
    the served requests make room, reading resumes."""
    frames_ = [site.frame(b"%d" % i + bytes(200)) for i in range(80)]
    data = b"".join(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(f)}\r\n\r\n".encode() + f
                    for f in frames_)
    data += f"POST {PATH} HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".encode()
    assert len(data) > 2 * 16 * 1024 * 0.8
    got = await asyncio.to_thread(raw, site.server.port, data)
    assert got.count(b"HTTP/1.1 204 No Content\r\n\r\n") == 80
    assert [bytes(m.payload[:2]).rstrip(b"\0") for m in site.received] == [b"%d" % i for i in range(80)]


async def test_reading_pauses_when_the_head_buffer_fills_while_a_frame_is_handled(site: Site) -> None:
    """The same 80 pipelined frames, the first one's handler slow: the rest fill the head buffer
    while the task cannot make room, so reading pauses (no read may find the buffer full), and
    resumes once the served requests made room."""
    frames_ = [site.frame(b"%d" % i + bytes(200)) for i in range(80)]
    data = b"".join(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(f)}\r\n\r\n".encode() + f
                    for f in frames_)
    data += f"POST {PATH} HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".encode()
    pauses = 0

    async def slow_once() -> None:
        nonlocal pauses
        site.frame_hook = None
        conn = next(iter(site.server._books.conns))
        pause = conn.transport.pause_reading

        def counted() -> None:
            nonlocal pauses
            pauses += 1
            pause()
        conn.transport.pause_reading = counted
        await asyncio.sleep(0.2)
    site.frame_hook = slow_once
    got = await asyncio.to_thread(raw, site.server.port, data)
    assert got.count(b"HTTP/1.1 204 No Content\r\n\r\n") == 80 and pauses >= 1
    assert [bytes(m.payload[:2]).rstrip(b"\0") for m in site.received] == [b"%d" % i for i in range(80)]


async def test_a_head_larger_than_the_limit_is_refused(site: Site) -> None:
    head = f"POST {PATH} HTTP/1.1\r\n".encode() + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n"
    got = await asyncio.to_thread(raw, site.server.port, head)
    assert got.startswith(b"HTTP/1.1 431 ")


async def test_a_slow_body_is_cut_off_at_its_deadline() -> None:
    site = Site(Limits(body_timeout_ms=200, body_bytes_per_s_min=1 << 30, header_timeout_ms=1_000))
    await site.server.start()
    try:
        frame = site.frame(bytes(100_000))
        head = f"POST {PATH} HTTP/1.1\r\nContent-Length: {len(frame)}\r\n\r\n".encode()
        got = await asyncio.to_thread(raw, site.server.port, head + frame[:50_000])
        assert got.startswith(b"HTTP/1.1 408 ") and b"body_timeout" in got
        assert site.received == [] and site.rejected == ["body_timeout"]
    finally:
        await site.server.stop()


async def test_a_frame_sent_a_byte_at_a_time_arrives(site: Site) -> None:
    frame = site.frame(b"slowly")
    data = f"POST {PATH} HTTP/1.1\r\nContent-Length: {len(frame)}\r\nConnection: close\r\n\r\n".encode() + frame

    def trickle() -> bytes:
        with socket.create_connection(("127.0.0.1", site.server.port), timeout=5) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(len(data)):
                s.send(data[i:i + 1])
            return s.recv(200)

    assert (await asyncio.to_thread(trickle)).startswith(b"HTTP/1.1 204 ")
    assert site.received == [wire.DiagProbe(b"slowly")]


async def test_a_hello_of_the_wrong_length_and_other_paths_are_refused(site: Site) -> None:
    got = await asyncio.to_thread(raw, site.server.port,
                                  f"POST {HELLO_PATH} HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello".encode())
    assert got.startswith(b"HTTP/1.1 400 ") and got.endswith(b"frame")
    got = await asyncio.to_thread(raw, site.server.port, b"GET / HTTP/1.1\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 404 ")


async def test_a_hello_alone_leaves_its_connection_with_the_strangers(site: Site) -> None:
    """A hello carries no freshness: one captured off the wire and replayed is answered like the
    first, so it must not move its connection out of the unauthenticated budgets (it would buy an
    unevictable connection). A frame header that authenticates under the session does."""
    pending = site.forger.handshakes.hello(site.bob.public_key)
    reader, writer = await asyncio.open_connection("127.0.0.1", site.server.port)
    try:
        writer.write(f"POST {HELLO_PATH} HTTP/1.1\r\nContent-Length: {len(pending.hello)}\r\n\r\n".encode()
                     + pending.hello)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        welcome = await reader.readexactly(length)
        assert site.server.connections() == {"open": 1, "unverified": 1, "dialed_for_peers": 0}
        out, _ = site.forger.handshakes.finish(pending, welcome, NOW_MS)
        frame = wire.Sealer(site.alice).seal(out, wire.DiagProbe(b"now known"))
        writer.write(f"POST {PATH} HTTP/1.1\r\nContent-Length: {len(frame)}\r\n\r\n".encode() + frame)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 204 ")
        assert site.server.connections() == {"open": 1, "unverified": 0, "dialed_for_peers": 0}
        assert site.received == [wire.DiagProbe(b"now known")]
    finally:
        writer.close()


def test_answers_are_parsed_strictly() -> None:
    parse = link_module.parse_answer

    def answer(data: bytes, eof: bool = False):   # noqa: ANN202
        return parse(bytearray(data), len(data), eof)

    assert answer(b"HTTP/1.1 204 No Content\r\n") is None
    assert answer(b"HTTP/1.1 204 No Content\r\n\r\n").keep
    assert not answer(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").keep
    assert answer(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 6\r\n\r\nrep") is None
    done = answer(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 6\r\nX-Fedpeer-Refusal: ab\r\n\r\nreplay")
    assert (done.status, done.body, done.headers["x-fedpeer-refusal"]) == (400, b"replay", "ab")
    for bad in (b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 204\r\nno colon\r\n\r\n",
                b"HTTP/1.1 400 X\r\nContent-Length: -1\r\n\r\n",
                b"HTTP/1.1 400 X\r\nContent-Length: 0\r\nContent-Length: 3\r\n\r\nabc"):   # which one?
        with pytest.raises(link_module.BadAnswer):
            answer(bad)
    with pytest.raises(link_module.BadAnswer):
        answer(b"HTTP/1.1 400 X\r\nContent-Length: 9\r\n\r\nabc", eof=True)


class _RecordedReads:
    """A socket whose reads are recorded: the answer buffer's length at each (what was read + the
    room left)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self.sizes, self.got = sock, [], 0

    def __getattr__(self, name: str):   # noqa: ANN204
        return getattr(self._sock, name)

    def recv_into(self, view: memoryview, *args: int) -> int:
        self.sizes.append(self.got + len(view))
        n = self._sock.recv_into(view, *args)
        self.got += n
        return n


async def test_an_answers_buffer_grows_to_its_cap_and_not_past_it() -> None:
    loop = asyncio.get_running_loop()
    cap = link_module.ANSWER_HEAD_BYTES_MAX + link_module.ANSWER_BODY_BYTES_MAX
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    recorded = _RecordedReads(ours)
    link = link_module.Link(loop, recorded)   # type: ignore[arg-type]
    sender = loop.create_task(loop.sock_sendall(
        theirs, b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n" + bytes(2 * cap)))   # no length
    try:
        answer = await link.exchange(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"")
    finally:
        sender.cancel()
        link.close()
        theirs.close()
    assert answer.status == 400 and len(answer.body) == link_module.ANSWER_BODY_BYTES_MAX and not answer.keep
    assert max(recorded.sizes) == cap


async def test_a_frame_handler_error_keeps_the_connection_serving(site: Site, client: PeerClient) -> None:
    async def refuse() -> None:
        raise wire.refused_from(site.alice.public_key, RemoteProtocolError("internal_error", "test"))
    site.frame_hook = refuse
    with pytest.raises(SendRefused) as err:
        await client.send(site.address, site.frame(b"x"))
    assert err.value.reason == "internal_error"
    site.frame_hook = None
    await client.send(site.address, site.frame(b"y"))
    assert site.received == [wire.DiagProbe(b"y")] and site.server.connections()["open"] == 1


async def test_large_frames_are_read_into_warm_buffers_given_back_after_use(site: Site, client: PeerClient) -> None:
    for i in range(6):
        await client.send(site.address, site.frame(bytes([i]) * (1 << 20)))
    with pytest.raises(SendRefused):     # a refused frame's buffer comes back too
        await client.send(site.address, frames.flip(site.frame(bytes(1 << 20)), -5))
    await client.send(site.address, site.frame(b"z" * (1 << 20)))
    pool = site.server._pool
    assert (pool.taken, pool.reused) == (8, 7) and pool.idle_bytes() > 0
    assert [bytes(m.payload[:1]) for m in site.received] == [bytes([i]) for i in range(6)] + [b"z"]
    assert all(len(m.payload) == 1 << 20 for m in site.received)   # each message its own plaintext


async def test_a_frame_still_in_use_when_its_deadline_passes_is_not_reused() -> None:
    site = Site(Limits(body_timeout_ms=100, body_bytes_per_s_min=1 << 30))
    await site.server.start()
    client = PeerClient(Limits(send_retries_max=0))
    await client.start()
    try:
        async def slow() -> None:
            await asyncio.sleep(0.5)          # (a decryption in a worker thread, say)
        site.frame_hook = slow
        with pytest.raises(SendError, match="body_timeout|HTTP 408"):
            await client.send(site.address, site.frame(bytes(1 << 20)))
        assert site.server._pool.taken == 1 and site.server._pool.idle_bytes() == 0
    finally:
        await client.stop()
        await site.server.stop()


def test_the_pool_keeps_size_classes_and_a_bounded_amount() -> None:
    from fedpeer.net.pool import POOLED_BYTES_MAX, POOLED_BYTES_MIN, FramePool, size_class
    for n in (POOLED_BYTES_MIN, 1 << 20, (1 << 20) + 1, 5_000_001, POOLED_BYTES_MAX):
        assert n <= size_class(n) <= n * 1.25 + (1 << 16)
    pool = FramePool(keep_bytes_max=3 << 20)
    assert pool.take(100) is None and pool.take(POOLED_BYTES_MAX + 1) is None
    a, b = pool.take(1 << 20), pool.take((1 << 20) - 5)
    assert a is not None and b is not None and len(a) == len(b) == 1 << 20
    pool.give(a)
    pool.give(b)
    pool.give(pool.take(3 << 20))              # over what is kept: dropped
    assert pool.idle_bytes() == 2 << 20
    assert pool.take(1 << 20) is b and pool.reused == 1


@pytest.mark.parametrize("line", [b"Content-Length : 5", b"Content-Length\t: 5", b" Content-Length: 5",
                                  b"Content Length: 5"])
async def test_whitespace_in_or_before_a_header_name_is_refused_at_once(site: Site, line: bytes) -> None:
    """RFC 9112 §5.1 and §5.2: whitespace between a field name and its colon, or a folded line, is a
    400 at once, never a wait for a body the header may not mean (the header deadline)."""
    import time

    started = time.monotonic()
    got = await asyncio.to_thread(raw, site.server.port, b"POST " + PATH.encode() + b" HTTP/1.1\r\n" + line
                                  + b"\r\n\r\n", wait_s=3.0)
    assert b" 400 " in got and time.monotonic() - started < 2.0, got


async def test_optional_whitespace_around_a_header_value_is_allowed(site: Site) -> None:
    frame = site.frame(b"ows")
    data = f"POST {PATH} HTTP/1.1\r\nContent-Length:\t {len(frame)} \t\r\nConnection: close\r\n\r\n".encode() + frame
    got = await asyncio.to_thread(raw, site.server.port, data)
    assert got.startswith(b"HTTP/1.1 204 No Content"), got
    assert [m.payload for m in site.received] == [b"ows"]


def test_hello_rate_is_a_token_bucket_per_prefix_with_a_bounded_memory_and_no_fresh_burst() -> None:
    from fedpeer.net.admission import HelloRate, address_prefix

    assert address_prefix("10.0.0.7") == address_prefix("10.0.0.200") == "10.0.0.0/24"
    assert address_prefix("::ffff:10.0.0.7") == "10.0.0.0/24"
    assert address_prefix("2001:db8::1") == address_prefix("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_prefix("not an address") == "not an address"
    rate = HelloRate(rate_per_s=2.0, burst=3, ips_max=2)
    assert [rate.allow("10.0.0.1", 0.0) for _ in range(4)] == [True, True, True, False]   # the burst, then none
    assert not rate.allow("10.0.0.9", 0.0), "the same /24 shares the bucket"
    assert [rate.allow("10.0.1.1", 0.0) for _ in range(3)] == [True] * 3    # another prefix has its own bucket
    assert not rate.allow("10.0.0.1", 0.25) and rate.allow("10.0.0.1", 0.5)   # 2 per second refill
    # a third prefix while both tracked ones are in use: it shares the overflow bucket, and the
    # spent prefix is not forgotten (no fresh burst for coming back after others)
    assert rate.allow("10.0.2.1", 0.5)
    assert not rate.allow("10.0.0.1", 0.5)
    assert [rate.allow(f"10.0.{k}.1", 0.5) for k in range(3, 6)] == [True, True, False], "one bucket for all"
    # a bucket refilled (as good as forgotten) gives its place to a new prefix
    assert rate.allow("10.1.0.1", 10.0)


def test_a_prefix_may_say_hello_once_per_member_at_once_in_a_large_federation() -> None:
    from fedpeer.net.admission import HelloRate

    rate = HelloRate(rate_per_s=1.0, burst=3)
    rate.fit_members(2)     # a small federation: the burst it was made with
    assert [rate.allow("127.0.0.1", 0.0) for _ in range(4)] == [True] * 3 + [False]
    rate.fit_members(99)    # 100 sites on one host start together: each of the 99 others says hello
    assert sum(rate.allow("127.0.1.1", 0.0) for _ in range(120)) == 99


def test_hello_rate_bounds_full_handshakes_per_key_and_for_the_node() -> None:
    from fedpeer.net.admission import HelloRate

    rate = HelloRate(key_rate_per_s=1.0, key_burst=2, node_rate_per_s=1.0, node_burst=3)
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    assert [rate.allow_key(a, 0.0) for _ in range(3)] == [True, True, False]     # a key's burst
    assert rate.allow_key(b, 0.0)                                                # another key ...
    assert not rate.allow_key(c, 0.0), "... until the node's budget is spent"
    assert rate.allow_key(c, 1.0) and not rate.allow_key(b, 1.0)


async def test_a_large_federation_on_one_host_is_not_shed_by_the_unverified_budgets() -> None:
    # one host holds every member (the harness: all on 127.0.0.1), and they all dial at once: the
    # unauthenticated budgets are at least UNVERIFIED_PER_MEMBER per member
    from fedpeer.net.server import UNVERIFIED_PER_MEMBER

    async def idle_connections(site: Site, count: int) -> dict:
        writers = []
        for _ in range(count):        # connected, nothing sent yet: unauthenticated
            _, writer = await asyncio.open_connection("127.0.0.1", site.server.port)
            writers.append(writer)
        await asyncio.sleep(0.05)
        for writer in writers:
            writer.close()
        return dict(site.server.shed)

    small = Site(Limits(unverified_per_ip_max=2, unverified_connections_max=4))
    await small.server.start()
    try:
        assert (await idle_connections(small, 6)).get("evicted_per_ip") == 4     # the configured 2
    finally:
        await small.server.stop()
    large = Site(Limits(unverified_per_ip_max=2, unverified_connections_max=4))
    large.server.fit_members(3)
    await large.server.start()
    try:
        assert await idle_connections(large, UNVERIFIED_PER_MEMBER * 3) == {}
    finally:
        await large.server.stop()
