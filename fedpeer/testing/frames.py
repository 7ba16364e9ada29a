"""Forging frames the way a malicious but allow-listed peer could: it opens a real session with
the target (the handshake of fedpeer/wire/session.py, against a live daemon over HTTP or against a
`wire.Gate` in process), then seals arbitrary plaintext under it. Used by unit and integration
tests of the gate."""

from __future__ import annotations

import os
import time

import aiohttp
import msgpack

from fedpeer.identity import Identity
from fedpeer.kinds.catalog import job_kinds
from fedpeer.net.transport import HELLO_PATH
from fedpeer.wire import frame as wire
from fedpeer.wire.session import SUITE_AES_GCM, SUITES, Handshakes, OutSession


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Forger:
    """A site's sending side in the test process: sessions to peers, and frames of any content."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.keys = wire.PairKeys(identity)
        self.handshakes = Handshakes(identity, self.keys.key, SUITE_AES_GCM)
        self.sessions: dict[bytes, OutSession] = {}
        self._sealer = wire.Sealer(identity)

    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    async def connect(self, peer: bytes, port: int, host: str = "127.0.0.1") -> OutSession:
        """Open a session with the live daemon holding `peer` at host:port (raises on refusal)."""
        pending = self.handshakes.hello(peer)
        async with aiohttp.ClientSession() as http, http.post(f"http://{host}:{port}{HELLO_PATH}",
                                                              data=pending.hello) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise HelloRefused(resp.status, body.decode(errors="replace"))
        session = self.sessions[peer] = self.handshakes.finish(pending, body, now_ms())[0]
        return session

    def pair(self, gate: wire.Gate, peer: bytes, at_ms: int | None = None) -> OutSession:
        """Open a session with `gate` (the peer's, in process) directly."""
        pending = self.handshakes.hello(peer)
        at_ms = now_ms() if at_ms is None else at_ms
        welcome = gate.hello(pending.hello, at_ms)
        session = self.sessions[peer] = self.handshakes.finish(pending, welcome, at_ms)[0]
        return session

    def fake_session(self, peer: bytes) -> OutSession:
        """A session the peer never agreed to (random keys): what a stranger or a stale sender holds."""
        session = OutSession(sid=os.urandom(8), peer=peer, aead=SUITES[SUITE_AES_GCM](os.urandom(32)),
                             header_key=os.urandom(32), suite=SUITE_AES_GCM, opened_ms=now_ms())
        self.sessions[peer] = session
        return session

    def seal(self, dst: bytes, msg: object, *, job: str = "", term: int = 0) -> bytes:
        job_kinds()    # the job kinds' messages are registered with the wire, as in a daemon
        return bytes(self._sealer.seal(self.sessions[dst], msg, job=job, term=term))

    def seal_raw(self, dst: bytes, plaintext: bytes) -> bytes:
        return bytes(wire.seal_plaintext(self.identity.public_key, self.sessions[dst], plaintext))


class HelloRefused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason = status, reason


def plain(packed: bytes) -> bytes:
    """A frame's plaintext around msgpack bytes (their length first; no raw tail)."""
    return len(packed).to_bytes(4, "little") + packed


def envelope(body: object, kind: str = "ping", job: str = "", term: int = 0) -> bytes:
    return plain(msgpack.packb({"v": wire.PROTOCOL_VERSION, "kind": kind, "job": job, "term": term, "body": body}))


def flip(frame: bytes, index: int) -> bytes:
    b = bytearray(frame)
    b[index] ^= 0x01
    return bytes(b)


async def connected(identity: Identity, h: object, sites: list[int]) -> Forger:
    """A Forger with sessions open to the harness `h`'s sites at these indices."""
    from fedpeer.identity import load_key_file
    forger = Forger(identity)
    for i in sites:
        site = h.sites[i]   # type: ignore[attr-defined]
        await forger.connect(load_key_file(site.config.node.key_file).public_key, site.port)
    return forger
