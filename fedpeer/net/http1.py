"""What the peer port's server and client share: its two paths, the refusal header, the errors a
send raises, and the process's open-files budget (fedpeer/net/transport.py has the overview)."""

from __future__ import annotations

import logging
import resource

from ..logs import fields

PATH = "/fedpeer/v1/frame"
HELLO_PATH = "/fedpeer/v1/hello"      # a session's handshake: a hello in, a welcome out (fedpeer/session.py)
REFUSAL_HEADER = "X-Fedpeer-Refusal"
HTTP_HEAD_BYTES_MAX = 8 * 1024          # request line + headers; our client sends ~90 bytes
FDS_RESERVED = 320                      # descriptors kept for outbound connections, state files, admin
OUTBOUND_CONNECTIONS_MAX = 256          # the client's connections in use (counted in FDS_RESERVED)
OUTBOUND_PER_PEER_MAX = 8               # of those, to one peer
log = logging.getLogger("fedpeer.transport")


class SendError(Exception):
    """A frame could not be delivered (after the allowed retries)."""


class SendRefused(SendError):
    """The peer answered 400: it refused the frame. `tag` proves the refusal if the peer verified us."""

    def __init__(self, address: str, reason: str, tag: str) -> None:
        super().__init__(f"{address} refused the frame: {reason}")
        self.reason, self.tag = reason, tag
        self.frame: bytes | None = None      # set by the node: the refused frame, to check the tag


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
