"""The local admin API: status and jobs for `fedpeer status`, `fedpeer run` and friends.

It listens on a unix socket (default, mode 0600) or on a loopback TCP address, never on the peer
listener: config/load.py refuses a non-loopback admin address, and the peer server routes one path only.

Rules, because every local user and every web page in a local browser can reach a loopback port:
- TCP admin needs a token: a fresh random one per daemon start, in `<state_dir>/admin.token`
  (mode 0600), sent by the CLI as `Authorization: Bearer ...`, compared in constant time. A unix
  socket is already limited to its owner by its mode, so it needs none.
- Browser-style requests are refused before any handler runs: an `Origin` or `Sec-Fetch-*` header,
  a write whose Content-Type is not application/json (a web page's "simple request" is
  text/plain), and on TCP any `Host` but the admin's own address (DNS rebinding).
- Every answer is JSON, errors included (`{"error": "one line"}`), so the CLI always has a message
  to show; a handler that fails answers 500 and the daemon keeps serving.
- Start-up and shut-down only ever delete a socket (lstat, no symlink followed), never a file the
  operator named by mistake (`admin = "unix:identity.key"`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from fedpeer.base.logs import fields
from fedpeer.base.store import atomic_write
from fedpeer.config.load import Config, parse_address
from fedpeer.daemon import adminclient
from fedpeer.daemon.adminclient import ADMIN_TOKEN_FILE, SAFE_METHODS  # noqa: F401  (importers' names)
from fedpeer.errors import ConfigError
from fedpeer.net.bounded import Bounded, close, local_runner, serve

log = logging.getLogger("fedpeer.admin")

UNIX_PATH_BYTES_MAX = 107          # sun_path is 108 bytes with its NUL
ADMIN_TOKEN_BYTES = 32             # 256 random bits: not guessable through a loopback port
ADMIN_REQUEST_BYTES_MAX = 1024**2  # a job proposal is a few hundred bytes
ADMIN_LISTEN_BACKLOG = 128         # connections waiting to be accepted (aiohttp's own default)
BROWSER_HEADERS = ("Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode")   # only browsers send these

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": text}, status=status, headers=headers)


class AdminServer:
    def __init__(self, config: Config, routes: dict[tuple[str, str], Callable[[web.Request], Any]]) -> None:
        """routes: {(method, path): handler}."""
        self._config = config
        self._routes = routes
        self._runner: web.AppRunner | None = None
        self._token: bytes | None = None            # set for a TCP admin address
        self._hosts: frozenset[str] = frozenset()   # the Host headers a TCP admin accepts (its own)
        self._socket_id: tuple[int, int] | None = None   # (st_dev, st_ino) of the socket we made
        self._server: asyncio.Server | None = None        # the TCP listener, bounded
        self.bounded: Bounded | None = None

    async def start(self) -> None:
        """Listen; raises ConfigError (one line) if the address is unusable."""
        app = web.Application(middlewares=[self._guard], client_max_size=ADMIN_REQUEST_BYTES_MAX)
        for (method, path), handler in self._routes.items():
            app.router.add_route(method, path, handler)
        self._runner = local_runner(app)
        await self._runner.setup()
        try:
            if self._config.node.admin_socket is not None:
                await self._start_unix(self._config.node.admin_socket)
            else:
                await self._start_tcp()
        except BaseException:
            await self.stop()   # the node stops only what started: leave no runner, token or socket
            raise

    async def _start_unix(self, sock_path: Path) -> None:
        _clear_stale_socket(self._config, sock_path)
        site = web.UnixSite(self._runner, str(sock_path))
        old_umask = os.umask(0o177)   # the socket is created 0600: only this user may ask
        try:
            await site.start()
        finally:
            os.umask(old_umask)
        st = os.lstat(sock_path)
        self._socket_id = (st.st_dev, st.st_ino)

    async def _start_tcp(self) -> None:
        # Bind before writing the token: a second daemon on a taken port must fail without
        # replacing the token of the one that runs. Connections wait in the backlog until served.
        addr = parse_address(self._config.node.admin)
        own = str(addr).lower()
        self._hosts = frozenset({own, own.removesuffix(":80")})   # clients omit the default port
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(addr.host, addr.port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(sockaddr)
                sock.listen(ADMIN_LISTEN_BACKLOG)
            except OSError:
                sock.close()
                raise
        except OSError as exc:
            raise ConfigError(self._config.path, "node.admin",
                              f"cannot listen on {addr}: {exc.strerror or exc}") from None
        token = secrets.token_urlsafe(ADMIN_TOKEN_BYTES)
        path = token_path(self._config)
        try:
            atomic_write(path, token.encode("ascii") + b"\n", mode=0o600)
        except OSError as exc:
            sock.close()
            raise ConfigError(self._config.path, "node.admin", f"cannot write the admin token {path}: "
                              f"{exc.strerror or exc}; make state_dir writable (and not full)") from None
        self._token = token.encode("ascii")
        self._server, self.bounded = await serve(self._runner, sock=sock)   # connection bounds: net/bounded.py

    async def stop(self) -> None:
        await close(self._server, self._runner)
        self._server = self._runner = None
        sock_path = self._config.node.admin_socket
        if sock_path is not None and self._socket_id is not None:
            _unlink_own_socket(sock_path, self._socket_id)
            self._socket_id = None
        if self._token is not None:
            _unlink_own_token(token_path(self._config), self._token)
            self._token = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except web.HTTPException as exc:   # the router's 404/405, the body cap's 413
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return error_response(exc.status, f"{request.method} {request.path}: {exc.text or exc.reason}",
                                  allow)
        except Exception as exc:   # one request fails, never the daemon (a bug or an I/O error)
            log.error("admin_request_failed", exc_info=True,
                      extra=fields(method=request.method, path=request.path, error=f"{type(exc).__name__}: {exc}"))
            return error_response(500, f"{request.method} {request.path} failed in the daemon: "
                                  f"{type(exc).__name__}: {exc}; see the daemon's log")

    def _refusal(self, request: web.Request) -> web.Response | None:
        """403 for what only a browser (or a rebinding attack) sends; 401 without the token."""
        if self._hosts:
            host = request.headers.get("Host", "").lower()
            if host not in self._hosts:
                return error_response(403, f"Host {host!r} is not this admin endpoint {self._config.node.admin}; "
                                      f"refused (DNS rebinding guard): ask http://{self._config.node.admin}")
        for name in BROWSER_HEADERS:
            if name in request.headers:
                return error_response(403, f"browser requests are refused ({name} header present); "
                                      "use the fedpeer command line")
        if request.method not in SAFE_METHODS and request.content_type != "application/json":
            return error_response(403, f"{request.method} needs Content-Type: application/json, "
                                  f"got {request.headers.get('Content-Type', 'none')!r}")
        if self._token is not None and not _token_matches(request.headers.get("Authorization", ""), self._token):
            return error_response(401, "missing or wrong admin token: send 'Authorization: Bearer <token>' "
                                  f"with the contents of {token_path(self._config)} (rewritten at each start)",
                                  {"WWW-Authenticate": "Bearer"})
        return None


def _token_matches(authorization: str, token: bytes) -> bool:
    scheme, _, given = authorization.partition(" ")
    # compare_digest takes time independent of where the strings differ (no timing oracle)
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), token) and scheme.lower() == "bearer"


def _clear_stale_socket(config: Config, path: Path) -> None:
    """Remove a socket left by a daemon that died; refuse anything that is not a socket."""
    if len(os.fsencode(path)) > UNIX_PATH_BYTES_MAX:
        raise ConfigError(config.path, "node.admin",
                          f"unix socket path longer than {UNIX_PATH_BYTES_MAX} bytes: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)   # lstat: a symlink is not a socket, whatever it points to
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(config.path, "node.admin", f"{path} exists and is not a socket; refusing to delete it "
                          "(name a new path for the admin socket)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        _unlink_own_socket(path, (st.st_dev, st.st_ino))   # left by a daemon that died: nobody listens
        return
    finally:
        probe.close()
    raise ConfigError(config.path, "node.admin", f"another fedpeer daemon is already running on {path}")


def _unlink_own_socket(path: Path, socket_id: tuple[int, int]) -> None:
    """Unlink `path` only if it is still the very socket we saw (not a file put there since)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == socket_id:
        path.unlink(missing_ok=True)


def _unlink_own_token(path: Path, token: bytes) -> None:
    """Remove our token file, not one a later daemon on the same state_dir has written."""
    try:
        if path.read_bytes().strip() == token:
            path.unlink(missing_ok=True)
    except OSError:
        pass   # already gone or unreadable: nothing of ours to remove


# The client side lives in fedpeer/daemon/adminclient.py (it imports no aiohttp, so the CLI starts
# fast); importers keep these names.
request, read_token, token_path = adminclient.request, adminclient.read_token, adminclient.token_path
