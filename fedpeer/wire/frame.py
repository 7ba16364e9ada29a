"""The one gate for untrusted bytes, and the only place that turns messages into bytes (what
each message kind looks like is fedpeer/wire/schema.py's; sessions and their handshake are
fedpeer/wire/session.py's).

Frame (everything a peer sends after its session's handshake, one HTTP body):

    header (72):  magic "FPW3" (4) | sender public key (32) | session id (8) | counter (8, LE)
                  | frame length (4, LE) | header tag (16)
    rest:         AEAD(plaintext = the msgpack envelope, nonce = counter, associated data = header)
                  + its 16-byte tag
    header tag  = keyed BLAKE2b-128 under the session's header key over the header so far and the
                  recipient's key
    envelope    = {v, kind, job, term, body}; who sent it and to whom is the session's

The header is what lets the transport authenticate a sender from the first 72 bytes, before it
reads (or holds a slot for) any large body: only the two ends of the session can compute the tag,
the tag binds the length (a stranger cannot turn a small frame into a large one) and the counter
(a captured header is refused by the session's replay window before its body is read).

Order of checks (docs/security.md), each failure a `RemoteProtocolError` whose `reason` is counted by the
node. `Gate.open_header`: layout -> frame length within the cap -> sender in the allowlist ->
session known -> header tag -> counter not already seen. `Gate.open` (the whole frame): the header
checks again -> AEAD open -> strict msgpack decode (explicit limits, a budget of decoded items, no
ext types) -> envelope fields -> typed body validation -> the counter is recorded. Nothing is
decoded before the AEAD tag is checked, and nothing here is ever unpickled. Errors raised after
the header tag verified carry `sender` (and `job` once the envelope is read): the node may then
believe who sent it, tell that member's job, and log the verified name rather than a claim.

What a frame proves: that the session's other end sent exactly these bytes to this site, once.
It proves nothing to a third site (the key is shared by the two ends): a message that must
convince others (a vote, a leader's commit of a model) carries its own Ed25519 signature inside.

`Gate.open` and `Sealer.seal` are safe to call from worker threads (the node opens large frames
off the event loop): their shared state, the sessions, is locked.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidTag

from fedpeer.errors import LocalProtocolError, RemoteProtocolError
from fedpeer.identity import PUBLIC_KEY_BYTES, Identity, verify  # noqa: F401  (wire.verify: vote signatures)

# The message schema lives in fedpeer/wire/schema.py; its names are re-exported here because every
# message-defining module reaches them as `wire.register`, `wire.v_int`, ...
from fedpeer.wire.schema import (  # noqa: F401
    _BY_CLASS,
    _BY_KIND,
    ARRAY_DIMS_MAX,
    ARRAY_DTYPES,
    INT64_MAX,
    NODE_ID,
    Declared,
    DiagProbe,
    MessageSpec,
    RawBytes,
    Validator,
    declare,
    encode_array,
    kind_of,
    register,
    register_declared,
    v_array,
    v_bool,
    v_bytes,
    v_float,
    v_int,
    v_list,
    v_map,
    v_str,
)
from fedpeer.wire.session import AEAD_TAG_BYTES, SID_BYTES, Handshakes, InSession, OutSession, Sessions

# The envelope's `v`: what this build sends (every release so far speaks 2, and 0.1.0 accepts
# nothing else), and the range it accepts: a later format raises PROTOCOL_MAX and is sent to a
# peer only once its SiteInfo shows it in range (fedpeer/jobs/versions.py).
PROTOCOL_VERSION = 2
PROTOCOL_MIN = 2
PROTOCOL_MAX = 2
MAGIC = b"FPW3"
HEADER_TAG_BYTES = 16
HEADER_BYTES = len(MAGIC) + PUBLIC_KEY_BYTES + SID_BYTES + 8 + 4 + HEADER_TAG_BYTES   # 72: read before any body
FRAME_BYTES_MIN = HEADER_BYTES + AEAD_TAG_BYTES
FRAME_BYTES_CAP = 2**32 - 1                  # the header's length field (the configured cap is lower)
_REFUSAL_KEY_LABEL = b"fedpeer/v2 refusal"
ENVELOPE_KEYS = frozenset({"v", "kind", "job", "term", "body"})

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
RAW_EXT = 1                                 # msgpack extension code of a value in the raw tail
_RAW_REF = struct.Struct("<QQ")             # its (offset, length)


@dataclass(frozen=True)
class Envelope:
    kind: str
    src: bytes
    dst: bytes
    job: str
    term: int
    seq: int           # the frame's counter in its session
    msg: Any           # the typed message (a registered dataclass)


class PairKeys:
    """Static symmetric keys per peer (derived once from the pair's X25519 agreement of the two
    identities): the hello's tag, the session seed, the tag of an authenticated refusal. Both ends
    of a pair derive the same keys."""

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

    def refusal_tag(self, peer: bytes, refuser: bytes, sid: bytes, seq: int, reason: str) -> bytes:
        """Tag of "`refuser` refused the frame (`sid`, `seq`) from its peer for `reason`" (hex in
        the HTTP answer): the sender then knows the refusal came from the peer, not a middlebox."""
        data = refuser + sid + seq.to_bytes(8, "little") + reason.encode("utf-8", "replace")
        return hashlib.blake2b(data, key=self.key(peer, _REFUSAL_KEY_LABEL), digest_size=16).digest()


@dataclass(frozen=True)
class FrameHeader:
    sender: bytes
    sid: bytes
    seq: int           # the counter
    length: int
    session: InSession | None = None   # set once `Gate.open_header` found it


_HEADER = struct.Struct(f"<4s{PUBLIC_KEY_BYTES}s{SID_BYTES}sQI")   # the header before its tag


def parse_header(frame: bytes | bytearray | memoryview) -> FrameHeader | None:
    """The header's fields, unverified (None if it is not a fedpeer header)."""
    if len(frame) < HEADER_BYTES:
        return None
    magic, sender, sid, seq, length = _HEADER.unpack_from(frame)
    return FrameHeader(sender, sid, seq, length) if magic == MAGIC else None


def _header_tag(session: InSession | OutSession, head: bytes | bytearray | memoryview, recipient: bytes) -> bytes:
    return hashlib.blake2b(bytes(head[:HEADER_BYTES - HEADER_TAG_BYTES]) + recipient, key=session.header_key,
                           digest_size=HEADER_TAG_BYTES).digest()


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "little")


def frame_bytes(plaintext_bytes: int) -> int:
    """The length of the frame that carries a plaintext of this many bytes."""
    return HEADER_BYTES + plaintext_bytes + AEAD_TAG_BYTES


def seal_plaintext(sender: bytes, session: OutSession, plaintext: bytes | memoryview,
                   into: bytearray | None = None) -> bytearray | memoryview:
    """A frame from `sender` carrying `plaintext` under `session` (the next counter): a new
    bytearray, or a view of the first `frame_bytes(len(plaintext))` bytes of `into`."""
    length = frame_bytes(len(plaintext))
    if length > FRAME_BYTES_CAP:
        raise LocalProtocolError("oversize", f"a {length}-byte frame exceeds the wire's {FRAME_BYTES_CAP}")
    counter = session.take_counter(length)
    frame: bytearray | memoryview = bytearray(length) if into is None else memoryview(into)[:length]
    _HEADER.pack_into(frame, 0, MAGIC, sender, session.sid, counter, length)
    frame[HEADER_BYTES - HEADER_TAG_BYTES:HEADER_BYTES] = _header_tag(session, frame, session.peer)
    head = bytes(frame[:HEADER_BYTES])
    session.aead.encrypt_into(_nonce(counter), plaintext, head, memoryview(frame)[HEADER_BYTES:])
    return frame


class Sealer:
    """Turns typed messages into frames from this node, under a session to their recipient."""

    def __init__(self, identity: Identity) -> None:
        self._identity = identity

    def seal(self, session: OutSession, msg: object, *, job: str = "", term: int = 0) -> bytearray | memoryview:
        return self.seal_packed(session, pack(msg, job=job, term=term))

    def seal_packed(self, session: OutSession, plaintext: bytes | memoryview,
                    into: bytearray | None = None) -> bytearray | memoryview:
        return seal_plaintext(self._identity.public_key, session, plaintext, into)


def pack(msg: object, *, job: str = "", term: int = 0) -> bytes:
    """The plaintext of a typed message (what a frame, or a stream of frames, carries):

        msgpack length M (4, LE) | msgpack envelope (M) | raw tail

    Large byte strings and arrays (RawBytes: at least RawBytes.BYTES_MIN) are not copied into
    msgpack: the envelope holds an extension value RAW_EXT = (offset, length) into the raw tail,
    which holds them back to back in the order they occur."""
    spec = _BY_CLASS.get(type(msg))
    if spec is None:
        raise LocalProtocolError("unregistered", f"no wire kind for {type(msg).__name__}")
    body = spec.to_body(msg)
    if isinstance(body, dict):
        big = (bytes, bytearray, memoryview)
        body = {k: RawBytes(memoryview(v).cast("B")) if isinstance(v, big) and len(v) >= RawBytes.BYTES_MIN else v
                for k, v in body.items()}
    tail: list[memoryview] = []
    at = 0

    def raw(value: Any) -> msgpack.ExtType:
        nonlocal at
        if not isinstance(value, RawBytes):
            raise TypeError(f"cannot send a {type(value).__name__}")
        ref = msgpack.ExtType(RAW_EXT, _RAW_REF.pack(at, value.view.nbytes))
        tail.append(value.view)
        at += value.view.nbytes
        return ref

    envelope = {"v": PROTOCOL_VERSION, "kind": spec.kind, "job": job, "term": term, "body": body}
    head = msgpack.packb(envelope, use_bin_type=True, default=raw)
    return b"".join((len(head).to_bytes(4, "little"), head, *tail))


def refusal_verified(keys: PairKeys, dst: bytes, frame: bytes, reason: str, tag_hex: str) -> bool:
    """Did `dst`, the recipient of `frame` (a frame we sealed), really refuse it for `reason`?"""
    header = parse_header(frame)
    try:
        tag = bytes.fromhex(tag_hex)
    except ValueError:
        return False
    return header is not None and hmac.compare_digest(tag, keys.refusal_tag(dst, dst, header.sid, header.seq, reason))


class _Overbudget(Exception):
    pass


def _decode(plaintext: bytes | bytearray, message_bytes_max: int) -> Any:
    """Strict decode of a plaintext (see `pack`) within the limits above; nesting deeper than
    NESTING_DEPTH_MAX is refused too (checked only when the message holds that many containers:
    not for a ping). The only extension value is RAW_EXT, and the raw tail must be exactly the
    values it refers to, in order: they come back as views of `plaintext`."""
    budget = DECODED_ITEMS_MAX
    containers = 0
    view = memoryview(plaintext)
    size = len(view)
    head_bytes = int.from_bytes(view[:4], "little") if size >= 4 else -1
    if head_bytes < 0 or 4 + head_bytes > size:
        raise RemoteProtocolError("decode", "msgpack length outside the plaintext")
    tail = view[4 + head_bytes:]
    used = 0

    def raw(code: int, data: bytes) -> memoryview:
        nonlocal used
        if code != RAW_EXT or len(data) != _RAW_REF.size:
            raise ValueError("extension type")
        at, n = _RAW_REF.unpack(data)
        if at != used or n > len(tail) - at:
            raise ValueError("raw value outside the tail, or out of order")
        used = at + n
        return tail[at:used]

    def count(items: Any) -> Any:   # called by msgpack as each list or map is completed
        nonlocal budget, containers
        budget -= len(items) + 1
        containers += 1
        if budget < 0:
            raise _Overbudget
        return items

    try:
        value = msgpack.unpackb(
            view[4:4 + head_bytes], raw=False, strict_map_key=True, use_list=True, ext_hook=raw,
            max_ext_len=_RAW_REF.size,
            max_str_len=STR_BYTES_MAX, max_bin_len=message_bytes_max,
            max_array_len=ARRAY_LEN_MAX, max_map_len=MAP_LEN_MAX, list_hook=count, object_hook=count)
    except _Overbudget:
        raise RemoteProtocolError("decode", f"more than {DECODED_ITEMS_MAX} decoded items") from None
    except (ValueError, TypeError) as exc:   # every msgpack failure, incl. StackError, ExtraData
        raise RemoteProtocolError("decode", type(exc).__name__) from None
    if used != len(tail):
        raise RemoteProtocolError("decode", f"{len(tail) - used} bytes of the raw tail are not referred to")
    if containers > NESTING_DEPTH_MAX and not _depth_ok(value, 0):
        raise RemoteProtocolError("decode", f"nesting deeper than {NESTING_DEPTH_MAX}")
    return value


def _depth_ok(value: Any, depth: int) -> bool:
    if depth > NESTING_DEPTH_MAX:
        return False
    if isinstance(value, list):
        return all(_depth_ok(v, depth + 1) for v in value if isinstance(v, (list, dict)))
    if isinstance(value, dict):
        return all(_depth_ok(v, depth + 1) for v in value.values() if isinstance(v, (list, dict)))
    return True


_ENVELOPE = v_map({"v": v_int(PROTOCOL_MIN, PROTOCOL_MAX), "kind": v_str(64),
                   "job": v_str(JOB_ID_BYTES_MAX), "term": v_int(), "body": lambda v, w: v})


def refused_from(sender: bytes, exc: RemoteProtocolError, job: str = "") -> RemoteProtocolError:
    """Mark an error as raised about a frame whose sender is verified (and its job, if known)."""
    exc.sender, exc.job = sender, job   # type: ignore[attr-defined]
    return exc


class Gate:
    """Opens frames addressed to this node from allow-listed peers, and answers their hellos; see
    the module docstring and fedpeer/wire/session.py."""

    def __init__(self, identity: Identity, allowlist: Callable[[bytes], bool], sessions: Sessions,
                 *, message_bytes_max: int, keys: PairKeys | None = None) -> None:
        self._identity = identity
        self._allowed = allowlist
        self.sessions = sessions
        self._bytes_max = message_bytes_max
        self.keys = keys or PairKeys(identity)
        self.handshakes = Handshakes(identity, self.keys.key)

    def hello(self, hello: bytes, now_ms: int, admit: Callable[[bytes], bool] | None = None) -> bytes:
        """Answer a peer's hello with a welcome, keeping the new session's receiving half;
        `admit(sender)` is the sender key's handshake budget (session.py Handshakes.answer)."""
        welcome, session = self.handshakes.answer(hello, self._allowed, now_ms, admit)
        try:
            self.sessions.add_inbound(session, now_ms)
        except RemoteProtocolError as exc:
            raise refused_from(session.peer, exc) from None
        return welcome

    def open_header(self, header_bytes: bytes | bytearray, now_ms: int) -> FrameHeader:
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
        session = self.sessions.inbound(header.sender, header.sid, now_ms)
        if session is None:
            raise RemoteProtocolError("unknown_session", "no such session here (restarted, or expired): hello again")
        want = _header_tag(session, header_bytes, self._identity.public_key)
        if not hmac.compare_digest(want, bytes(header_bytes[HEADER_BYTES - HEADER_TAG_BYTES:HEADER_BYTES])):
            raise RemoteProtocolError("header", "header tag does not verify (forged, or not sent to this node)")
        try:
            self.sessions.check(session, header.seq)
        except RemoteProtocolError as exc:
            raise refused_from(header.sender, exc) from None
        return FrameHeader(header.sender, header.sid, header.seq, header.length, session)

    def refusal_tag(self, header: FrameHeader, reason: str) -> str:
        """Hex tag proving to the sender of `header` that this node refused that frame for `reason`."""
        me = self._identity.public_key
        return self.keys.refusal_tag(header.sender, me, header.sid, header.seq, reason).hex()

    def open(self, frame: bytes | bytearray, now_ms: int, verified: FrameHeader | None = None) -> Envelope:
        """Open a whole frame. `verified`: what `open_header` returned for this very frame's first
        HEADER_BYTES (the transport checked them before reading the body); not checked again."""
        n = len(frame)
        if n > self._bytes_max:
            raise RemoteProtocolError("oversize", f"{n} bytes > {self._bytes_max}")
        if n < FRAME_BYTES_MIN:
            raise RemoteProtocolError("frame", "truncated or not a fedpeer frame")
        head = bytes(frame[:HEADER_BYTES])
        header = verified if verified is not None and verified.session is not None else self.open_header(head, now_ms)
        sender, session = header.sender, header.session
        assert session is not None
        if header.length != n:
            raise refused_from(sender, RemoteProtocolError("frame", f"{n} bytes, the header says {header.length}"))
        plaintext = bytearray(n - HEADER_BYTES - AEAD_TAG_BYTES)
        try:
            with memoryview(frame) as view:
                session.aead.decrypt_into(_nonce(header.seq), view[HEADER_BYTES:], head, plaintext)
        except InvalidTag:
            raise refused_from(sender, RemoteProtocolError("decrypt", "AEAD tag does not verify")) from None
        envelope = self.open_plaintext(sender, plaintext, header.seq, self._bytes_max)
        try:
            self.sessions.record(session, header.seq)   # last: only valid messages move the window
        except RemoteProtocolError as exc:            # (the same frame, opened twice at once)
            raise refused_from(sender, exc) from None
        return envelope

    def open_plaintext(self, sender: bytes, plaintext: bytes | bytearray, seq: int, bytes_max: int) -> Envelope:
        """Decode and check an authenticated plaintext envelope from `sender` (a frame's, or a
        whole stream's: fedpeer/net/streams.py). Raises RemoteProtocolError naming the sender."""
        try:
            raw = _decode(plaintext, bytes_max)
        except RemoteProtocolError as exc:
            raise refused_from(sender, exc) from None
        try:
            return self._envelope(sender, seq, raw)
        except RemoteProtocolError as exc:
            job = raw.get("job", "") if isinstance(raw, dict) and isinstance(raw.get("job"), str) else ""
            raise refused_from(sender, exc, job[:JOB_ID_BYTES_MAX]) from None

    def _envelope(self, sender: bytes, seq: int, raw: Any) -> Envelope:
        env = _ENVELOPE(raw, "envelope")
        spec = _BY_KIND.get(env["kind"])
        if spec is None:
            raise RemoteProtocolError("unknown_kind", f"kind {env['kind']!r}")
        body = spec.schema(env["body"], env["kind"])
        try:
            msg = spec.from_body(body)
        except (TypeError, ValueError) as exc:
            raise RemoteProtocolError("schema", f"{env['kind']}: {exc}") from None
        return Envelope(kind=env["kind"], src=sender, dst=self._identity.public_key, job=env["job"],
                        term=env["term"], seq=seq, msg=msg)

