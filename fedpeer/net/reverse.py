"""Links a site that cannot be dialed keeps open to its peers, for them to send on.

Every message between two sites travels as a POST from the sender to the receiver. A site whose
firewall drops inbound connections (it dials out fine) would receive nothing: so it dials each peer
`[network] reverse_links` times and offers each connection to be turned round:

    POST /fedpeer/v1/reverse   a sealed ReverseOffer under our session to the peer
    HTTP/1.1 200 OK            the peer took it; from now on the peer POSTs and we answer

The offer is a frame like any other: the peer's server authenticates it (header, AEAD, replay
window, strict decode) before it turns the connection round, and hands the socket to its client
(fedpeer/net/client.py `adopt`), which sends on it before it would dial. On our side the socket
goes to our own server (`PeerServer.serve_dialed`), which reads the peer's requests through the one
gate, as on any connection it accepted. Nothing new crosses the gate but the offer.

The links are kept: TCP keep-alive every `[network] keepalive_ms` (at most 25 s) keeps NATs and
firewalls from forgetting them, and a link that ends (the peer restarted, a middlebox dropped it) is
dialed again at once, then with backoff from REDIAL_MS_MIN to REDIAL_MS_MAX while it fails. A peer
whose build has no reverse path answers 404: it is asked again only after OLD_PEER_RETRY_MS.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from dataclasses import dataclass

from fedpeer.base.logs import fields
from fedpeer.net.dial import Route, dial
from fedpeer.net.http1 import REVERSE_ACCEPTED, REVERSE_PATH
from fedpeer.wire.schema import register, v_str

REACH_WORDS = frozenset({"unknown", "outbound-only", "dialable"})
OFFER_TIMEOUT_MS = 10_000          # dial, offer and its answer (a session's handshake included)
REDIAL_MS_MIN = 100                # a link that failed to open is dialed again after this (full jitter) ...
REDIAL_MS_MAX = 1_000              # ... doubling up to this: a dropped link is back within ~1 s
LINK_LIVED_S = 1.0                 # a link that lived this long is dialed again at once when it ends
OLD_PEER_RETRY_MS = 300_000        # a peer that answered 404 (a build without reverse links) is asked again
ANSWER_CHARS_SHOWN = 60            # characters of an unexpected answer quoted in the error
log = logging.getLogger("fedpeer.transport")


@dataclass(frozen=True)
class ReverseOffer:
    """Turn this connection round: its dialer cannot be dialed (`reach`: what it knows of that)."""

    reach: str


register("reverse_offer", ReverseOffer, {"reach": v_str(16, REACH_WORDS)})


class OfferRefused(ConnectionError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class ReverseDialer:
    """Keeps `[network] reverse_links` links open to each peer while `wanted()` says so."""

    def __init__(self, route: Route, links_per_peer: int,
                 peers: Callable[[], dict[bytes, str]],
                 offer: Callable[[bytes, str], Awaitable[bytes]],
                 serve: Callable[[socket.socket, bytes], Awaitable[Any]],
                 wanted: Callable[[], bool], names: Callable[[bytes], str],
                 rng: random.Random | None = None) -> None:
        self._route = route
        self._per_peer = links_per_peer
        self._peers = peers            # peer -> address, read at every dial (a reload moves them)
        self._offer = offer            # a sealed ReverseOffer to that peer
        self._serve = serve            # our server takes the turned-round socket; returns its connection
        self._wanted = wanted
        self._names = names
        self._rng = rng or random.Random()
        self._tasks: dict[tuple[bytes, int], asyncio.Task] = {}
        self.up: Counter[bytes] = Counter()          # peer -> links open now
        self.last_error: dict[bytes, str] = {}       # peer -> why its last dial or offer failed
        self.opened = 0                               # links opened since start (for status and tests)

    async def run(self, tick_ms: int = 500) -> None:
        """Start and stop the per-link tasks as peers and `wanted()` change; cancelled with the node."""
        try:
            while True:
                self._reconcile()
                await asyncio.sleep(tick_ms / 1000)
        finally:
            for task in self._tasks.values():
                task.cancel()
            self._tasks.clear()

    def _reconcile(self) -> None:
        want = set()
        if self._wanted():
            want = {(peer, slot) for peer in self._peers() for slot in range(self._per_peer)}
        for key in [k for k in self._tasks if k not in want or self._tasks[k].done()]:
            self._tasks.pop(key).cancel()
        for key in want - self._tasks.keys():
            self._tasks[key] = asyncio.get_running_loop().create_task(self._keep(*key))

    async def _keep(self, peer: bytes, slot: int) -> None:
        backoff_ms = REDIAL_MS_MIN
        while True:
            address = self._peers().get(peer)
            if address is None:
                return
            try:
                async with asyncio.timeout(OFFER_TIMEOUT_MS / 1000):
                    sock = await self._open(peer, address)
                conn = await self._serve(sock, peer)
            except (OSError, TimeoutError) as exc:
                self._failed(peer, exc)
                if isinstance(exc, OfferRefused) and exc.status == 404:
                    await asyncio.sleep(OLD_PEER_RETRY_MS / 1000)
                else:
                    await asyncio.sleep(self._rng.uniform(0, backoff_ms) / 1000)   # full jitter
                    backoff_ms = min(2 * backoff_ms, REDIAL_MS_MAX)
                continue
            except Exception as exc:    # a refusal of our session (SendError), a bug: this link waits, the node goes on
                self._failed(peer, exc)
                await asyncio.sleep(REDIAL_MS_MAX / 1000)
                continue
            self.opened += 1
            self.up[peer] += 1
            self.last_error.pop(peer, None)
            opened_at = asyncio.get_running_loop().time()
            try:
                await asyncio.shield(conn.lost)   # (a cancel must not cancel the connection's own future)
            finally:
                self.up[peer] -= 1
                if not conn.lost.done():     # cancelled: no longer wanted, or the node stops
                    conn.transport.close()
            if asyncio.get_running_loop().time() - opened_at >= LINK_LIVED_S:
                backoff_ms = REDIAL_MS_MIN    # a link that lived: dial again at once
            else:                             # one that dies young (a peer or middlebox closing it): back off
                await asyncio.sleep(self._rng.uniform(0, backoff_ms) / 1000)
                backoff_ms = min(2 * backoff_ms, REDIAL_MS_MAX)

    def _failed(self, peer: bytes, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self.last_error.get(peer) != why:
            log.info("reverse_link_failed", extra=fields(peer=self._names(peer), error=why))
        self.last_error[peer] = why

    async def _open(self, peer: bytes, address: str) -> socket.socket:
        """Dial `address`, offer the connection and read the peer's acceptance; the socket then
        belongs to our server."""
        frame = await self._offer(peer, address)
        sock, _ = await dial(address, self._route)
        try:
            loop = asyncio.get_running_loop()
            head = f"POST {REVERSE_PATH} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {len(frame)}\r\n\r\n"
            await loop.sock_sendall(sock, head.encode() + frame)
            answer = bytearray()
            # exactly the acceptance's length: what follows it is the peer's first request, ours to serve
            while len(answer) < len(REVERSE_ACCEPTED):
                chunk = await loop.sock_recv(sock, len(REVERSE_ACCEPTED) - len(answer))
                if not chunk:
                    break
                answer += chunk
            if bytes(answer) != REVERSE_ACCEPTED:
                raise _refusal(bytes(answer))
        except BaseException:
            sock.close()
            raise
        return sock


def _refusal(answer: bytes) -> OfferRefused:
    line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isascii() and parts[1].isdigit() else 0
    if status == 404:
        return OfferRefused(404, "the peer's build has no reverse links (it is older): it cannot send to us "
                                 "unless it can dial us")
    return OfferRefused(status, f"offer not taken: {line[:ANSWER_CHARS_SHOWN]!r}")
