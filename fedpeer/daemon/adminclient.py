"""Asking the local daemon's admin API (fedpeer/daemon/admin.py serves it): one request, one JSON
answer, over the unix socket or the loopback TCP address, with the token a TCP endpoint wants.

Plain HTTP/1.1 on asyncio's streams, one connection per request (`Connection: close`): the
commands that ask the daemon (`status`, `jobs`, `run` ...) then start without importing aiohttp,
which took ~0.1 s of every `fedpeer status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedpeer.config.load import parse_address
from fedpeer.errors import ConfigError, FedpeerError, NoDaemonError

ADMIN_TIMEOUT_MS = 5_000
ADMIN_TOKEN_FILE = "admin.token"   # in state_dir; only for a TCP admin address
ERROR_TEXT_CHARS_MAX = 300         # of a non-JSON answer, quoted in the CLI's one-line error
ANSWER_HEAD_BYTES_MAX = 64 * 1024  # an answer's status line and headers
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Target:
    """Where a daemon's admin API is: its address, the state dir holding a TCP endpoint's token,
    and the configuration file (named in messages)."""

    admin: str            # "unix:/abs/path" or "127.0.0.1:PORT"
    state_dir: Path
    config_path: Path

    @property
    def admin_socket(self) -> Path | None:
        return Path(self.admin[5:]) if self.admin.startswith("unix:") else None


def target_of(config: Any) -> Target:
    """A Target from a loaded Config, a config/locate.py `Running` record, or a Target."""
    if isinstance(config, Target):
        return config
    if hasattr(config, "node"):
        return Target(config.node.admin, config.node.state_dir, config.path)
    return Target(config.admin, config.state_dir, config.config_path)


def token_path(config: Any) -> Path:
    return target_of(config).state_dir / ADMIN_TOKEN_FILE


def read_token(config: Any) -> str | None:
    """The running daemon's admin token, or None when there is none (no TCP daemon has started)."""
    target = target_of(config)
    path = token_path(target)
    try:
        return path.read_text(encoding="ascii").strip() or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        problem = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(target.config_path, "node.admin", f"cannot read the admin token {path}: {problem}; "
                          "run this command as the user the daemon runs as") from None


async def request(config: Any, method: str, path: str, payload: Any = None,
                  timeout_ms: int = ADMIN_TIMEOUT_MS) -> Any:
    """Ask the local daemon. Raises NoDaemonError when nothing answers, FedpeerError (one line)
    for a refusal or an answer that is not JSON."""
    target = target_of(config)
    headers = {"Accept": "application/json"}
    body = b""
    if method not in SAFE_METHODS:
        headers["Content-Type"] = "application/json"
        body = json.dumps(payload if payload is not None else {}).encode("utf-8")
    unix = target.admin_socket is not None
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            # A daemon starting binds its port, then writes its new token, then serves: a request
            # queued in that window carries the old token (or none) and gets 401. The token file
            # has changed by then, so one retry with the new one is all it takes.
            sent = None
            for _ in range(2):
                headers.pop("Authorization", None)
                if not unix:
                    sent = read_token(config)
                    if sent is not None:
                        headers["Authorization"] = f"Bearer {sent}"
                status, content_type, answer = await _exchange(target, method, path, headers, body)
                if status != 401 or unix or read_token(config) == sent:
                    break
    except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
        raise NoDaemonError(f"no fedpeer daemon answers at {target.admin} ({type(exc).__name__}); "
                            f"is 'fedpeer start --config {target.config_path}' running?") from None
    return _answer(target, method, path, status, content_type, answer)


async def _exchange(target: Target, method: str, path: str, headers: dict[str, str],
                    body: bytes) -> tuple[int, str, bytes]:
    """(status, content type, body) of one HTTP/1.1 request on a fresh connection."""
    sock_path = target.admin_socket
    if sock_path is not None:
        reader, writer = await asyncio.open_unix_connection(str(sock_path), limit=ANSWER_HEAD_BYTES_MAX)
        host = "fedpeer"
    else:
        address = parse_address(target.admin)
        reader, writer = await asyncio.open_connection(address.host, address.port, limit=ANSWER_HEAD_BYTES_MAX)
        host = str(address)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close",
                 *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _not_http(target, method, path) from None
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not (rest[:3].isascii() and rest[:3].isdigit()):
            raise _not_http(target, method, path)
        fields = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip().lower()] = value.strip()
        if fields.get("transfer-encoding", "").lower() == "chunked":
            answer = await _read_chunked(reader)
        elif "content-length" in fields and fields["content-length"].isascii() and fields["content-length"].isdigit():
            answer = await reader.readexactly(int(fields["content-length"]))
        else:
            answer = await reader.read()
        return int(rest[:3]), fields.get("content-type", "").partition(";")[0].strip(), answer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.read()       # trailers, then the end: the server closes the connection
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _not_http(target: Target, method: str, path: str) -> FedpeerError:
    return FedpeerError(f"{method} {path} at {target.admin}: the answer is not HTTP; "
                        "is this address really the fedpeer daemon's admin endpoint?")


def _answer(target: Target, method: str, path: str, status: int, content_type: str, body: bytes) -> Any:
    """The answer's JSON document, or a one-line FedpeerError."""
    try:
        doc = json.loads(body)
    except ValueError:
        text = " ".join(body.decode("utf-8", "replace").split())[:ERROR_TEXT_CHARS_MAX]
        raise FedpeerError(f"{method} {path} at {target.admin}: HTTP {status} answered with "
                           f"{content_type or 'no content type'}, not JSON: {text!r}; "
                           "is this address really the fedpeer daemon's admin endpoint?") from None
    if status >= 400:
        error = doc.get("error") if isinstance(doc, dict) else None
        raise FedpeerError(str(error) if error else f"{method} {path}: HTTP {status}")
    return doc
