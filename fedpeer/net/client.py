"""The peer port's client: a small keep-alive HTTP/1.1 client for one POST per frame (and one per
session handshake), speaking to the server of fedpeer/net/server.py — or to whatever answers at a
peer's address, so its answer is parsed as strictly as any stranger's (fedpeer/net/link.py).

A request to a peer takes the first of three paths that is there:
1. a link the peer dialed to us and handed over (`adopt`: it cannot be dialed, fedpeer/net/reverse.py);
2. a connection we dial, directly or through a proxy (fedpeer/net/dial.py), kept alive and pooled
   per peer address (at most OUTBOUND_PER_PEER_MAX in use per peer and OUTBOUND_CONNECTIONS_MAX in
   all; an idle one is closed after KEEPALIVE_S, or when the peer closed it);
3. a member that forwards it (`relay`, set by fedpeer/net/links.py), when the dial failed — the
   direct path is then not tried again for DIRECT_RETRY_S.
`routes` says, per peer, which path its last request took (for status). A reliable send retries
connection failures with exponential backoff and full jitter; a peer's answer (a 400 with its
reason and its refusal tag) is not retried; best-effort sends (gossip) are tried once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections import Counter
from collections.abc import Awaitable, Callable

from fedpeer.config.load import Limits
from fedpeer.net.dial import Route, dial, keep_alive
from fedpeer.net.http1 import (
    HELLO_PATH,
    OUTBOUND_CONNECTIONS_MAX,
    OUTBOUND_PER_PEER_MAX,
    PATH,
    REFUSAL_HEADER,
    SendError,
    SendRefused,
)
from fedpeer.net.link import DELIVERED, Answer, Link, replayed
from fedpeer.wire.session import WELCOME_BYTES

KEEPALIVE_S = 30.0                  # an idle connection is closed after this long (the server waits 60 s)
IDLE_SWEEP_S = KEEPALIVE_S / 2      # how often idle connections are looked for (one lives at most 1.5x KEEPALIVE_S)
HEAD_PREFIXES_MAX = 4096            # request-head prefixes cached, one per (address, path); cleared beyond that
REFUSAL_BODY_BYTES_READ = 400       # bytes of a refusal's body decoded for its reason ...
REFUSAL_REASON_CHARS_MAX = 100      # ... and the characters of it kept
REFUSAL_TAG_CHARS_MAX = 64          # characters of a refusal's X-Fedpeer-Refusal tag kept (ours are 32 hex digits)
DIRECT_RETRY_S = 30.0               # a peer we could not dial goes through a relay this long before we dial again
log = logging.getLogger("fedpeer.transport")

Relay = Callable[[bytes, str, bytes | bytearray | memoryview], Awaitable[Answer]]


class _Adopted:
    """The links one peer dialed to us for us to send on: idle ones, and how many are open."""

    def __init__(self) -> None:
        self.idle: list[Link] = []
        self.count = 0
        self.reach = "unknown"            # what the peer said of itself when it offered them
        self.closed = False               # the peer left peers.toml, or we stop: busy links close on return
        self._changed = asyncio.Event()

    async def take(self) -> Link | None:
        """An idle link (waiting for one while all are busy); None once there are none."""
        while True:
            while self.idle:
                link = self.idle.pop()
                if link.still_open():
                    return link
                self.lost(link)
            if self.count == 0:
                return None
            self._changed.clear()
            await self._changed.wait()

    def add(self, link: Link) -> None:
        self.count += 1
        self.give(link)

    def give(self, link: Link) -> None:
        if self.closed:
            link.close()
            return
        self.idle.append(link)
        self._changed.set()

    def lost(self, link: Link) -> None:
        link.close()
        if not self.closed:
            self.count -= 1
        self._changed.set()

    def close(self) -> None:
        self.closed = True
        for link in self.idle:
            link.close()
        self.idle.clear()
        self.count = 0
        self._changed.set()


class PeerClient:
    def __init__(self, limits: Limits, rng: random.Random | None = None, route: Route | None = None) -> None:
        self._limits = limits
        self._rng = rng or random.Random()
        self._route = route or Route()
        self._best_effort = asyncio.Semaphore(limits.outbound_inflight_max)
        self._in_use = asyncio.Semaphore(OUTBOUND_CONNECTIONS_MAX)
        self._per_peer: dict[str, asyncio.Semaphore] = {}
        self._idle: dict[str, list[tuple[Link, float]]] = {}   # address -> (connection, idle since), LIFO
        self._heads: dict[tuple[str, str], bytes] = {}                   # (address, path) -> request head prefix
        self._sweep: asyncio.TimerHandle | None = None
        self._running = False
        self._adopted: dict[bytes, _Adopted] = {}          # peer -> links it dialed to us
        self._direct_down: dict[bytes, float] = {}         # peer -> when (loop time) to try dialing it again
        self._probing: dict[bytes, asyncio.Task] = {}      # peer -> its dial in the background
        self.relay: Relay | None = None                     # set by fedpeer/net/links.py
        self.routes: dict[bytes, str] = {}                  # peer -> "direct", "proxy", "inbound", "relay:<name>"
        self.dropped_best_effort = 0
        self.sent_bytes = {"reliable": 0, "best_effort": 0}   # frames accepted by peers (for status)
        self.sent_bytes_by_peer: Counter[tuple[bytes, str]] = Counter()   # (peer key, class) -> bytes

    @property
    def route(self) -> Route:
        return self._route

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
        for adopted in self._adopted.values():
            adopted.close()
        self._adopted.clear()
        for task in self._probing.values():
            task.cancel()
        self._probing.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    # -- links peers dialed to us (fedpeer/net/reverse.py) --------------------------------------

    def adopt(self, peer: bytes, sock: socket.socket, reach: str) -> None:
        """`peer` dialed `sock` to us for us to send on (its session verified on the offer)."""
        if not self._running:
            sock.close()
            return
        keep_alive(sock, self._route.keepalive_ms)
        adopted = self._adopted.setdefault(peer, _Adopted())
        adopted.reach = reach
        adopted.add(Link(asyncio.get_running_loop(), sock, "inbound"))

    def adopted(self, peer: bytes) -> tuple[int, str] | None:
        """(links open, what the peer said of its reach) for a peer that dialed links to us."""
        adopted = self._adopted.get(peer)
        if adopted is None:
            return None
        for link in [link for link in adopted.idle if not link.still_open()]:   # the peer closed it
            adopted.idle.remove(link)
            adopted.lost(link)
        return None if adopted.count == 0 else (adopted.count, adopted.reach)

    def forget(self, peer: bytes) -> None:
        """`peer` left peers.toml: the links it dialed to us are closed."""
        adopted = self._adopted.pop(peer, None)
        if adopted is not None:
            adopted.close()
        self._direct_down.pop(peer, None)
        self.routes.pop(peer, None)
        probing = self._probing.pop(peer, None)
        if probing is not None:
            probing.cancel()

    # -- connections ---------------------------------------------------------------------------

    def _take_idle(self, address: str, now: float) -> Link | None:
        idle = self._idle.get(address)
        while idle:
            link, since = idle.pop()
            if now - since < KEEPALIVE_S and link.still_open():
                return link
            link.close()
        return None

    def _release(self, address: str, link: Link, now: float) -> None:
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

    async def _connect(self, address: str) -> Link:
        sock, how = await dial(address, self._route)
        return Link(asyncio.get_running_loop(), sock, how)

    def _head(self, address: str, path: str, length: int) -> bytes:
        prefix = self._heads.get((address, path))
        if prefix is None:
            if len(self._heads) > HEAD_PREFIXES_MAX:
                self._heads.clear()
            prefix = f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: ".encode()
            self._heads[(address, path)] = prefix
        return b"%s%d\r\n\r\n" % (prefix, length)

    # -- one request ---------------------------------------------------------------------------

    async def exchange(self, address: str, body: bytes | bytearray | memoryview, path: str, peer: bytes = b"",
                       timeout_ms: int | None = None, relay_ok: bool = True) -> Answer:
        """POST `body` to `peer` at `address` by the first path that is there (the module's
        docstring) and return its answer, whatever its status. OSError / TimeoutError when no
        path delivered it."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout((timeout_ms or self._limits.http_timeout_ms) / 1000):
            adopted = self._adopted.get(peer) if peer else None
            if adopted is not None and adopted.count:
                link = await adopted.take()
                if link is not None:
                    return await self._over_adopted(adopted, link, peer, path, address, body)
            relayed_before = False       # a relay took it and failed: it may have reached the peer
            if relay_ok and self.relay is not None and peer and peer in self._direct_down:
                if self._direct_down[peer] <= loop.time():
                    self._probe_direct(peer, address)     # in the background: no send waits for a dial
                try:
                    return await self.relay(peer, path, body)
                except OSError:     # no relay either: dial, as if we had never failed
                    self._direct_down.pop(peer, None)
                    relayed_before = True
            per_peer = self._per_peer.get(address)
            if per_peer is None:
                per_peer = self._per_peer[address] = asyncio.Semaphore(OUTBOUND_PER_PEER_MAX)
            async with per_peer, self._in_use:
                link = self._take_idle(address, loop.time())
                failed: OSError | TimeoutError | None = None
                if link is None:
                    try:
                        async with asyncio.timeout(self._limits.http_connect_timeout_ms / 1000):
                            link = await self._connect(address)
                    except (OSError, TimeoutError) as exc:
                        if not (relay_ok and self.relay is not None and peer):
                            raise
                        failed = exc
                if link is not None:
                    fresh = not link.used
                    try:
                        answer = await self._over(link, address, path, body)
                    except ConnectionError as exc:
                        # a connection that opened and was reset before it answered anything is a
                        # firewall's way to refuse too (one that inspects, then resets): relay
                        if not (fresh and relay_ok and self.relay is not None and peer):
                            raise
                        failed = exc
                    else:
                        if peer:
                            self._direct_down.pop(peer, None)
                            self.routes[peer] = link.via
                        return answer
            assert self.relay is not None and failed is not None
            try:
                answer = await self.relay(peer, path, body)
            except OSError:
                raise failed from None     # the dial's own error says more than "no relay"
            self._direct_down[peer] = loop.time() + DIRECT_RETRY_S   # a relay works: skip the dial a while
            if path == PATH and replayed(answer) and (relayed_before or isinstance(failed, ConnectionError)):
                return DELIVERED      # a reset connection or an earlier relay delivered it, its answer lost
            return answer

    def _probe_direct(self, peer: bytes, address: str) -> None:
        """Dial a peer we reach through a relay, off every send's path: connected, its requests go
        direct again; not, the relay keeps them for DIRECT_RETRY_S more."""
        if peer in self._probing:
            return
        loop = asyncio.get_running_loop()
        self._direct_down[peer] = loop.time() + DIRECT_RETRY_S

        async def probe() -> None:
            try:
                async with asyncio.timeout(self._limits.http_connect_timeout_ms / 1000):
                    link = await self._connect(address)
            except (OSError, TimeoutError):
                return
            finally:
                self._probing.pop(peer, None)
            self._direct_down.pop(peer, None)
            self._release(address, link, loop.time())

        self._probing[peer] = loop.create_task(probe())

    async def _over(self, link: Link, address: str, path: str, body: bytes | bytearray | memoryview) -> Answer:
        answer = None
        try:
            answer = await link.exchange(self._head(address, path, len(body)), body)
            link.used = True
            return answer
        finally:
            if answer is not None and answer.keep and not link.broken:
                self._release(address, link, asyncio.get_running_loop().time())
            else:
                link.close()

    async def _over_adopted(self, adopted: _Adopted, link: Link, peer: bytes, path: str, address: str,
                            body: bytes | bytearray | memoryview) -> Answer:
        answer = None
        try:
            answer = await link.exchange(self._head(address, path, len(body)), body)
            self.routes[peer] = "inbound"
            return answer
        finally:
            if answer is not None and answer.keep and not link.broken:
                adopted.give(link)
            else:
                adopted.lost(link)

    async def _post(self, address: str, frame: bytes | bytearray | memoryview, timeout_ms: int | None,
                    path: str = PATH, peer: bytes = b"", relay_ok: bool = True) -> bytes:
        """POST one frame (or hello); the answer's body for a hello (its welcome), else b""."""
        return answer_body(address, await self.exchange(address, frame, path, peer, timeout_ms, relay_ok), path)

    async def hello(self, address: str, hello: Callable[[], bytes], timeout_ms: int | None, retries: int,
                    peer: bytes = b"", relay_ok: bool = True) -> bytes:
        """A session handshake: the peer's welcome to the last hello sent. Retries connection
        failures and timeouts like `send`, each try with a fresh hello from `hello()`: the peer
        refuses a hello it answered before as a replay, and a loaded peer often answers a try
        after the try gave up on it."""
        return await self._with_retries(address, retries,
                                        lambda: self._post(address, hello(), timeout_ms, HELLO_PATH, peer, relay_ok))

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

    async def send(self, address: str, frame: bytes | bytearray | memoryview, peer: bytes = b"") -> None:
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
                return await self._post(address, frame, None, PATH, peer)
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
                await self._post(address, frame, timeout_ms, PATH, peer)
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


def answer_body(address: str, answer: Answer, path: str) -> bytes:
    """What a peer's answer to a POST at `path` means: the welcome of a hello, b"" for a delivered
    frame; SendRefused (a 400: its reason and refusal tag) or SendError otherwise."""
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
