"""What a job message costs on the event loop, pinned as Python call counts (cProfile's: calls and
coroutine resumptions; a count, not a time, so the bounds hold on a loaded machine), with
generous room; and the shortcuts that cut it keep what they replaced: a send to a member declared
dead ends at once, the server's deadlines still hold with one timer per connection, and a
remembered request head is refused and capped as a fresh one. benchmarks/bench_message_cost.py
measures the whole daemon, sender and receiver apart."""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import socket

import numpy as np
import pytest

from fedpeer.config.load import Address, Limits
from fedpeer.identity import Identity
from fedpeer.jobs.lifecycle.nodechannel import DeathWatch
from fedpeer.net.links import Links
from fedpeer.net.transport import PATH, PeerClient, PeerServer
from fedpeer.protocols.securesum.wire import SumChunk
from fedpeer.runtime.channel import Mailbox, PeerUnreachable
from fedpeer.testing import frames
from fedpeer.wire import frame as wire
from fedpeer.wire.session import Sessions

NOW_MS = 1_000
MESSAGES = 50
# A 16-entry SumChunk sealed and opened (pack, seal, header check, AEAD, strict decode, typed
# validation, the replay window): 121 calls when pinned (136 before the gate's checks were trimmed).
GATE_CALLS_PER_MESSAGE_MAX = 130
# The same message from a job's send to the peer's mailbox and its recv, both ends in one loop over
# loopback (death watch, sessions, our HTTP client and server, the gate, the 204): ~520 when pinned,
# ~760 with a task per send for the death watch, wait_for in the mailbox and a timer per server wait.
LOOP_CALLS_PER_MESSAGE_MAX = 600


def calls(prof: cProfile.Profile) -> int:
    return pstats.Stats(prof).total_calls


def chunk(i: int = 0) -> SumChunk:
    return SumChunk("m", np.arange(i, i + 16, dtype=np.uint64))


def test_a_small_job_message_through_the_gate_costs_few_calls() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    gate_a = wire.Gate(alice, {bob.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    gate_b = wire.Gate(bob, {alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    pending = gate_a.handshakes.hello(bob.public_key)
    out, back = gate_a.handshakes.finish(pending, gate_b.hello(pending.hello, NOW_MS), NOW_MS)
    sealer = wire.Sealer(alice)
    msgs = [chunk(i) for i in range(MESSAGES)]

    def through(msg: SumChunk) -> wire.Envelope:   # as the server and the node do: the header, then the rest
        frame = sealer.seal(out, msg, job="j")
        return gate_b.open(frame, NOW_MS, gate_b.open_header(bytes(frame[:wire.HEADER_BYTES]), NOW_MS))

    through(chunk())                                # the first frame confirms the session
    prof = cProfile.Profile()
    prof.enable()
    opened = [through(m) for m in msgs]
    prof.disable()
    assert [int(e.msg.data[0]) for e in opened] == list(range(MESSAGES)) and opened[0].job == "j"
    per_message = calls(prof) / MESSAGES
    assert per_message <= GATE_CALLS_PER_MESSAGE_MAX, f"{per_message:.0f} calls a message through the gate"


async def test_a_small_job_message_from_send_to_recv_costs_few_calls() -> None:
    """Alice's job sends, Bob's job receives: Links, PeerClient, PeerServer and both gates, real
    sockets, one loop for both (so the count is both ends' less the loop turns they share)."""
    alice, bob = Identity.generate(), Identity.generate()
    gate_a = wire.Gate(alice, {bob.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    gate_b = wire.Gate(bob, {alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    mailbox = Mailbox()

    async def on_frame(frame: bytes | bytearray, header: wire.FrameHeader, ip: str) -> None:
        envelope = gate_b.open(frame, NOW_MS, header)
        mailbox.put(envelope.src, envelope.msg)

    server = PeerServer(Address("127.0.0.1", 0), Limits(), lambda head: gate_b.open_header(head, NOW_MS), on_frame,
                        lambda exc, ip: None, gate_b.refusal_tag, lambda hello, ip: gate_b.hello(hello, NOW_MS))
    client = PeerClient(Limits())
    links = Links(alice, client, gate_a, lambda: NOW_MS)
    deaths = DeathWatch()
    await server.start()
    await client.start()
    address = f"127.0.0.1:{server.port}"
    msgs = [chunk(i) for i in range(MESSAGES)]

    async def sends() -> None:
        for m in msgs:
            await deaths.unless_dead(bob.public_key, links.send_reliable(bob.public_key, address, m, job="j"))

    async def recvs() -> list[int]:
        return [int((await mailbox.get(SumChunk, "m", alice.public_key, 10_000))[1].data[0]) for _ in msgs]

    try:
        await sends()            # warm: the session, the connection, the code paths
        await recvs()
        prof = cProfile.Profile()
        prof.enable()
        got, _ = await asyncio.gather(recvs(), sends())
        prof.disable()
    finally:
        await client.stop()
        await server.stop()
    assert got == list(range(MESSAGES))
    per_message = calls(prof) / MESSAGES
    assert per_message <= LOOP_CALLS_PER_MESSAGE_MAX, f"{per_message:.0f} calls a message, send to recv"


# -- the death watch: in the sending task, and as prompt as before -------------------------------------

async def test_a_send_ends_at_once_when_its_peer_is_declared_dead() -> None:
    deaths, peer = DeathWatch(), b"p" * 32
    cancelled = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def declare() -> None:
        await asyncio.sleep(0.01)
        assert deaths.declare_dead(peer)

    declaring = asyncio.create_task(declare())
    with pytest.raises(PeerUnreachable, match="declared dead"):
        await asyncio.wait_for(deaths.unless_dead(peer, stuck()), 5)
    await declaring
    assert cancelled.is_set() and not deaths._watches
    with pytest.raises(PeerUnreachable):            # and at once for every later send
        await deaths.unless_dead(peer, stuck())
    assert deaths.declare_alive(peer)


async def test_a_watched_send_keeps_its_result_its_errors_and_its_callers_cancellation() -> None:
    deaths, peer = DeathWatch(), b"p" * 32

    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def times_out() -> None:
        async with asyncio.timeout(0.001):
            await asyncio.sleep(1)

    assert await deaths.unless_dead(peer, value()) == 7
    with pytest.raises(TimeoutError):              # the send's own timeout is not a death
        await deaths.unless_dead(peer, times_out())
    task = asyncio.create_task(deaths.unless_dead(peer, asyncio.sleep(3600)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):    # the caller's cancellation stays one
        await task
    assert not deaths._watches and not deaths.dead


async def test_a_send_to_a_peer_declared_dead_while_others_are_watched_ends_only_its_own() -> None:
    deaths, dead, alive = DeathWatch(), b"d" * 32, b"a" * 32
    to_dead = asyncio.create_task(deaths.unless_dead(dead, asyncio.sleep(3600)))
    to_alive = asyncio.create_task(deaths.unless_dead(alive, asyncio.sleep(0.05, "delivered")))
    await asyncio.sleep(0.01)
    deaths.declare_dead(dead)
    with pytest.raises(PeerUnreachable):
        await to_dead
    assert await to_alive == "delivered"


# -- the server: one timer per connection, remembered heads -------------------------------------------

class Bob:
    """Bob's peer port (his real gate), and Alice's frames to him."""

    def __init__(self, limits: Limits) -> None:
        self.alice, self.bob = Identity.generate(), Identity.generate()
        self.gate = wire.Gate(self.bob, {self.alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
        self.forger = frames.Forger(self.alice)
        self.forger.pair(self.gate, self.bob.public_key, NOW_MS)
        self.received: list[object] = []
        self.rejected: list[str] = []
        self.server = PeerServer(Address("127.0.0.1", 0), limits, lambda head: self.gate.open_header(head, NOW_MS),
                                 self._on_frame, lambda exc, ip: self.rejected.append(exc.reason),
                                 self.gate.refusal_tag, lambda hello, ip: self.gate.hello(hello, NOW_MS))

    async def _on_frame(self, frame: bytes | bytearray, header: wire.FrameHeader, ip: str) -> None:
        self.received.append(self.gate.open(frame, NOW_MS, header).msg)

    def request(self, payload: bytes) -> bytes:   # (sealed here: the forger's seal imports every job kind)
        frame = wire.Sealer(self.alice).seal(self.forger.sessions[self.bob.public_key], wire.DiagProbe(payload))
        return f"POST {PATH} HTTP/1.1\r\nContent-Length: {len(frame)}\r\n\r\n".encode() + frame


def _conversation(port: int, sends: list[tuple[float, bytes]], wait_s: float = 10.0) -> list[tuple[float, bytes]]:
    """Send each chunk at its time (seconds from the start); read until the server closes: what
    came, and when (the last entry, b"", is the close)."""
    import time

    got: list[tuple[float, bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        started = time.monotonic()
        for at, data in sends:
            time.sleep(max(0.0, at - (time.monotonic() - started)))
            s.sendall(data)
        try:
            while True:
                part = s.recv(65536)
                got.append((time.monotonic() - started, part))
                if not part:
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return got


async def test_frames_that_keep_a_connection_busy_do_not_let_an_earlier_timer_close_it() -> None:
    """One timer per connection: it was set for the first wait's (header) deadline; frames past
    it move the idle deadline later, so it fires early and is set again; the idle deadline after
    the last frame closes the connection."""
    # (periods with room for a loaded machine: a frame late by the idle timeout would end the test)
    bob = Bob(Limits(idle_timeout_ms=1_500, header_timeout_ms=300))
    await bob.server.start()
    try:
        frames_ = [(0.15 * i, bob.request(b"%d" % i)) for i in range(4)]      # 0 .. 0.45 s, past the first 0.3
        got = await asyncio.to_thread(_conversation, bob.server.port, frames_)
        assert b"".join(part for _, part in got) == b"HTTP/1.1 204 No Content\r\n\r\n" * 4 and got[-1][1] == b""
        assert 1.95 <= got[-1][0] < 9.0, got[-1][0]           # closed idle 1.5 s after the last frame
        assert [m.payload for m in bob.received] == [b"0", b"1", b"2", b"3"]
    finally:
        await bob.server.stop()


async def test_a_head_begun_on_a_kept_connection_has_the_header_deadline_not_the_later_idle_one() -> None:
    bob = Bob(Limits(idle_timeout_ms=30_000, header_timeout_ms=100))
    await bob.server.start()
    try:
        got = await asyncio.to_thread(_conversation, bob.server.port, [(0, bob.request(b"0")), (0.05, b"POST / HT")])
        assert b" 408 " in b"".join(part for _, part in got)
        assert got[-1][0] < 10.0, got[-1][0]                 # ~0.15 s: the timer set for 30 s was brought forward
    finally:
        await bob.server.stop()


async def test_a_remembered_head_is_capped_as_a_new_one() -> None:
    bob = Bob(Limits())
    await bob.server.start()
    request = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n".encode() + bytes(5000)

    async def answer() -> bytes:
        return b"".join(part for _, part in await asyncio.to_thread(_conversation, bob.server.port, [(0, request)]))

    try:
        assert (await answer()).startswith(b"HTTP/1.1 400 ")   # parsed: not a frame
        assert (await answer()).startswith(b"HTTP/1.1 400 ")   # remembered: refused alike
        bob.server.use_limits(Limits(message_bytes_max=4096))  # a reload lowers the cap
        got = await answer()
        assert got.startswith(b"HTTP/1.1 413 ") and b"oversize" in got
        assert bob.rejected == ["frame", "frame", "oversize"] and bob.received == []
    finally:
        await bob.server.stop()
