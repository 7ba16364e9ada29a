"""Sending to peers under sessions: open (and reopen) a session per peer, seal, deliver.

The node hands a typed message and its recipient to `Links`; `Links` finds the session to that
peer (or runs the handshake of fedpeer/wire/session.py, one at a time per peer, shared by every send
waiting for it), seals the frame (in a worker thread when it is large) and gives it to the
transport's client. When the peer answers that it does not know the session — it restarted, or
forgot a session that went quiet — the session is dropped and a reliable send opens a new one and
tries once more. Time comes from the `now_ms` the node passes in (monotonic milliseconds).

When the client cannot dial a peer it asks `relay` (fedpeer/net/relay.py): the frame, sealed for
that peer as always, goes sealed once more to a member that reaches it (`relays` names them, best
first), and that member's answer is the peer's. Sessions to relays, and the offers of links that an
outbound-only site dials (fedpeer/net/reverse.py), are never relayed themselves.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections import Counter
from collections.abc import Callable

from fedpeer.identity import Identity
from fedpeer.net import relay, streams
from fedpeer.net.http1 import PATH, RELAY_PATH
from fedpeer.net.link import DELIVERED, Answer, BadAnswer, replayed
from fedpeer.net.pool import FramePool
from fedpeer.net.reverse import ReverseOffer
from fedpeer.net.streams import StreamChunk, StreamOpen
from fedpeer.net.transport import PeerClient, SendError, SendRefused
from fedpeer.wire import frame as wire
from fedpeer.wire.session import OutSession, PendingHello, Sessions

OFF_LOOP_BYTES_MIN = 4 * 1024 * 1024    # messages larger than this are sealed in a worker thread
HANDSHAKE_TIMEOUT_MS = 5_000           # one hello's round trip (then the client's retries, with backoff)
STREAM_BUSY_WAIT_MS = 200               # a peer whose stream budget is full is asked again after this


class Links:
    def __init__(self, identity: Identity, client: PeerClient, gate: wire.Gate, now_ms: Callable[[], int],
                 relays: Callable[[bytes], list[tuple[bytes, str]]] | None = None) -> None:
        self._identity = identity
        self._client = client
        self._gate = gate
        self._sessions: Sessions = gate.sessions
        self._sealer = wire.Sealer(identity)
        self._now_ms = now_ms
        self._opening: dict[bytes, asyncio.Task] = {}    # peer -> its handshake in progress
        self._pool = FramePool()                          # warm memory for large frames
        self.handshakes = 0          # sessions this node opened (for status)
        self.handshakes_failed = 0   # hellos that got no welcome (peer down, refused, timed out)
        self.handshake_errors: Counter[str] = Counter()
        self._relays = relays      # dst -> members that may relay to it, best first, with their addresses
        if relays is not None:
            client.relay = self._relay

    async def session(self, peer: bytes, address: str, relay_ok: bool = True) -> OutSession:
        """The session to send to `peer` under; opens one if there is none (or it is worn out).
        Raises SendError (peer unreachable) or SendRefused (its refusal: unknown_sender, header, ...).

        The handshake runs as its own task, shared by every send waiting for it: a send that
        gives up (a best-effort probe's short timeout) does not cancel it, so on a loaded machine
        the next send finds the session open instead of starting another handshake."""
        session = self._sessions.outbound(peer, self._now_ms())
        if session is not None:
            return session
        task = self._opening.get(peer)
        if task is None or task.done():
            task = self._opening[peer] = asyncio.get_running_loop().create_task(self._open(peer, address, relay_ok))
            task.add_done_callback(functools.partial(self._opened, peer))
        return await asyncio.shield(task)

    async def _open(self, peer: bytes, address: str, relay_ok: bool) -> OutSession:
        sent: list[PendingHello] = []

        def fresh() -> bytes:   # every try its own hello (PeerClient.hello): a retry is no replay
            sent.append(self._gate.handshakes.hello(peer))
            return sent[-1].hello
        try:
            welcome = await self._client.hello(address, fresh, HANDSHAKE_TIMEOUT_MS, self._client.retries,
                                               peer, relay_ok)
        except Exception as exc:
            self.handshakes_failed += 1
            self.handshake_errors[getattr(exc, "reason", None) or type(exc).__name__] += 1
            raise
        pending = sent[-1]      # tries are sequential: the welcome answers the last one
        try:
            session, back = self._gate.handshakes.finish(pending, welcome, self._now_ms())
        except wire.RemoteProtocolError as exc:
            raise SendError(f"{address}: bad welcome ({exc.reason}: {exc.detail})") from None
        self._sessions.opened(session, back, self._now_ms())
        self.handshakes += 1
        return session

    async def offer(self, peer: bytes, address: str, reach: str) -> bytes:
        """A sealed ReverseOffer to `peer` (fedpeer/net/reverse.py), under a session opened directly."""
        session = await self.session(peer, address, relay_ok=False)
        return bytes(self._sealer.seal(session, ReverseOffer(reach)))

    async def _relay(self, dst: bytes, path: str, body: bytes | bytearray | memoryview) -> Answer:
        """`body` (a frame or hello sealed for `dst`) through the first member that relays it; its
        answer is dst's. ConnectionError when none did (the client's retries take it from there)."""
        assert self._relays is not None
        errors: list[str] = []
        maybe_delivered = False    # a relay took it and then failed: it may have reached dst
        for key, address in self._relays(dst)[:relay.RELAY_TRIES_MAX]:
            tried = False
            try:
                session = await self.session(key, address, relay_ok=False)
                msg = relay.request(dst, path, body)
                frame = (await asyncio.to_thread(self._sealer.seal, session, msg) if len(body) > OFF_LOOP_BYTES_MIN
                         else self._sealer.seal(session, msg))
                tried = True
                answer = await self._client.exchange(address, frame, RELAY_PATH, key, relay_ok=False)
                if answer.status == 200:
                    inner = relay.unwrap(answer.body)
                    self._client.routes[dst] = "relay:" + key.hex()
                    # a relay tried before may have delivered it and lost only its answer
                    return DELIVERED if path == PATH and maybe_delivered and replayed(inner) else inner
            except (OSError, TimeoutError, SendError, BadAnswer) as exc:
                maybe_delivered = maybe_delivered or tried
                errors.append(type(exc).__name__ if tried else f"no session: {type(exc).__name__}")
                continue
            if answer.status == 400 and answer.body.startswith(b"unknown_session"):
                self._sessions.forget_outbound(key, session.sid)
            errors.append(f"HTTP {answer.status}")
        raise ConnectionError("cannot dial it, and no member relayed to it "
                              f"({', '.join(errors) if errors else 'no member reaches it'})")

    def _opened(self, peer: bytes, task: asyncio.Task) -> None:
        if self._opening.get(peer) is task:
            del self._opening[peer]
        if not task.cancelled():
            task.exception()    # retrieved: every waiter may have given up already

    def forget(self, peer: bytes) -> None:
        """`peer` was removed from peers.toml: a handshake still running for it is stopped."""
        task = self._opening.pop(peer, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        """The daemon stops: handshakes still running are stopped."""
        for task in self._opening.values():
            task.cancel()
        self._opening.clear()

    async def send_reliable(self, dst: bytes, address: str, msg: object, *, job: str = "", term: int = 0,
                            large: bool = False) -> None:
        """Seal and deliver with retries; raises SendError, or SendRefused with `.frame` set. A
        message whose envelope exceeds STREAM_ABOVE_BYTES goes as a stream (fedpeer/net/streams.py)."""
        plaintext = await asyncio.to_thread(wire.pack, msg, job=job, term=term) if large else wire.pack(
            msg, job=job, term=term)
        if len(plaintext) > streams.STREAM_ABOVE_BYTES:
            await self._stream(dst, address, plaintext, job, term)
        else:
            await self._send_plaintext(dst, address, plaintext, len(plaintext) > OFF_LOOP_BYTES_MIN)

    async def _send_plaintext(self, dst: bytes, address: str, plaintext: bytes | memoryview, large: bool) -> None:
        for attempt in range(2):
            session = await self.session(dst, address)
            try:
                await self._seal_and_deliver(dst, address, session, plaintext, large)
                return
            except SendRefused as exc:
                if exc.reason == "unknown_session":   # the peer restarted: a new session, once
                    self._sessions.forget_outbound(dst, session.sid)
                    if attempt == 0:
                        continue
                raise
        raise AssertionError("unreachable")

    async def _seal_and_deliver(self, dst: bytes, address: str, session: OutSession, plaintext: bytes | memoryview,
                                large: bool) -> None:
        """Seal `plaintext` under `session` (into a pooled buffer if the frame's size is pooled; in a
        worker thread when `large`) and hand the frame to the client. The frame is a view of that
        buffer: it is dropped before the buffer goes back to the pool, once the client is done with
        it — not when this send is cancelled: a sealing thread or the socket may still use it then.
        SendRefused carries a copy of the frame (the caller checks the refusal's proof against what
        was sent)."""
        buf = self._pool.take(wire.frame_bytes(len(plaintext)))   # warm memory for a large frame
        if large:
            frame = await asyncio.to_thread(self._sealer.seal_packed, session, plaintext, buf)
        else:
            frame = self._sealer.seal_packed(session, plaintext, buf)
        try:
            await self._client.send(address, frame, dst)
        except SendError as exc:
            if isinstance(exc, SendRefused):
                exc.frame = bytes(frame)
            del frame          # our view of buf goes before buf does (the retry may take it again)
            self._pool.give(buf)
            raise
        del frame
        self._pool.give(buf)

    async def _stream(self, dst: bytes, address: str, plaintext: bytes, job: str, term: int) -> None:
        """Send `plaintext` as StreamOpen + StreamChunks, STREAM_WINDOW_CHUNKS in flight."""
        stream_id = os.urandom(streams.STREAM_ID_BYTES)
        opening = wire.pack(StreamOpen(stream_id, len(plaintext), await asyncio.to_thread(streams.digest, plaintext)),
                            job=job, term=term)
        while True:
            try:
                await self._send_plaintext(dst, address, opening, False)
                break
            except SendRefused as exc:
                if exc.reason != "stream_busy":
                    raise
            await asyncio.sleep(STREAM_BUSY_WAIT_MS / 1000)   # the caller's timeout bounds the wait
        window = asyncio.Semaphore(streams.STREAM_WINDOW_CHUNKS)
        view = memoryview(plaintext)

        async def one(at: int, n: int) -> None:
            try:
                chunk = await asyncio.to_thread(wire.pack, StreamChunk(stream_id, at, view[at:at + n]),   # (no copy:
                                                job=job, term=term)                                   # a raw tail)
                await self._send_plaintext(dst, address, chunk, True)
            finally:
                window.release()

        try:
            async with asyncio.TaskGroup() as tg:
                for at, n in streams.chunks(len(plaintext)):
                    await window.acquire()
                    tg.create_task(one(at, n))
        except BaseExceptionGroup as group:   # the first chunk that failed says why (SendError, SendRefused)
            raise _first(group) from None

    async def send_best_effort(self, dst: bytes, address: str, msg: object, timeout_ms: int, *, term: int = 0,
                               on_refused: Callable[[str | None], None] | None = None) -> bool:
        """One try within `timeout_ms` (a handshake first, if needed); never raises."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                session = await self.session(dst, address)
        except SendRefused as exc:
            if on_refused is not None:
                on_refused(exc.reason)
            return False
        except (TimeoutError, SendError, OSError):
            return False
        frame = self._sealer.seal(session, msg, term=term)

        def refused(reason: str | None) -> None:
            if reason == "unknown_session":
                self._sessions.forget_outbound(dst, session.sid)
            elif on_refused is not None:
                on_refused(reason)

        return await self._client.send_best_effort(address, frame, timeout_ms, dst, refused)


def _first(group: BaseExceptionGroup) -> BaseException:
    leaf = group.exceptions[0]
    return _first(leaf) if isinstance(leaf, BaseExceptionGroup) else leaf
