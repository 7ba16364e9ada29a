"""The one gate for untrusted bytes, and the only place that turns messages into bytes (what
each message kind looks like is fedpeer/schema.py's).

Frame (everything a peer sends, one HTTP body):

    header (64):  magic "FPW2" (4) | sender public key (32) | seq (8, LE) | frame length (4, LE)
                  | header tag (16)
    rest:         signature (64) | nonce (24) | ciphertext

    header tag = keyed BLAKE2b-128 under the sender-recipient pair's static key (X25519 of the two
                 identities, see Identity.pairwise_seed) over magic + sender + recipient + seq + length
    signature  = Ed25519 over SIGN_DOMAIN + magic + sender + nonce + SHA-256(ciphertext)
    ciphertext = NaCl Box(sender -> recipient) of the msgpack envelope
    envelope   = {v, kind, src, dst, job, term, seq, ts_ms, body}

The header is what lets the transport authenticate a sender from the first 64 bytes, before it
reads (or holds a slot for) any large body: only the sender and the recipient can compute the tag,
the tag binds the length (a stranger cannot turn a small frame into a large one) and the seq (a
captured header is refused by the replay marks before its body is read).

Order of checks (DESIGN §5), each failure a `RemoteProtocolError` whose `reason` is counted by the
node. `Gate.open_header`: layout -> frame length within the cap -> sender in the allowlist ->
header tag -> seq not already seen. `Gate.open` (the whole frame): the header checks again ->
signature -> decrypt -> strict msgpack decode (explicit limits, a budget of decoded items, no ext
types) -> envelope fields -> dst is me -> src is the signer -> seq equals the header's -> ts within
the skew bound -> seq not replayed -> typed body validation. Nothing is decoded before the
signature is checked, and nothing here is ever unpickled. Errors raised after the header tag
verified carry `sender` (and `job` once the envelope is read): the node may then believe who sent
it, tell that member's job, and log the verified name rather than a claim.

Signing a SHA-256 digest of the ciphertext instead of the ciphertext itself keeps a 1 MiB frame
at one hash pass on each side (Ed25519 would hash the whole message twice with SHA-512); SHA-256
has CPU instructions on current x86 and ARM (0.6 ms/MiB here, against 1.3 for BLAKE2b).
`Gate.open` and `Sealer.seal` are safe to call from worker threads (the node opens large frames
off the event loop): their only shared state, the replay marks and the sequence clock, is locked.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import nacl.exceptions

from .errors import LocalProtocolError, RemoteProtocolError
from .identity import MAC_BYTES, NONCE_BYTES, PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify
# The message schema lives in fedpeer/schema.py; its names are re-exported here because every
# message-defining module reaches them as `wire.register`, `wire.v_int`, ...
from .schema import (  # noqa: F401
    _BY_CLASS, _BY_KIND, ARRAY_DIMS_MAX, ARRAY_DTYPES, INT64_MAX, NODE_ID, DiagProbe, MessageSpec, Validator,
    encode_array, kind_of, register, v_array, v_bool, v_bytes, v_float, v_int, v_list, v_map, v_str,
)

PROTOCOL_VERSION = 1
MAGIC = b"FPW2"
HEADER_TAG_BYTES = 16
HEADER_BYTES = len(MAGIC) + PUBLIC_KEY_BYTES + 8 + 4 + HEADER_TAG_BYTES     # 64: read before any body
FRAME_BYTES_MIN = HEADER_BYTES + SIGNATURE_BYTES + NONCE_BYTES + MAC_BYTES
FRAME_BYTES_CAP = 2**32 - 1                  # the header's length field (the configured cap is lower)
_HEADER_KEY_LABEL = b"fedpeer/v1 frame header"
_REFUSAL_KEY_LABEL = b"fedpeer/v1 refusal"
ENVELOPE_KEYS = frozenset({"v", "kind", "src", "dst", "job", "term", "seq", "ts_ms", "body"})

# Decoder limits. The frame cap bounds the total; these bound what one field can make us allocate.
STR_BYTES_MAX = 64 * 1024
ARRAY_LEN_MAX = 1 << 20
MAP_LEN_MAX = 4096
NESTING_DEPTH_MAX = 16     # our messages nest at most a few levels; msgpack itself stops at 1024
# Decoded items (list and map entries, summed over the whole message). Every limit above can hold
# while a 24 MiB frame of 2^20-long lists of empty lists makes msgpack build 25 million objects
# (1.8 GiB, 22 s with the GIL held); our largest messages hold ~10^5 items (a job's feature names).
DECODED_ITEMS_MAX = 1 << 18
JOB_ID_BYTES_MAX = 64


# ---------------------------------------------------------------------------------------------
# Envelope, replay guard, gate.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Envelope:
    kind: str
    src: bytes
    dst: bytes
    job: str
    term: int
    seq: int
    ts_ms: int
    msg: Any           # the typed message (a registered dataclass)


class ReplayGuard:
    """Per-sender anti-replay window on sequence numbers (like IPsec's, with a time-sized window).

    Sequence numbers are strictly increasing per sender (microseconds of the sender's clock, see
    `SeqClock`), but concurrent HTTP requests may arrive out of order; so a seq is accepted if it is
    above the high-water mark, or inside the window below it and not seen yet. The high-water mark
    is written to disk on every increase (`store.Counter`, one pwrite), and after a restart only
    seqs above the persisted mark are accepted: a replay fails after a restart too.
    """

    def __init__(self, window_us: int, recent_max: int, counter_for: Callable[[bytes], Any]) -> None:
        self._window_us = window_us
        self._recent_max = recent_max
        self._counter_for = counter_for
        self._lock = threading.Lock()
        self._floor: dict[bytes, int] = {}      # persisted mark at start: nothing at or below passes
        self._recent: dict[bytes, set[int]] = {}
        self._oldest: dict[bytes, list[int]] = {}   # the same seqs as a min-heap: pruning is O(log n)
        self._counters: dict[bytes, Any] = {}

    def _counter(self, sender: bytes) -> Any:
        counter = self._counters.get(sender)
        if counter is None:
            counter = self._counters[sender] = self._counter_for(sender)
            self._floor[sender] = counter.value
            self._recent[sender] = set()
            self._oldest[sender] = []
        return counter

    def check_and_record(self, sender: bytes, seq: int) -> None:
        with self._lock:
            self._check_and_record(sender, seq)

    def check(self, sender: bytes, seq: int) -> None:
        """Would `seq` pass? (Nothing recorded: a frame's header is checked before its body, and
        only a whole valid frame moves the marks.)"""
        with self._lock:
            counter = self._counter(sender)
            high = counter.value
            if seq > high:
                return
            if seq <= self._floor[sender] or seq <= high - self._window_us or seq in self._recent[sender]:
                raise RemoteProtocolError("replay", f"seq {seq} already seen or too old (high {high})")

    def _check_and_record(self, sender: bytes, seq: int) -> None:
        counter = self._counter(sender)
        high, recent = counter.value, self._recent[sender]
        if seq > high:
            counter.set(seq)
            self._remember(sender, seq)
            low, oldest = seq - self._window_us, self._oldest[sender]
            while oldest and oldest[0] <= low:      # what fell out of the window (amortised O(log n))
                recent.discard(heapq.heappop(oldest))
            return
        if seq <= self._floor[sender] or seq <= high - self._window_us or seq in recent:
            raise RemoteProtocolError("replay", f"seq {seq} already seen or too old (high {high})")
        if len(recent) >= self._recent_max:
            raise RemoteProtocolError("replay", "too many out-of-order messages in the window")
        self._remember(sender, seq)

    def _remember(self, sender: bytes, seq: int) -> None:
        self._recent[sender].add(seq)
        heapq.heappush(self._oldest[sender], seq)

    def sync(self) -> None:
        with self._lock:
            for counter in self._counters.values():
                counter.sync()

    def close(self) -> None:
        with self._lock:
            for counter in self._counters.values():
                counter.close()


class SeqClock:
    """Strictly increasing sequence numbers: max(last + 1, now in microseconds).

    Time-based, so a restarted sender continues above every number it used before without
    persisting anything (as long as its clock does not step back further than it was ahead)."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self, now_us: int) -> int:
        with self._lock:
            self._last = max(self._last + 1, now_us)
            return self._last


def _signed_bytes(sender: bytes, nonce: bytes, ciphertext: bytes) -> bytes:
    return MAGIC + sender + nonce + hashlib.sha256(ciphertext).digest()


class PairKeys:
    """Static symmetric keys per peer (derived once from the pair's X25519 agreement): the frame
    header tag and the tag of an authenticated refusal. Both ends of a pair derive the same keys."""

    def __init__(self, identity: Identity) -> None:
        self._identity = identity
        self._keys: dict[tuple[bytes, bytes], bytes] = {}
        self._lock = threading.Lock()

    def key(self, peer: bytes, label: bytes) -> bytes:
        with self._lock:
            key = self._keys.get((peer, label))
            if key is None:   # bounded: only allow-listed peers get this far
                key = self._keys[(peer, label)] = self._identity.pairwise_seed(peer, label)
            return key

    def header_tag(self, peer: bytes, sender: bytes, recipient: bytes, seq: int, length: int) -> bytes:
        data = MAGIC + sender + recipient + seq.to_bytes(8, "little") + length.to_bytes(4, "little")
        return hashlib.blake2b(data, key=self.key(peer, _HEADER_KEY_LABEL), digest_size=HEADER_TAG_BYTES).digest()

    def refusal_tag(self, peer: bytes, refuser: bytes, seq: int, reason: str) -> bytes:
        """Tag of "`refuser` refused the frame `seq` from its peer for `reason`" (hex in the HTTP
        answer): the sender then knows the refusal came from the peer, not from a middlebox."""
        data = refuser + seq.to_bytes(8, "little") + reason.encode("utf-8", "replace")
        return hashlib.blake2b(data, key=self.key(peer, _REFUSAL_KEY_LABEL), digest_size=16).digest()


@dataclass(frozen=True)
class FrameHeader:
    sender: bytes
    seq: int
    length: int


def parse_header(frame: bytes) -> FrameHeader | None:
    """The header's fields, unverified (None if it is not a fedpeer header)."""
    if len(frame) < HEADER_BYTES or frame[:4] != MAGIC:
        return None
    at = len(MAGIC) + PUBLIC_KEY_BYTES
    return FrameHeader(sender=bytes(frame[len(MAGIC):at]), seq=int.from_bytes(frame[at:at + 8], "little"),
                       length=int.from_bytes(frame[at + 8:at + 12], "little"))


class Sealer:
    """Turns typed messages into signed, encrypted frames from this node."""

    def __init__(self, identity: Identity, keys: PairKeys | None = None) -> None:
        self._identity = identity
        self.keys = keys or PairKeys(identity)
        self._seq = SeqClock()

    def seal(self, dst: bytes, msg: object, now_us: int, *, job: str = "", term: int = 0) -> bytes:
        spec = _BY_CLASS.get(type(msg))
        if spec is None:
            raise LocalProtocolError("unregistered", f"no wire kind for {type(msg).__name__}")
        seq = self._seq.next(now_us)
        envelope = {"v": PROTOCOL_VERSION, "kind": spec.kind, "src": self._identity.public_key,
                    "dst": dst, "job": job, "term": term, "seq": seq,
                    "ts_ms": now_us // 1000, "body": spec.to_body(msg)}
        plaintext = msgpack.packb(envelope, use_bin_type=True)
        nonce, ciphertext = self._identity.seal(dst, plaintext)
        sender = self._identity.public_key
        signature = self._identity.sign(_signed_bytes(sender, nonce, ciphertext))
        length = HEADER_BYTES + SIGNATURE_BYTES + NONCE_BYTES + len(ciphertext)
        if length > FRAME_BYTES_CAP:
            raise LocalProtocolError("oversize", f"a {length}-byte frame exceeds the wire's {FRAME_BYTES_CAP}")
        tag = self.keys.header_tag(dst, sender, dst, seq, length)
        return b"".join((MAGIC, sender, seq.to_bytes(8, "little"), length.to_bytes(4, "little"), tag,
                         signature, nonce, ciphertext))



def refusal_verified(keys: PairKeys, dst: bytes, frame: bytes, reason: str, tag_hex: str) -> bool:
    """Did `dst`, the recipient of `frame` (a frame we sealed), really refuse it for `reason`?"""
    header = parse_header(frame)
    try:
        tag = bytes.fromhex(tag_hex)
    except ValueError:
        return False
    return header is not None and hmac.compare_digest(tag, keys.refusal_tag(dst, dst, header.seq, reason))


class _Overbudget(Exception):
    pass


def _decode(plaintext: bytes, message_bytes_max: int) -> Any:
    budget = DECODED_ITEMS_MAX

    def count(items: Any) -> Any:   # called by msgpack as each list or map is completed
        nonlocal budget
        budget -= len(items) + 1
        if budget < 0:
            raise _Overbudget
        return items

    try:
        return msgpack.unpackb(
            plaintext, raw=False, strict_map_key=True, use_list=True, max_ext_len=0,
            max_str_len=STR_BYTES_MAX, max_bin_len=message_bytes_max,
            max_array_len=ARRAY_LEN_MAX, max_map_len=MAP_LEN_MAX, list_hook=count, object_hook=count)
    except _Overbudget:
        raise RemoteProtocolError("decode", f"more than {DECODED_ITEMS_MAX} decoded items") from None
    except (ValueError, TypeError) as exc:   # every msgpack failure, incl. StackError, ExtraData
        raise RemoteProtocolError("decode", type(exc).__name__) from None


def _depth_ok(value: Any, depth: int) -> bool:
    if depth > NESTING_DEPTH_MAX:
        return False
    if isinstance(value, list):
        return all(_depth_ok(v, depth + 1) for v in value if isinstance(v, (list, dict)))
    if isinstance(value, dict):
        return all(_depth_ok(v, depth + 1) for v in value.values() if isinstance(v, (list, dict)))
    return True


_ENVELOPE = v_map({"v": v_int(PROTOCOL_VERSION, PROTOCOL_VERSION), "kind": v_str(64),
                   "src": NODE_ID, "dst": NODE_ID, "job": v_str(JOB_ID_BYTES_MAX), "term": v_int(),
                   "seq": v_int(1), "ts_ms": v_int(), "body": lambda v, w: v})


def refused_from(sender: bytes, exc: RemoteProtocolError, job: str = "") -> RemoteProtocolError:
    """Mark an error as raised about a frame whose sender is verified (and its job, if known)."""
    exc.sender, exc.job = sender, job   # type: ignore[attr-defined]
    return exc


class Gate:
    """Opens frames addressed to this node from allow-listed peers; see the module docstring."""

    def __init__(self, identity: Identity, allowlist: Callable[[bytes], bool], replay: ReplayGuard,
                 *, message_bytes_max: int, clock_skew_ms_max: int, keys: PairKeys | None = None) -> None:
        self._identity = identity
        self._allowed = allowlist
        self._replay = replay
        self._bytes_max = message_bytes_max
        self._skew_ms = clock_skew_ms_max
        self.keys = keys or PairKeys(identity)

    def open_header(self, header_bytes: bytes) -> FrameHeader:
        """Authenticate the first HEADER_BYTES of a frame: who sent it, how long it is. Cheap (one
        keyed BLAKE2b), so the transport calls it before reading, or making room for, the body."""
        header = parse_header(header_bytes)
        if header is None:
            raise RemoteProtocolError("frame", "truncated or not a fedpeer frame")
        if header.length > self._bytes_max:
            raise RemoteProtocolError("oversize", f"{header.length} bytes > {self._bytes_max}")
        if header.length < FRAME_BYTES_MIN:
            raise RemoteProtocolError("frame", "declared length below the smallest frame")
        if not self._allowed(header.sender):
            raise RemoteProtocolError("unknown_sender", "public key not in peers.toml")
        me = self._identity.public_key
        want = self.keys.header_tag(header.sender, header.sender, me, header.seq, header.length)
        if not hmac.compare_digest(want, bytes(header_bytes[HEADER_BYTES - HEADER_TAG_BYTES:HEADER_BYTES])):
            raise RemoteProtocolError("header", "header tag does not verify (forged, or not sent to this node)")
        try:
            self._replay.check(header.sender, header.seq)
        except RemoteProtocolError as exc:
            raise refused_from(header.sender, exc) from None
        return header

    def refusal_tag(self, sender: bytes, seq: int, reason: str) -> str:
        """Hex tag proving to `sender` that this node refused its frame `seq` for `reason`."""
        me = self._identity.public_key
        return self.keys.refusal_tag(sender, me, seq, reason).hex()

    def open(self, frame: bytes, now_ms: int) -> Envelope:
        if len(frame) > self._bytes_max:
            raise RemoteProtocolError("oversize", f"{len(frame)} bytes > {self._bytes_max}")
        if len(frame) < FRAME_BYTES_MIN:
            raise RemoteProtocolError("frame", "truncated or not a fedpeer frame")
        header = self.open_header(frame[:HEADER_BYTES])
        if header.length != len(frame):
            problem = f"{len(frame)} bytes, the header says {header.length}"
            raise refused_from(header.sender, RemoteProtocolError("frame", problem))
        sender = header.sender
        view = memoryview(frame)
        at = HEADER_BYTES
        signature = bytes(view[at:at + SIGNATURE_BYTES])
        at += SIGNATURE_BYTES
        nonce = bytes(view[at:at + NONCE_BYTES])
        ciphertext = bytes(view[at + NONCE_BYTES:])
        del view   # (a view would pin a bytearray frame against resizing; nothing else)
        if not verify(sender, _signed_bytes(sender, nonce, ciphertext), signature):
            raise refused_from(sender, RemoteProtocolError("signature", "bad signature"))
        try:
            plaintext = self._identity.unseal(sender, nonce, ciphertext)
        except nacl.exceptions.CryptoError:
            problem = "cannot decrypt (not sealed to this node?)"
            raise refused_from(sender, RemoteProtocolError("decrypt", problem)) from None
        try:
            raw = _decode(plaintext, self._bytes_max)
        except RemoteProtocolError as exc:
            raise refused_from(sender, exc) from None
        return self._check_envelope(sender, header.seq, raw, now_ms)

    def _check_envelope(self, sender: bytes, seq: int, raw: Any, now_ms: int) -> Envelope:
        job = raw.get("job", "") if isinstance(raw, dict) and isinstance(raw.get("job"), str) else ""
        try:
            return self._envelope(sender, seq, raw, now_ms)
        except RemoteProtocolError as exc:
            raise refused_from(sender, exc, job[:JOB_ID_BYTES_MAX]) from None

    def _envelope(self, sender: bytes, seq: int, raw: Any, now_ms: int) -> Envelope:
        if not _depth_ok(raw, 0):
            raise RemoteProtocolError("decode", f"nesting deeper than {NESTING_DEPTH_MAX}")
        env = _ENVELOPE(raw, "envelope")
        if env["dst"] != self._identity.public_key:
            raise RemoteProtocolError("wrong_dst", "addressed to another node")
        if env["src"] != sender:
            raise RemoteProtocolError("wrong_src", "envelope src differs from the signer")
        if env["seq"] != seq:
            raise RemoteProtocolError("frame", "envelope seq differs from the header's")
        if abs(env["ts_ms"] - now_ms) > self._skew_ms:
            raise RemoteProtocolError("skew", f"timestamp {env['ts_ms'] - now_ms:+d} ms off our clock")
        spec = _BY_KIND.get(env["kind"])
        if spec is None:
            raise RemoteProtocolError("unknown_kind", f"kind {env['kind']!r}")
        body = spec.schema(env["body"], env["kind"])
        self._replay.check_and_record(sender, env["seq"])   # last: only valid messages move the mark
        try:
            msg = spec.from_body(body)
        except (TypeError, ValueError) as exc:
            raise RemoteProtocolError("schema", f"{env['kind']}: {exc}") from None
        return Envelope(kind=env["kind"], src=sender, dst=env["dst"], job=env["job"],
                        term=env["term"], seq=env["seq"], ts_ms=env["ts_ms"], msg=msg)
