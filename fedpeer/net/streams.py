"""Payloads of any size: a message too large for one frame travels as a stream of frames.

A sender whose sealed message would exceed STREAM_ABOVE_BYTES (a forest, a long model) sends
instead, under its session to the peer:

    StreamOpen  {stream id, total bytes, SHA-256 of the whole plaintext envelope}
    StreamChunk {stream id, offset, data} x ceil(total / STREAM_CHUNK_BYTES)

each a reliable frame of its own; at most STREAM_WINDOW_CHUNKS chunks are in flight (flow
control: a chunk's send returns once the peer accepted it). The receiver checks the open (total
within `[limits] payload_bytes_max`, at most STREAMS_PER_PEER_MAX open streams per peer and
`payload_bytes_max` bytes of open streams in all), writes each chunk at its offset into one buffer
of `total` bytes, and when the last byte arrives checks the digest over the whole and hands the
plaintext to the gate's strict decode (fedpeer/wire/frame.py `Gate.open_plaintext`), exactly as if it had
come in one frame. So memory per transfer is the payload itself plus the chunks in flight: the
sender never seals the whole payload into one frame, and the receiver never holds a frame of it.
A chunk out of range, overlapping one already written, or a digest that does not match refuses the
frame and drops the stream; a stream idle for STREAM_IDLE_MS is dropped.

Pure bookkeeping: no sockets, no clock (`now_ms` is passed in).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field

from fedpeer.errors import RemoteProtocolError
from fedpeer.wire.schema import register, v_bytes, v_int

STREAM_ABOVE_BYTES = 16 * 1024 * 1024     # messages larger than this (sealed) go as a stream
STREAM_CHUNK_BYTES = 4 * 1024 * 1024      # payload bytes per chunk frame
STREAM_WINDOW_CHUNKS = 4                  # chunks in flight per stream (sender side)
STREAMS_PER_PEER_MAX = 2                  # open inbound streams per sender
STREAM_IDLE_MS = 30_000                   # an inbound stream with no chunk this long is dropped
STREAM_ID_BYTES = 8
DIGEST_BYTES = 32                         # SHA-256 (CPU instructions on current x86 and ARM)


@dataclass(frozen=True)
class StreamOpen:
    stream: bytes
    total: int
    digest: bytes


@dataclass(frozen=True)
class StreamChunk:
    stream: bytes
    offset: int
    data: bytes | memoryview     # the sender's view of its payload; received: a view of the frame


register("stream_open", StreamOpen, {"stream": v_bytes(STREAM_ID_BYTES), "total": v_int(1),
                                     "digest": v_bytes(DIGEST_BYTES)})
register("stream_chunk", StreamChunk, {"stream": v_bytes(STREAM_ID_BYTES), "offset": v_int(),   # data: a view,
                                       "data": v_bytes(max_bytes=STREAM_CHUNK_BYTES, view=True)})   # copied once


def digest(plaintext: bytes | bytearray | memoryview) -> bytes:
    return hashlib.sha256(plaintext).digest()


def chunks(total: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of a `total`-byte payload."""
    return [(at, min(STREAM_CHUNK_BYTES, total - at)) for at in range(0, total, STREAM_CHUNK_BYTES)]


@dataclass(eq=False)
class _Inbound:
    total: int
    digest: bytes
    buffer: bytearray
    last_ms: int
    received: int = 0
    spans: dict[int, int] = field(default_factory=dict)    # offset -> length written


class InboundStreams:
    """The receiving side's open streams, per sender. Thread-safe (chunks may be opened in worker
    threads)."""

    def __init__(self, payload_bytes_max: int) -> None:
        self.payload_bytes_max = payload_bytes_max
        self._lock = threading.Lock()
        self._open: dict[tuple[bytes, bytes], _Inbound] = {}
        self.completed = 0

    def held_bytes(self) -> int:
        with self._lock:
            return sum(s.total for s in self._open.values())

    def open(self, src: bytes, msg: StreamOpen, now_ms: int) -> None:
        with self._lock:
            key = (src, msg.stream)
            if key in self._open:
                raise RemoteProtocolError("stream", "stream id already open")
            if msg.total > self.payload_bytes_max:
                raise RemoteProtocolError("oversize", f"a {msg.total}-byte payload > payload_bytes_max "
                                                      f"{self.payload_bytes_max}")
            if sum(1 for s, _ in self._open if s == src) >= STREAMS_PER_PEER_MAX:
                raise RemoteProtocolError("stream_busy", f"{STREAMS_PER_PEER_MAX} streams of this peer are open")
            if sum(s.total for s in self._open.values()) + msg.total > self.payload_bytes_max:
                raise RemoteProtocolError("stream_busy", "open streams hold payload_bytes_max already")
            self._open[key] = _Inbound(msg.total, msg.digest, bytearray(msg.total), now_ms)

    def chunk(self, src: bytes, msg: StreamChunk, now_ms: int) -> bytearray | None:
        """Write a chunk; the whole plaintext once the last byte is in and the digest matches."""
        key = (src, msg.stream)
        with self._lock:
            stream = self._open.get(key)
            if stream is None:
                raise RemoteProtocolError("stream", "chunk of a stream that is not open (dropped, or never opened)")
            end = msg.offset + len(msg.data)
            overlap = any(at < end and msg.offset < at + n for at, n in stream.spans.items())
            if not msg.data or end > stream.total or overlap:
                del self._open[key]
                raise RemoteProtocolError("stream", f"chunk [{msg.offset}, {end}) outside the stream or written twice")
            stream.spans[msg.offset] = len(msg.data)
            stream.last_ms = now_ms
        stream.buffer[msg.offset:end] = msg.data          # outside the lock: chunks of one stream do not overlap
        with self._lock:
            stream.received += len(msg.data)
            if stream.received < stream.total:
                return None
            self._open.pop(key, None)
        if digest(stream.buffer) != stream.digest:
            raise RemoteProtocolError("stream", "the payload's digest does not match its stream's")
        self.completed += 1
        return stream.buffer

    def drop_peer(self, src: bytes) -> None:
        with self._lock:
            for key in [k for k in self._open if k[0] == src]:
                del self._open[key]

    def prune(self, now_ms: int) -> int:
        """Drop streams idle for STREAM_IDLE_MS; returns how many."""
        with self._lock:
            idle = [k for k, s in self._open.items() if now_ms - s.last_ms >= STREAM_IDLE_MS]
            for key in idle:
                del self._open[key]
            return len(idle)
