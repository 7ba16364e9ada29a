"""What the peer port's server and client share: its paths, the refusal header, how a request's
header lines and keep-alive are read, the errors a send raises, and the process's open-files budget
(fedpeer/net/transport.py has the overview)."""

from __future__ import annotations

import logging
import resource

from fedpeer.base.logs import fields

PATH = "/fedpeer/v1/frame"
HELLO_PATH = "/fedpeer/v1/hello"      # a session's handshake: a hello in, a welcome out (fedpeer/wire/session.py)
REVERSE_PATH = "/fedpeer/v1/reverse"  # an offer: the connection turns round for us to send on (fedpeer/net/reverse.py)
RELAY_PATH = "/fedpeer/v1/relay"      # a frame or hello for a third member, forwarded (fedpeer/net/relay.py)
REVERSE_ACCEPTED = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"   # then the dialer serves, we request
REFUSAL_HEADER = "X-Fedpeer-Refusal"
HTTP_HEAD_BYTES_MAX = 8 * 1024          # request line + headers; our client sends ~90 bytes
FDS_RESERVED = 320                      # descriptors kept for outbound connections, state files, and the
                                        # local listeners (admin, metrics: LOCAL_CONNECTIONS_MAX each)
OUTBOUND_CONNECTIONS_MAX = 256          # the client's connections in use (counted in FDS_RESERVED)
OUTBOUND_PER_PEER_MAX = 8               # of those, to one peer
END_OF_HEAD = b"\r\n\r\n"                # ends a request's or an answer's head
NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"   # the server's whole answer to a frame delivered on a kept connection
log = logging.getLogger("fedpeer.transport")
_NAME_SPACE = frozenset(" \t\r\n\v\f")   # whitespace a header name may not hold
CONTENT_LENGTH_DIGITS_MAX = 12         # a request's Content-Length digits (< 1 TB; message_bytes_max then bounds it)
STATUS_TEXT = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout",
                405: "Method Not Allowed", 411: "Length Required", 413: "Payload Too Large",
                429: "Too Many Requests", 431: "Request Header Fields Too Large", 502: "Bad Gateway",
                503: "Service Unavailable"}
_OUR_PATHS = (PATH, HELLO_PATH, REVERSE_PATH, RELAY_PATH)


class SendError(Exception):
    """A frame could not be delivered (after the allowed retries)."""


class SendRefused(SendError):
    """The peer answered 400: it refused the frame. `tag` proves the refusal if the peer verified us."""

    def __init__(self, address: str, reason: str, tag: str) -> None:
        super().__init__(f"{address} refused the frame: {reason}")
        self.reason, self.tag = reason, tag
        self.frame: bytes | None = None      # set by the node: the refused frame, to check the tag


def parse_header_lines(lines: list[str], unique: tuple[str, ...] = ()) -> dict[str, str]:
    """A head's header lines ("Name: value", without their CRLF) -> {lower-case name: value}, the
    value without the optional whitespace (SP, HTAB) around it (RFC 9112 §5). Raises ValueError
    for a line without a colon, whitespace in or around the name (before the colon: RFC 9112
    §5.1 says reject it; at the start of a line: an obsolete folded line, §5.2), or a repeated
    header named in `unique` (lower case); any other repeated header keeps its last value."""
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError("header line without a colon")
        if not name or not _NAME_SPACE.isdisjoint(name):
            raise ValueError("whitespace in a header name, or a folded header line")
        name = name.lower()
        if name in headers and name in unique:
            raise ValueError(f"repeated {name} header")
        headers[name] = value.strip(" \t")
    return headers


def keep_alive(version: str, headers: dict[str, str]) -> bool:
    """Whether the connection stays open after this request or answer: under HTTP/1.1 unless it
    says "Connection: close", under HTTP/1.0 only if it says "Connection: keep-alive"."""
    connection = headers.get("connection", "").lower()
    return connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one (the usual 1,024 is few for a server);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("open_files_limit", extra=fields(soft=soft, hard=hard, error=str(exc)))
    return soft


class HttpReply(Exception):
    """The peer server answers the current request with `status` and `reason`, then close the connection."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def parse_request_head(head: bytes) -> tuple[str, int, bool]:
    """(path, content length, keep-alive) of a request for one of our paths; raises HttpReply otherwise
    (the length is checked against the cap by the caller: the peer server's)."""
    try:
        text = head.decode("latin-1")
        request_line, *header_lines = text[:-len(END_OF_HEAD)].split("\r\n")
        method, target, version = request_line.split(" ")
    except ValueError:
        raise HttpReply(400, "bad_request") from None
    if target not in _OUR_PATHS:
        raise HttpReply(404, "not_found")
    if method != "POST":
        raise HttpReply(405, "method_not_allowed")
    try:   # a repeated length or transfer-encoding is a request smuggling shape: refuse, do not guess
        headers = parse_header_lines(header_lines, unique=("content-length", "transfer-encoding"))
    except ValueError:
        raise HttpReply(400, "bad_request") from None
    if "transfer-encoding" in headers:
        raise HttpReply(411, "length_required")     # frames have a length; no chunked bodies
    length_text = headers.get("content-length", "")
    # ASCII digits only: latin-1 "²" is a digit to isdigit() and not to int()
    if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > CONTENT_LENGTH_DIGITS_MAX:
        raise HttpReply(411, "length_required")
    return target, int(length_text), keep_alive(version, headers)
