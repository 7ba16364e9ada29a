"""Sending under sessions (fedpeer/net/links.py) against a peer's real gate, without sockets: one
handshake shared by concurrent sends, a new session when the old one is worn out or the peer
restarted, and large messages as streams that the receiving side reassembles."""

from __future__ import annotations

import asyncio

import pytest

from fedpeer.errors import RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.net.links import Links
from fedpeer.net.pool import FramePool
from fedpeer.net.streams import STREAM_ABOVE_BYTES, InboundStreams, StreamChunk, StreamOpen
from fedpeer.net.transport import SendRefused
from fedpeer.wire import frame as wire
from fedpeer.wire.session import SESSION_REKEY_AFTER_MS, Sessions


class Peer:
    """Bob as the transport would serve him: hellos answered, frames opened, streams reassembled."""

    def __init__(self, alice: Identity) -> None:
        self.identity = Identity.generate()
        self.alice = alice
        self.restart()

    def restart(self) -> None:
        self.gate = wire.Gate(self.identity, {self.alice.public_key}.__contains__, Sessions(),
                              message_bytes_max=32 << 20)
        self.streams = InboundStreams(1 << 30)
        self.received: list[object] = []

    def take(self, frame: bytes) -> None:
        try:
            env = self.gate.open(frame, 0)
            if isinstance(env.msg, StreamOpen):
                self.streams.open(env.src, env.msg, 0)
                return
            if isinstance(env.msg, StreamChunk):
                whole = self.streams.chunk(env.src, env.msg, 0)
                if whole is None:
                    return
                env = self.gate.open_plaintext(env.src, whole, env.seq, len(whole))
            self.received.append(env.msg)
        except RemoteProtocolError as exc:
            raise SendRefused("bob", exc.reason, "") from None


class FakeClient:
    def __init__(self, bob: Peer) -> None:
        self.bob = bob
        self.hellos = 0
        self.retries = 0
        self.sent: list[bytes] = []

    async def hello(self, address: str, hello, timeout_ms: int | None, retries: int, peer: bytes = b"",
                    relay_ok: bool = True) -> bytes:
        self.hellos += 1
        await asyncio.sleep(0)
        return self.bob.gate.hello(hello(), 0)

    async def send(self, address: str, frame: bytes, peer: bytes = b"") -> None:
        await asyncio.sleep(0)
        self.sent.append(bytes(frame))
        self.bob.take(bytes(frame))


class LostFirstAnswerClient(FakeClient):
    """The first try reaches bob, but its answer never comes back (a loaded machine): a retry."""

    async def hello(self, address: str, hello, timeout_ms: int | None, retries: int, peer: bytes = b"",
                    relay_ok: bool = True) -> bytes:
        self.bob.gate.hello(hello(), 0)          # answered, and the answer lost
        return await super().hello(address, hello, timeout_ms, retries, peer, relay_ok)


async def test_a_retried_handshake_is_no_replay_and_its_session_works() -> None:
    links, _, bob, _ = setup()
    links._client = LostFirstAnswerClient(bob)
    await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(b"after a lost welcome"))
    assert [m.payload for m in bob.received] == [b"after a lost welcome"]
    assert links.handshakes == 1 and links.handshakes_failed == 0


def setup() -> tuple[Links, FakeClient, Peer, list[int]]:
    alice = Identity.generate()
    bob = Peer(alice)
    client = FakeClient(bob)
    now = [0]
    gate = wire.Gate(alice, lambda k: True, Sessions(), message_bytes_max=32 << 20)
    return Links(alice, client, gate, lambda: now[0]), client, bob, now   # type: ignore[arg-type]


async def test_concurrent_sends_share_one_handshake_and_rekey_when_worn() -> None:
    links, client, bob, now = setup()
    probes = [wire.DiagProbe(bytes([i])) for i in range(20)]
    await asyncio.gather(*(links.send_reliable(bob.identity.public_key, "bob", p) for p in probes))
    assert client.hellos == 1 and sorted(m.payload for m in bob.received) == sorted(p.payload for p in probes)
    now[0] = SESSION_REKEY_AFTER_MS
    await links.send_reliable(bob.identity.public_key, "bob", probes[0])
    assert client.hellos == 2 and links.handshakes == 2


async def test_a_restarted_peer_gets_a_new_session_and_the_message() -> None:
    links, client, bob, _ = setup()
    await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(b"before"))
    bob.restart()   # holds no session now: the next frame is refused unknown_session, then resent
    await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(b"after"))
    assert client.hellos == 2 and [m.payload for m in bob.received] == [b"after"]


async def test_a_large_message_goes_as_a_stream_and_arrives_whole() -> None:
    links, _, bob, _ = setup()
    payload = bytes(range(256)) * ((STREAM_ABOVE_BYTES + 5_000_000) // 256)
    await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(payload), large=True)
    assert len(bob.received) == 1 and bob.received[0].payload == payload
    assert bob.streams.completed == 1 and bob.streams.held_bytes() == 0


async def test_a_refused_stream_chunk_is_the_callers_error() -> None:
    links, _, bob, _ = setup()
    bob.streams.payload_bytes_max = 1000    # the open is refused: over payload_bytes_max
    with pytest.raises(SendRefused) as err:
        await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(bytes(STREAM_ABOVE_BYTES + 1)))
    assert err.value.reason == "oversize"


async def test_a_refused_large_frame_is_handed_back_as_sent_and_its_memory_reused() -> None:
    links, client, bob, _ = setup()
    bob.gate = wire.Gate(bob.identity, {bob.alice.public_key}.__contains__, bob.gate.sessions,
                         message_bytes_max=500_000)
    with pytest.raises(SendRefused) as err:   # over bob's frame cap
        await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(bytes(600_000)))
    assert err.value.reason == "oversize" and err.value.frame == client.sent[-1]
    bob.gate = wire.Gate(bob.identity, {bob.alice.public_key}.__contains__, bob.gate.sessions,
                         message_bytes_max=1 << 20)
    for i in range(3):
        await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(bytes([i]) * 600_000))
    assert [bytes(m.payload[:1]) for m in bob.received] == [b"\x00", b"\x01", b"\x02"]
    assert links._pool.taken == 4 and links._pool.reused == 3


class StrictPool(FramePool):
    """Takes a buffer back only when no view of it is alive (a viewed bytearray cannot be resized)."""

    def give(self, buf: bytearray | None) -> None:
        if buf is not None:
            buf.append(0)   # BufferError while a memoryview of buf is alive
            buf.pop()
        super().give(buf)


async def test_a_sent_frames_pooled_memory_goes_back_with_no_view_of_it_alive() -> None:
    links, _, bob, _ = setup()
    links._pool = StrictPool()
    for i in range(2):
        await links.send_reliable(bob.identity.public_key, "bob", wire.DiagProbe(bytes([i]) * 600_000))
    assert len(bob.received) == 2 and links._pool.taken == 2 and links._pool.reused == 1
