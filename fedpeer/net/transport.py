"""aiohttp transport between peers: one POST per frame, nothing else on the peer port.

The server knows nothing of messages: it caps the size, bounds how many bodies are read at once,
and hands the bytes to `on_frame`, which raises `RemoteProtocolError` to reject. The client keeps
connections alive (one pooled session), and retries a reliable send with exponential backoff and
full jitter; best-effort sends (gossip) are tried once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from ..config import Address, Limits
from ..errors import RemoteProtocolError

PATH = "/fedpeer/v1/frame"
log = logging.getLogger("fedpeer.transport")


class SendError(Exception):
    """A frame could not be delivered (after the allowed retries)."""


class PeerServer:
    def __init__(self, listen: Address, limits: Limits,
                 on_frame: Callable[[bytes, str], Awaitable[None]],
                 on_reject: Callable[[RemoteProtocolError, bytes | None, str], None]) -> None:
        """on_frame(frame, peer_ip) raises RemoteProtocolError to reject; on_reject(error, frame,
        peer_ip) is told of frames refused before on_frame (oversize) for counting and logging."""
        self._listen = listen
        self._limits = limits
        self._on_frame = on_frame
        self._on_reject = on_reject
        self._reading = asyncio.Semaphore(limits.inbound_concurrent_max)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=self._limits.message_bytes_max)
        app.router.add_post(PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=self._limits.shutdown_grace_ms / 1000)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._listen.host, self._listen.port,
                           reuse_address=True, reuse_port=False)
        await site.start()   # OSError (e.g. port in use) propagates to the node
        sockets = self._runner.addresses
        self.port = sockets[0][1] if sockets else self._listen.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        peer_ip = request.remote or "?"
        length = request.content_length
        if length is not None and length > self._limits.message_bytes_max:
            self._on_reject(RemoteProtocolError("oversize", f"content-length {length}"), None, peer_ip)
            return web.Response(status=413, text="oversize")
        async with self._reading:   # bounds the memory held by bodies being read and decoded
            try:
                frame = await request.read()
            except web.HTTPRequestEntityTooLarge:
                self._on_reject(RemoteProtocolError("oversize", "body over the cap"), None, peer_ip)
                return web.Response(status=413, text="oversize")
            try:
                await self._on_frame(frame, peer_ip)
            except RemoteProtocolError as exc:
                self._on_reject(exc, frame, peer_ip)
                return web.Response(status=400, text=exc.reason)
        return web.Response(status=204)


class PeerClient:
    def __init__(self, limits: Limits, rng: random.Random | None = None) -> None:
        self._limits = limits
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._best_effort = asyncio.Semaphore(limits.outbound_inflight_max)
        self.dropped_best_effort = 0
        self.sent_bytes = {"reliable": 0, "best_effort": 0}   # frames accepted by peers (for status)

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._limits.http_timeout_ms / 1000,
                                        sock_connect=self._limits.http_connect_timeout_ms / 1000)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=8, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, address: str, frame: bytes, timeout_ms: int | None) -> None:
        assert self._session is not None, "PeerClient.start() not called"
        timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000) if timeout_ms else None
        async with self._session.post(f"http://{address}{PATH}", data=frame,
                                      timeout=timeout or aiohttp.helpers.sentinel) as resp:
            if resp.status != 204:
                reason = (await resp.text())[:100]
                raise SendError(f"{address} refused the frame: HTTP {resp.status} {reason}")

    async def send(self, address: str, frame: bytes) -> None:
        """Reliable send: retries connection failures with backoff and jitter; raises SendError.

        A 400 (the peer rejected the frame) is not retried: the same bytes would be rejected again.
        """
        limits = self._limits
        for attempt in range(limits.send_retries_max + 1):
            try:
                await self._post(address, frame, None)
                self.sent_bytes["reliable"] += len(frame)
                return
            except SendError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                if attempt == limits.send_retries_max:
                    raise SendError(f"{address}: {type(exc).__name__}: {exc}") from None
            cap = min(limits.send_backoff_ms_max, limits.send_backoff_ms * 2 ** attempt)
            await asyncio.sleep(self._rng.uniform(0, cap) / 1000)   # "full jitter"
        raise AssertionError("unreachable")

    async def send_best_effort(self, address: str, frame: bytes, timeout_ms: int) -> bool:
        """One try, short timeout, never raises. Drops (and counts) when too many are in flight."""
        if self._best_effort.locked():
            self.dropped_best_effort += 1
            return False
        async with self._best_effort:
            try:
                await self._post(address, frame, timeout_ms)
                self.sent_bytes["best_effort"] += len(frame)
                return True
            except (SendError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                log.debug("best-effort send to %s failed: %s", address, exc)
                return False
