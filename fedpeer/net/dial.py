"""Opening a TCP connection to a peer: directly, or through an HTTP CONNECT proxy.

Every connection this site opens — frames, handshakes, the links an outbound-only site keeps open
for its peers to send back on (fedpeer/net/reverse.py) — is opened here, so a proxy and the
keep-alive apply to all of them alike. The proxy comes from `[network] proxy`, else from the
environment as curl reads it (HTTPS_PROXY / https_proxy, then NO_PROXY / no_proxy: host names,
domain suffixes, IP addresses or CIDR blocks, "*" for all). The CONNECT target is the peer's
configured host and port; loopback addresses never go through a proxy. What a proxy answers is read
as strictly as any stranger's answer: one head of at most PROXY_HEAD_BYTES_MAX, status 200 or a
one-line error naming the proxy (never its credentials).

Every connection gets TCP keep-alive (`[network] keepalive_ms`, at most 25 s): NATs and stateful
firewalls forget a flow that has been idle for 30 s or more, and the probes also tell a site within
seconds that a middlebox dropped a link it keeps open. No TCP_USER_TIMEOUT: since Linux 5.11 it
also ends a connection whose peer holds a zero window that long, which is how our server makes a
sender wait for a read slot; a request written on a link a middlebox dropped without a word waits
for its answer up to `[limits] http_timeout_ms`.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from fedpeer.config.address import is_loopback, parse_address
from fedpeer.config.network import Network, ProxyUrl, parse_proxy

PROXY_HEAD_BYTES_MAX = 8 * 1024     # a proxy's answer to CONNECT: status line and headers
PROXY_STATUS_CHARS_SHOWN = 60       # characters of a proxy's status line quoted in an error
KEEPALIVE_PROBE_INTERVAL_S = 1      # after the idle time: a probe every second ...
KEEPALIVE_PROBES_MAX = 3            # ... and the link is dead after this many unanswered


class ProxyError(ConnectionError):
    """The proxy could not be reached, or refused to open the tunnel (its status says why)."""


@dataclass(frozen=True)
class Route:
    """How this site opens connections: through `proxy` unless the host is in `no_proxy`."""

    proxy: ProxyUrl | None = None
    no_proxy: tuple[str, ...] = ()
    keepalive_ms: int = 20_000

    def proxy_for(self, host: str) -> ProxyUrl | None:
        if self.proxy is None or is_loopback(host) or _bypassed(host, self.no_proxy):
            return None
        return self.proxy


def route_from(network: Network, environ: Mapping[str, str] = os.environ) -> Route:
    """The route [network] and the environment give: ValueError for a bad HTTPS_PROXY."""
    setting = network.proxy or environ.get("HTTPS_PROXY") or environ.get("https_proxy") or ""
    if setting in ("", "none"):
        return Route(None, (), network.keepalive_ms)
    no_proxy = environ.get("NO_PROXY") or environ.get("no_proxy") or ""
    try:
        proxy = parse_proxy(setting)
    except ValueError as exc:
        where = "[network] proxy" if network.proxy else "HTTPS_PROXY"
        raise ValueError(f"{where}: {exc}") from None
    return Route(proxy, tuple(h.strip().lower() for h in no_proxy.split(",") if h.strip()), network.keepalive_ms)


def _bypassed(host: str, no_proxy: tuple[str, ...]) -> bool:
    host = host.lower().strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for entry in no_proxy:
        if entry == "*":
            return True
        if ip is not None:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry = entry.lstrip(".").split(":")[0]
        if host == entry or host.endswith("." + entry):
            return True
    return False


def keep_alive(sock: socket.socket, keepalive_ms: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):   # Linux; elsewhere the system's default idle time
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, keepalive_ms // 1000))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_PROBE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES_MAX)


async def dial(address: str, route: Route) -> tuple[socket.socket, str]:
    """A connected non-blocking socket to `address` ('host:port'), and how: "direct" or "proxy".
    Raises OSError (ConnectionError, ProxyError) like an unreachable peer. The caller bounds the time."""
    try:
        where = parse_address(address)
    except ValueError as exc:
        raise ConnectionError(str(exc)) from None
    proxy = route.proxy_for(where.host)
    if proxy is None:
        return await _connect(where.host, where.port, route.keepalive_ms), "direct"
    try:
        sock = await _connect(proxy.host, proxy.port, route.keepalive_ms)
    except OSError as exc:
        raise ProxyError(f"proxy {proxy}: {exc}") from None
    try:
        await _tunnel(sock, str(where), proxy)
    except BaseException:
        sock.close()
        raise
    return sock, "proxy"


async def _connect(host: str, port: int, keepalive_ms: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    try:
        ip = ipaddress.ip_address(host)
        targets = [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]
    except ValueError:
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ConnectionError(f"cannot resolve {host}: {exc}") from None
        targets = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
    error: OSError = ConnectionError(f"no address for {host}:{port}")
    for family, sockaddr in targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock, keepalive_ms)
            await loop.sock_connect(sock, sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error


async def _tunnel(sock: socket.socket, target: str, proxy: ProxyUrl) -> None:
    """CONNECT target through the proxy on `sock`; returns once the tunnel is open."""
    loop = asyncio.get_running_loop()
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if proxy.user or proxy.password:
        token = base64.b64encode(f"{proxy.user}:{proxy.password}".encode()).decode()
        lines.append(f"Proxy-Authorization: Basic {token}")
    await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode())
    head = bytearray()
    while b"\r\n\r\n" not in head:
        if len(head) >= PROXY_HEAD_BYTES_MAX:
            raise ProxyError(f"proxy {proxy}: answer head too large")
        # one byte at a time past the status line would be slow; the proxy sends nothing after its
        # head until the peer speaks, and the peer speaks only after our request: read what is there
        chunk = await loop.sock_recv(sock, PROXY_HEAD_BYTES_MAX - len(head))
        if not chunk:
            raise ProxyError(f"proxy {proxy} closed the connection before answering CONNECT")
        head += chunk
    end = head.index(b"\r\n\r\n") + 4
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or parts[1] != "200":
        raise ProxyError(f"proxy {proxy} refused CONNECT {target}: {status_line[:PROXY_STATUS_CHARS_SHOWN]!r}")
    if end != len(head):
        raise ProxyError(f"proxy {proxy} sent bytes after its answer to CONNECT")
