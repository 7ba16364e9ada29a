"""A host and port as peers.toml writes them ('host:port', '[v6]:port'), and whether a host is loopback."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_wildcard(self) -> bool:
        return self.host in ("0.0.0.0", "::", "")


def parse_address(text: str, *, allow_port_zero: bool = False) -> Address:
    """'host:port' or '[v6]:port' -> Address. Raises ValueError with the problem."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected 'host:port'")
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"bad address {text!r}: expected '[v6-address]:port'")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"bad address {text!r}: expected 'host:port'")
    if not host or any(c.isspace() or c in "/?#@" for c in host):
        raise ValueError(f"bad address {text!r}: bad host")
    if not port_text.isdigit():
        raise ValueError(f"bad address {text!r}: port must be a number")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise ValueError(f"bad address {text!r}: port out of range")
    return Address(host, port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
