"""The peer port: one POST per frame (and one per session handshake), nothing else.

Both ends are small HTTP/1.1 code of our own: the server (fedpeer/net/server.py) authenticates a
frame's 72-byte header before it reads, or holds a slot for, its body, and reads an authenticated
body straight into the frame's buffer; the client (fedpeer/net/client.py) keeps connections alive
per peer, writes a frame from its own memory, and retries a reliable send with exponential
backoff and full jitter (best-effort sends are tried once). What both share is in
fedpeer/net/http1.py; this module is where the rest of the daemon finds them.
"""

from __future__ import annotations

from fedpeer.net.client import PeerClient
from fedpeer.net.http1 import (
    FDS_RESERVED,
    HELLO_PATH,
    HTTP_HEAD_BYTES_MAX,
    OUTBOUND_CONNECTIONS_MAX,
    PATH,
    REFUSAL_HEADER,
    SendError,
    SendRefused,
    raise_open_files_limit,
)
from fedpeer.net.admission import ByteBudget
from fedpeer.net.server import LARGE_FRAME_BYTES_MIN, PeerServer

__all__ = ["FDS_RESERVED", "HELLO_PATH", "HTTP_HEAD_BYTES_MAX", "LARGE_FRAME_BYTES_MIN", "OUTBOUND_CONNECTIONS_MAX",
           "PATH", "REFUSAL_HEADER", "ByteBudget", "PeerClient", "PeerServer", "SendError", "SendRefused",
           "raise_open_files_limit"]
