"""Forging frames the way a malicious but allow-listed peer could: correct signature and seal
around arbitrary plaintext. Used by unit and integration tests of the gate."""

from __future__ import annotations

import msgpack

from fedpeer import wire
from fedpeer.identity import Identity


def seal_raw(sender: Identity, recipient: bytes, plaintext: bytes) -> bytes:
    nonce, ciphertext = sender.seal(recipient, plaintext)
    signature = sender.sign(wire._signed_bytes(sender.public_key, nonce, ciphertext))
    return wire.MAGIC + sender.public_key + signature + nonce + ciphertext


def envelope(sender: Identity, dst: bytes, ts_ms: int, seq: int, body: object, kind: str = "ping") -> bytes:
    return msgpack.packb({"v": 1, "kind": kind, "src": sender.public_key, "dst": dst, "job": "",
                          "term": 0, "seq": seq, "ts_ms": ts_ms, "body": body})
