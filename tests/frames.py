"""Forging frames the way a malicious but allow-listed peer could: correct header tag, signature
and seal around arbitrary plaintext. Used by unit and integration tests of the gate."""

from __future__ import annotations

import itertools
import time

import msgpack

from fedpeer import wire
from fedpeer.identity import Identity

_fresh = itertools.count()


def _seq_of(plaintext: bytes) -> int:
    """The envelope's seq when the plaintext is an envelope (the header must carry the same),
    else a fresh one (microseconds, like wire.SeqClock)."""
    try:   # (bounded like the gate: junk may be an amplification bomb)
        doc = msgpack.unpackb(plaintext, max_array_len=64, max_map_len=64)
        if isinstance(doc, dict) and isinstance(doc.get("seq"), int) and doc["seq"] > 0:
            return doc["seq"]
    except Exception:   # junk plaintext is the point of some tests
        pass
    return time.time_ns() // 1000 + next(_fresh)


def seal_raw(sender: Identity, recipient: bytes, plaintext: bytes, seq: int | None = None) -> bytes:
    nonce, ciphertext = sender.seal(recipient, plaintext)
    signature = sender.sign(wire._signed_bytes(sender.public_key, nonce, ciphertext))
    seq = _seq_of(plaintext) if seq is None else seq
    length = wire.HEADER_BYTES + len(signature) + len(nonce) + len(ciphertext)
    tag = wire.PairKeys(sender).header_tag(recipient, sender.public_key, recipient, seq, length)
    return b"".join((wire.MAGIC, sender.public_key, seq.to_bytes(8, "little"), length.to_bytes(4, "little"),
                     tag, signature, nonce, ciphertext))


def envelope(sender: Identity, dst: bytes, ts_ms: int, seq: int, body: object, kind: str = "ping") -> bytes:
    return msgpack.packb({"v": 1, "kind": kind, "src": sender.public_key, "dst": dst, "job": "",
                          "term": 0, "seq": seq, "ts_ms": ts_ms, "body": body})


def reheader(sender: Identity, recipient: bytes, frame: bytes) -> bytes:
    """`frame` with a header tag valid for `recipient` (whatever its body was sealed to)."""
    header = wire.parse_header(frame)
    assert header is not None
    tag = wire.PairKeys(sender).header_tag(recipient, sender.public_key, recipient, header.seq, header.length)
    return frame[:wire.HEADER_BYTES - wire.HEADER_TAG_BYTES] + tag + frame[wire.HEADER_BYTES:]
