"""Members relay for each other: a frame (or a session's hello) for a member we cannot reach,
forwarded by a member that reaches us both.

The sender seals, under its session with the relay, a RelayRequest holding the frame exactly as it
would have sent it to the destination — sealed under *their* session, end to end — and POSTs it to
the relay's RELAY_PATH. The relay's server authenticates the request like any frame (it is from a
member; strangers get no relay), checks `[policy] relay` and its budgets, and POSTs the inner bytes
to the destination by whatever path it has (a direct dial, a proxy, a link the destination dialed
to it). The destination's answer — 204, a welcome, or a refusal with its tag — comes back to the
sender in the relay's 200 (`wrap` / `unwrap`), so the sender reads it as if it had come straight.

The relay learns that the two members talk, when, and how many bytes: never what. It cannot alter a
frame unseen (the destination's AEAD check refuses it) nor replay one (its replay window), and it
cannot forge an answer's refusal tag. A relay that fails to forward is a lost send (the sender's
retries and its other relays, RELAY_TRIES_MAX, go on); one that drops a frame and answers 204 —
not authenticated, as on a direct link — leaves the loss to the job's own timeouts.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fedpeer.errors import RemoteProtocolError
from fedpeer.identity import PUBLIC_KEY_BYTES
from fedpeer.net.client import PeerClient
from fedpeer.net.http1 import HELLO_PATH, PATH, REFUSAL_HEADER
from fedpeer.net.link import ANSWER_BODY_BYTES_MAX, Answer, BadAnswer
from fedpeer.wire.schema import register, v_bytes, v_str

RELAY_TRIES_MAX = 3            # relays a send tries before it fails (then the sender's own retries)
RELAY_TIMEOUT_MS = 30_000      # the relay's request to the destination (its own retries not included)
_PATHS = {"frame": PATH, "hello": HELLO_PATH}
_NAMES = {v: k for k, v in _PATHS.items()}
_WRAP = struct.Struct("<HH")   # the destination's status, the length of its refusal tag
log = logging.getLogger("fedpeer.transport")


@dataclass(frozen=True)
class RelayRequest:
    dst: bytes
    path: str                      # "frame" or "hello"
    payload: bytes | memoryview    # sealed for `dst`: the relay reads none of it


register("relay_request", RelayRequest, {"dst": v_bytes(PUBLIC_KEY_BYTES), "path": v_str(8, frozenset(_PATHS)),
                                         "payload": v_bytes(view=True)})


def request(dst: bytes, path: str, payload: bytes | bytearray | memoryview) -> RelayRequest:
    return RelayRequest(dst, _NAMES[path], payload)


def wrap(answer: Answer) -> bytes:
    tag = answer.headers.get(REFUSAL_HEADER.lower(), "").encode("latin-1")[:255]
    return _WRAP.pack(answer.status, len(tag)) + tag + answer.body[:ANSWER_BODY_BYTES_MAX]


def unwrap(body: bytes) -> Answer:
    """The destination's answer inside a relay's 200; BadAnswer when it is not one."""
    if len(body) < _WRAP.size:
        raise BadAnswer("relay answer cut short")
    status, tag_len = _WRAP.unpack_from(body)
    if not 200 <= status <= 599 or len(body) < _WRAP.size + tag_len:
        raise BadAnswer("not a relayed answer")
    tag = body[_WRAP.size:_WRAP.size + tag_len].decode("latin-1")
    inner = body[_WRAP.size + tag_len:]
    headers = {"content-length": str(len(inner))}
    if tag:
        headers[REFUSAL_HEADER.lower()] = tag
    return Answer(status, headers, inner, True)


class Relayer:
    """The relay's side: takes members' RelayRequests within `[policy]`'s budgets and forwards them."""

    def __init__(self, client: PeerClient, policy: Callable[[], tuple[bool, int, int]],
                 address_of: Callable[[bytes], str | None]) -> None:
        self._client = client
        self._policy = policy            # (relay on, requests in flight at most, bytes in flight at most)
        self._address_of = address_of    # a member's address; None for a key that is not a member
        self._inflight = 0
        self._inflight_bytes = 0
        self.counts: Counter[str] = Counter()               # requests, bytes, busy, unreachable, refused
        self.pairs: Counter[tuple[bytes, bytes]] = Counter()   # (from, to) -> bytes relayed

    def take(self, src: bytes, me: bytes, msg: RelayRequest) -> Awaitable[tuple[int, bytes]]:
        """The forwarding to await once the request's read slots are free. Raises
        RemoteProtocolError (a 400 to the sender, with our refusal tag) for a request we refuse."""
        on, requests_max, bytes_max = self._policy()
        if not on:
            self.counts["refused"] += 1
            raise RemoteProtocolError("relay_off", "this site does not relay ([policy] relay = false)")
        address = self._address_of(msg.dst)
        if address is None or msg.dst in (src, me):
            self.counts["refused"] += 1
            raise RemoteProtocolError("relay_destination", "not a member this site can relay to")
        size = len(msg.payload)
        if self._inflight >= requests_max or self._inflight_bytes + size > bytes_max:
            self.counts["busy"] += 1
            return _answer(503, b"relay_busy")
        self._inflight += 1
        self._inflight_bytes += size
        # the payload is a view of a frame buffer the server reuses once the handler returned
        return self._forward(src, msg.dst, address, _PATHS[msg.path], bytes(msg.payload))

    async def _forward(self, src: bytes, dst: bytes, address: str, path: str, payload: bytes) -> tuple[int, bytes]:
        try:
            answer = await self._client.exchange(address, payload, path, dst, RELAY_TIMEOUT_MS, relay_ok=False)
        except (OSError, TimeoutError) as exc:
            self.counts["unreachable"] += 1
            log.debug("relay to %s failed: %s", address, exc)
            return 502, b"relay_unreachable"
        finally:
            self._inflight -= 1
            self._inflight_bytes -= len(payload)
        self.counts["requests"] += 1
        self.counts["bytes"] += len(payload)
        self.pairs[src, dst] += len(payload)
        return 200, wrap(answer)


async def _answer(status: int, body: bytes) -> tuple[int, bytes]:
    return status, body
