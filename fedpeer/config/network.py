"""[network] of peers.toml: how a site reaches its peers and how they reach it back (an HTTP CONNECT
proxy, whether it can be dialed, the links it keeps open, the keep-alive). fedpeer/net/dial.py,
fedpeer/net/reverse.py and fedpeer/daemon/reach.py act on it; docs/operator-guide.md "Sites behind
firewalls" explains it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from fedpeer.config.address import parse_address

REACHABLE_CHOICES = ("auto", "yes", "no")
KEEPALIVE_MS_MAX = 25_000     # NATs and stateful firewalls forget idle flows after 30 s and more (WireGuard: 25 s)
REVERSE_LINKS_MAX = 16


@dataclass(frozen=True)
class Network:
    """[network]: how this site reaches its peers and how they reach it back (fedpeer/net/dial.py,
    fedpeer/net/reverse.py, docs/operator-guide.md "Sites behind firewalls")."""

    proxy: str = ""            # "http://[user:pass@]host:port": an HTTP CONNECT proxy for every outbound
                               # connection; "": HTTPS_PROXY / https_proxy from the environment (NO_PROXY
                               # honoured); "none": never a proxy
    reachable: str = "auto"    # "auto": a peer's dial-back tells whether others can open connections to this
                               # site; "yes": they can (no check); "no": outbound-only (no check)
    reverse_links: int = 2     # connections a site that cannot be dialed keeps open to each peer, for it
                               # to send on
    keepalive_ms: int = 20_000   # TCP keep-alive on idle connections (at most 25 s: NATs and firewalls)

    def __post_init__(self) -> None:
        if self.reachable not in REACHABLE_CHOICES:
            raise ValueError(f"reachable must be one of {', '.join(REACHABLE_CHOICES)}")
        if not 1_000 <= self.keepalive_ms <= KEEPALIVE_MS_MAX:
            raise ValueError(f"keepalive_ms must be between 1000 and {KEEPALIVE_MS_MAX}")
        if not 1 <= self.reverse_links <= REVERSE_LINKS_MAX:
            raise ValueError(f"reverse_links must be between 1 and {REVERSE_LINKS_MAX}")
        if self.proxy not in ("", "none"):
            parse_proxy(self.proxy)


@dataclass(frozen=True)
class ProxyUrl:
    """An HTTP CONNECT proxy: where it listens and the credentials it asks for ("" for none)."""

    host: str
    port: int
    user: str = ""
    password: str = ""

    def __str__(self) -> str:    # never the credentials: this goes into logs and status
        return f"http://{self.host}:{self.port}"


def parse_proxy(text: str) -> ProxyUrl:
    """'http://[user:pass@]host[:port]' (port 8080 by default, as curl's 1080 is for socks). ValueError
    names what is wrong, never the password."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError("proxy must be an http:// URL, like http://proxy.example:3128")
    rest = rest.rstrip("/")
    userinfo, at, hostport = rest.rpartition("@")
    user, _, password = userinfo.partition(":") if at else ("", "", "")
    if "/" in hostport or not hostport:
        raise ValueError("proxy must be http://[user:pass@]host:port, without a path")
    if ":" not in hostport.rsplit("]", 1)[-1]:
        hostport += ":8080"
    try:
        where = parse_address(hostport)
    except ValueError:
        raise ValueError("proxy must be http://[user:pass@]host:port with a port in 1..65535") from None
    return ProxyUrl(where.host, where.port, unquote(user), unquote(password))
