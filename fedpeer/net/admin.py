"""The local admin API: status (and, later, jobs) for `fedpeer status` and friends.

It listens on a unix socket (default, mode 0600) or on a loopback TCP address, never on the peer
listener: config.py refuses a non-loopback admin address, and the peer server routes one path only.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ..config import Config, parse_address
from ..errors import ConfigError, FedpeerError, NoDaemonError

UNIX_PATH_BYTES_MAX = 107   # sun_path is 108 bytes with its NUL
ADMIN_TIMEOUT_MS = 5_000


class AdminServer:
    def __init__(self, config: Config, routes: dict[tuple[str, str], Callable[[web.Request], Any]]) -> None:
        """routes: {(method, path): handler}."""
        self._config = config
        self._routes = routes
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        for (method, path), handler in self._routes.items():
            app.router.add_route(method, path, handler)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock_path = self._config.node.admin_socket
        if sock_path is not None:
            await _clear_stale_socket(self._config, sock_path)
            site: web.BaseSite = web.UnixSite(self._runner, str(sock_path))
            old_umask = os.umask(0o177)   # the socket is created 0600: only this user may ask
            try:
                await site.start()
            finally:
                os.umask(old_umask)
        else:
            addr = parse_address(self._config.node.admin)
            site = web.TCPSite(self._runner, addr.host, addr.port)
            try:
                await site.start()
            except OSError as exc:
                raise ConfigError(self._config.path, "node.admin", f"cannot listen on {addr}: {exc.strerror}") from None

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        sock_path = self._config.node.admin_socket
        if sock_path is not None:
            sock_path.unlink(missing_ok=True)


async def _clear_stale_socket(config: Config, path: Path) -> None:
    if len(os.fsencode(path)) > UNIX_PATH_BYTES_MAX:
        raise ConfigError(config.path, "node.admin", f"unix socket path longer than {UNIX_PATH_BYTES_MAX} bytes: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)   # left by a daemon that died: nobody is listening
        return
    finally:
        probe.close()
    raise ConfigError(config.path, "node.admin", f"another fedpeer daemon is already running on {path}")


async def request(config: Config, method: str, path: str, payload: Any = None,
                  timeout_ms: int = ADMIN_TIMEOUT_MS) -> Any:
    """Ask the local daemon. Raises NoDaemonError when nothing answers."""
    sock_path = config.node.admin_socket
    if sock_path is not None:
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=str(sock_path))
        base = "http://fedpeer"
    else:
        connector = aiohttp.TCPConnector()
        base = f"http://{config.node.admin}"
    timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.request(method, base + path, json=payload) as resp:
                doc = await resp.json()
                if resp.status >= 400:
                    raise FedpeerError(doc.get("error", f"HTTP {resp.status}"))
                return doc
    except (aiohttp.ClientConnectionError, FileNotFoundError, ConnectionRefusedError, asyncio.TimeoutError) as exc:
        raise NoDaemonError(f"no fedpeer daemon answers at {config.node.admin} ({type(exc).__name__}); "
                            f"is 'fedpeer start --config {config.path}' running?") from None
