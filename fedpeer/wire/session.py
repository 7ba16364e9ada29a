"""Sessions between two sites: authenticate once, then every frame is sealed by a symmetric AEAD.

A session joins two sites, with a key, a counter and a replay window per direction. The site that
needs one first (the initiator) opens it with a handshake; both sites then hold a sending half and
a receiving half. The responder sends under its half only once a frame of the initiator's arrived
under the session (so the initiator holds its keys by then; a replayed hello never gets that far):
the first probe and its answer cost one handshake, not two.

Handshake (one HTTP round trip, POST /fedpeer/v1/hello; in the spirit of Noise IK / WireGuard):

    hello   (I -> R, 189 bytes): "FPH1" | I's key (32) | R's key (32) | session id (8) | suite (1)
            | I's fresh X25519 public key e_I (32) | tag (16) | Ed25519 signature of I (64)
    welcome (R -> I, 108 bytes): "FPR1" | session id (8) | R's fresh X25519 public key e_R (32)
            | Ed25519 signature of R (64)

    tag       = keyed BLAKE2b-128 of the hello so far, under the pair's static key (X25519 of the
                two identities): a host without a member's key is refused before any Ed25519 work
    I signs   SIGN_DOMAIN + "hello" + the hello up to its signature
    R signs   SIGN_DOMAIN + "welcome" + SHA-256(hello) + session id + e_R
    keys      = HKDF-SHA256(ikm = X25519(e_I, e_R) + the pair's static session seed,
                            salt = SHA-256(hello + e_R), info = suite)
              -> I->R AEAD key (32) | I->R header key (32) | R->I AEAD key (32) | R->I header key (32)

Both sides sign the transcript, so each knows the other holds its identity key; the AEAD key comes
from fresh ephemeral keys that are dropped once the keys are derived (forward secrecy: a stolen
identity key does not open recorded traffic). A replayed hello gets a welcome whose keys nobody
but the original initiator could compute, and that initiator has forgotten e_I: the responder's
half-open session is never used, expires, and is bounded per peer. A hello whose session id is
already held is refused ("replay").

Frames under a session (see fedpeer/wire/frame.py): a 72-byte header (sender, session id, counter,
length, keyed BLAKE2b tag under the header key) that the transport checks before reading a body,
then AES-256-GCM (ChaCha20-Poly1305 on CPUs without AES instructions) of the message with the
counter as nonce and the header as associated data. Replay protection is a sliding window of
counters per session (WireGuard's: O(1) per frame, nothing on disk, no wall clock): a counter at or
below the window ("stale"), or already seen inside it ("replay"), is refused. Sessions live in memory only: a restarted
site has none, refuses frames of its old sessions ("unknown_session"), and its peers open new ones.

Rekey: an initiator stops using a session after SESSION_REKEY_AFTER_MS, SESSION_REKEY_AFTER_FRAMES
or SESSION_REKEY_AFTER_BYTES and opens a new one; a responder forgets a session
SESSION_REJECT_AFTER_MS after it was opened (frames still in flight under the old one arrive first).

All time is passed in (`now_ms`, monotonic milliseconds): this module reads no clock. Every method
is thread-safe (the node opens large frames in worker threads).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedpeer.errors import RemoteProtocolError
from fedpeer.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify

HELLO_MAGIC = b"FPH1"
WELCOME_MAGIC = b"FPR1"
MAGIC_BYTES = len(HELLO_MAGIC)             # the same for both
SID_BYTES = 8
EPHEMERAL_BYTES = 32
HELLO_TAG_BYTES = 16
HELLO_BYTES = (MAGIC_BYTES + 2 * PUBLIC_KEY_BYTES + SID_BYTES + 1 + EPHEMERAL_BYTES + HELLO_TAG_BYTES
               + SIGNATURE_BYTES)                                                      # 189
WELCOME_BYTES = MAGIC_BYTES + SID_BYTES + EPHEMERAL_BYTES + SIGNATURE_BYTES          # 108
AEAD_TAG_BYTES = 16

SUITE_AES_GCM = 1             # AES-256-GCM: CPUs with AES instructions
SUITE_CHACHA = 2              # ChaCha20-Poly1305: fast in software
SUITES = {SUITE_AES_GCM: AESGCM, SUITE_CHACHA: ChaCha20Poly1305}

SESSION_REKEY_AFTER_MS = 120_000          # an initiator opens a new session after this long ...
SESSION_REKEY_AFTER_FRAMES = 1 << 30      # ... or this many frames (far below the 2^64 nonces) ...
SESSION_REKEY_AFTER_BYTES = 1 << 36       # ... or this many bytes (64 GiB)
SESSION_REJECT_AFTER_MS = 180_000         # a responder forgets a session this long after its hello
INBOUND_SESSIONS_PER_PEER_MAX = 4         # held per sender (half-open ones are evicted first)
HELLOS_REMEMBERED_PER_PEER = 64           # answered hellos remembered per sender (SESSION_REJECT_AFTER_MS),
                                          # so a replayed one is refused before its signature is checked
REPLAY_WINDOW_FRAMES = 8192               # counters accepted out of order below the highest seen
_WINDOW_MASK = (1 << REPLAY_WINDOW_FRAMES) - 1

_HELLO_TAG_LABEL = b"fedpeer/v2 hello"
_SESSION_SEED_LABEL = b"fedpeer/v2 session"
_HELLO_SIGN = b"hello"
_WELCOME_SIGN = b"welcome"


def preferred_suite() -> int:
    """AES-256-GCM where the CPU has AES instructions (x86 `aes`, ARM `aes` feature flags), else
    ChaCha20-Poly1305. Where /proc/cpuinfo is not readable, AES-GCM (every current server CPU)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return SUITE_AES_GCM if "aes" in line.split(":", 1)[1].split() else SUITE_CHACHA
    except OSError:
        pass
    return SUITE_AES_GCM


class ReplayWindow:
    """Sliding window over a session's counters (RFC 6479 / WireGuard): the highest counter seen
    and a bitmap of the REPLAY_WINDOW_FRAMES below it. `check` before the body is read, `record`
    once the whole frame authenticated (so a forged frame never moves the window)."""

    def __init__(self) -> None:
        self.high = -1
        self._seen = 0     # bit i: counter high - i was accepted

    def check(self, counter: int) -> None:
        if counter > self.high:
            return
        behind = self.high - counter
        if behind >= REPLAY_WINDOW_FRAMES:
            raise RemoteProtocolError("stale", f"counter {counter} is {behind} behind the newest: outside the window")
        if (self._seen >> behind) & 1:
            raise RemoteProtocolError("replay", f"counter {counter} already seen")

    def record(self, counter: int) -> None:
        self.check(counter)
        if counter > self.high:
            shift = counter - self.high
            self._seen = ((self._seen << shift) | 1) & _WINDOW_MASK if shift < REPLAY_WINDOW_FRAMES else 1
            self.high = counter
        else:
            self._seen |= 1 << (self.high - counter)


@dataclass(eq=False)
class _Keys:
    sid: bytes
    peer: bytes
    aead: AESGCM | ChaCha20Poly1305
    header_key: bytes
    suite: int
    opened_ms: int


@dataclass(eq=False)
class OutSession(_Keys):
    """The sending half: the next counter, and what was sent under it (for rekeying)."""

    next_counter: int = 0
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_counter(self, nbytes: int) -> int:
        with self.lock:
            counter, self.next_counter = self.next_counter, self.next_counter + 1
            self.bytes_sent += nbytes
            return counter

    def worn(self, now_ms: int) -> bool:
        return (now_ms - self.opened_ms >= SESSION_REKEY_AFTER_MS or self.next_counter >= SESSION_REKEY_AFTER_FRAMES
                or self.bytes_sent >= SESSION_REKEY_AFTER_BYTES)


@dataclass(eq=False)
class InSession(_Keys):
    """The receiving half: its replay window; `confirmed` once a frame under it authenticated.
    `reply`: a responder's sending half of the same session, usable once this one is confirmed."""

    window: ReplayWindow = field(default_factory=ReplayWindow)
    confirmed: bool = False
    reply: OutSession | None = None


@dataclass(frozen=True)
class PendingHello:
    """What an initiator keeps between its hello and the welcome (the ephemeral key included)."""

    peer: bytes
    hello: bytes
    sid: bytes
    suite: int
    ephemeral: X25519PrivateKey


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _derive(ephemeral: X25519PrivateKey, their_ephemeral: bytes, seed: bytes, hello: bytes,
            responder_ephemeral: bytes, suite: int) -> tuple[bytes, bytes, bytes, bytes]:
    try:
        shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(their_ephemeral))
    except ValueError:   # a low-order point: an all-zero agreement
        raise RemoteProtocolError("handshake", "ephemeral key is not a usable X25519 point") from None
    salt = hashlib.sha256(hello + responder_ephemeral).digest()
    okm = HKDF(algorithm=hashes.SHA256(), length=128, salt=salt, info=b"fedpeer/v2 keys" + bytes([suite])).derive(
        shared + seed)
    return okm[:32], okm[32:64], okm[64:96], okm[96:]     # I->R key, header key; R->I key, header key


class Handshakes:
    """Building and checking hellos and welcomes for one identity. `seed(peer, label)` is the
    pair's static secret (Identity.pairwise_seed, cached by wire.PairKeys)."""

    def __init__(self, identity: Identity, seed: Callable[[bytes, bytes], bytes], suite: int | None = None) -> None:
        self._identity = identity
        self._seed = seed
        self._suite = preferred_suite() if suite is None else suite
        self._answered: dict[bytes, OrderedDict[bytes, int]] = {}   # sender -> hello digest -> answered at ms

    def hello(self, peer: bytes) -> PendingHello:
        me = self._identity.public_key
        ephemeral = X25519PrivateKey.generate()
        sid = os.urandom(SID_BYTES)
        body = HELLO_MAGIC + me + peer + sid + bytes([self._suite]) + _raw(ephemeral.public_key())
        body += hashlib.blake2b(body, key=self._seed(peer, _HELLO_TAG_LABEL), digest_size=HELLO_TAG_BYTES).digest()
        body += self._identity.sign(_HELLO_SIGN + body)
        return PendingHello(peer=peer, hello=body, sid=sid, suite=self._suite, ephemeral=ephemeral)

    def answer(self, hello: bytes, allowed: Callable[[bytes], bool], now_ms: int,
               admit: Callable[[bytes], bool] | None = None) -> tuple[bytes, InSession]:
        """Check a hello (layout -> addressed to me -> sender listed -> tag -> no replay -> the
        sender's handshake budget, `admit` -> signature) and answer it: (welcome, the new
        session's receiving half). Raises RemoteProtocolError."""
        if len(hello) != HELLO_BYTES or hello[:MAGIC_BYTES] != HELLO_MAGIC:
            raise RemoteProtocolError("frame", "not a fedpeer hello")
        at = MAGIC_BYTES
        sender, at = hello[at:at + PUBLIC_KEY_BYTES], at + PUBLIC_KEY_BYTES
        recipient, at = hello[at:at + PUBLIC_KEY_BYTES], at + PUBLIC_KEY_BYTES
        sid, at = hello[at:at + SID_BYTES], at + SID_BYTES
        suite, at = hello[at], at + 1
        their_ephemeral, at = hello[at:at + EPHEMERAL_BYTES], at + EPHEMERAL_BYTES
        tag, signed = hello[at:at + HELLO_TAG_BYTES], hello[:at + HELLO_TAG_BYTES]
        if not allowed(sender):
            raise RemoteProtocolError("unknown_sender", "public key not in peers.toml")
        if recipient != self._identity.public_key:
            raise RemoteProtocolError("header", "hello addressed to another key (the sender holds another key for us)")
        want = hashlib.blake2b(hello[:at], key=self._seed(sender, _HELLO_TAG_LABEL), digest_size=HELLO_TAG_BYTES)
        if not hmac.compare_digest(want.digest(), tag):
            raise RemoteProtocolError("header", "hello tag does not verify (forged, or another key for us)")
        digest = hashlib.blake2b(hello, digest_size=16).digest()
        if self._seen(sender, digest, now_ms):        # a replay costs no signature check nor key exchange
            raise RemoteProtocolError("replay", "a hello already answered (replayed)")
        if admit is not None and not admit(sender):   # proven key, before the costly part it bounds
            raise RemoteProtocolError("hello_rate", "more session handshakes under this key than it may open")
        if not verify(sender, _HELLO_SIGN + signed, hello[at + HELLO_TAG_BYTES:]):
            raise RemoteProtocolError("signature", "hello signature does not verify")
        self._remember(sender, digest, now_ms)
        if suite not in SUITES:
            raise RemoteProtocolError("handshake", f"unknown cipher suite {suite}")
        ephemeral = X25519PrivateKey.generate()
        mine = _raw(ephemeral.public_key())
        key, header_key, back, back_header = _derive(ephemeral, their_ephemeral,
                                                     self._seed(sender, _SESSION_SEED_LABEL), hello, mine, suite)
        welcome = WELCOME_MAGIC + sid + mine
        welcome += self._identity.sign(_WELCOME_SIGN + hashlib.sha256(hello).digest() + sid + mine)
        reply = OutSession(sid=sid, peer=sender, aead=SUITES[suite](back), header_key=back_header, suite=suite,
                           opened_ms=now_ms)
        session = InSession(sid=sid, peer=sender, aead=SUITES[suite](key), header_key=header_key, suite=suite,
                            opened_ms=now_ms, reply=reply)
        return welcome, session

    def _seen(self, sender: bytes, digest: bytes, now_ms: int) -> bool:
        answered = self._answered.get(sender)
        at = answered.get(digest) if answered is not None else None
        return at is not None and now_ms - at < SESSION_REJECT_AFTER_MS

    def _remember(self, sender: bytes, digest: bytes, now_ms: int) -> None:
        answered = self._answered.setdefault(sender, OrderedDict())
        answered[digest] = now_ms
        while len(answered) > HELLOS_REMEMBERED_PER_PEER:
            answered.popitem(last=False)

    def finish(self, pending: PendingHello, welcome: bytes, now_ms: int) -> tuple[OutSession, InSession]:
        """Check the peer's welcome to `pending`; the session's sending and receiving halves.
        Raises RemoteProtocolError."""
        if len(welcome) != WELCOME_BYTES or welcome[:MAGIC_BYTES] != WELCOME_MAGIC:
            raise RemoteProtocolError("frame", "not a fedpeer welcome")
        at = MAGIC_BYTES
        sid, at = welcome[at:at + SID_BYTES], at + SID_BYTES
        theirs, at = welcome[at:at + EPHEMERAL_BYTES], at + EPHEMERAL_BYTES
        if sid != pending.sid:
            raise RemoteProtocolError("handshake", "welcome for another session")
        signed = _WELCOME_SIGN + hashlib.sha256(pending.hello).digest() + sid + theirs
        if not verify(pending.peer, signed, welcome[at:]):
            raise RemoteProtocolError("signature", "welcome signature does not verify (another key answers)")
        key, header_key, back, back_header = _derive(pending.ephemeral, theirs,
                                                     self._seed(pending.peer, _SESSION_SEED_LABEL),
                                                     pending.hello, theirs, pending.suite)
        aead = SUITES[pending.suite]
        return (OutSession(sid=sid, peer=pending.peer, aead=aead(key), header_key=header_key, suite=pending.suite,
                           opened_ms=now_ms),
                InSession(sid=sid, peer=pending.peer, aead=aead(back), header_key=back_header, suite=pending.suite,
                          opened_ms=now_ms, confirmed=True))


class Sessions:
    """This site's sessions: the sending half per peer, the receiving halves per (peer, sid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out: dict[bytes, OutSession] = {}
        self._in: dict[bytes, dict[bytes, InSession]] = {}    # peer -> sid -> session, oldest first

    def outbound(self, peer: bytes, now_ms: int) -> OutSession | None:
        """The session to send to `peer` under, or None when there is none or it is worn out."""
        with self._lock:
            session = self._out.get(peer)
            return None if session is None or session.worn(now_ms) else session

    def opened(self, out: OutSession, back: InSession, now_ms: int) -> None:
        """An initiator's handshake finished: send under `out`, receive the peer's frames under `back`."""
        with self._lock:
            self._out[out.peer] = out
            self._hold(back, now_ms)

    def forget_outbound(self, peer: bytes, sid: bytes) -> None:
        """The peer does not know session `sid` (it restarted): open a new one next time."""
        with self._lock:
            if (s := self._out.get(peer)) is not None and s.sid == sid:
                del self._out[peer]

    def add_inbound(self, session: InSession, now_ms: int) -> None:
        """A responder's half of a session a peer opened (its sending half comes into use once
        the peer's first frame under it is recorded)."""
        with self._lock:
            held = self._in.get(session.peer, {})
            self._expire(held, now_ms)
            if session.sid in held:
                raise RemoteProtocolError("replay", "hello for a session already open")
            self._hold(session, now_ms)

    def _hold(self, session: InSession, now_ms: int) -> None:
        held = self._in.setdefault(session.peer, {})
        self._expire(held, now_ms)
        while len(held) >= INBOUND_SESSIONS_PER_PEER_MAX:   # half-open ones go first, then the oldest
            victim = next((sid for sid, s in held.items() if not s.confirmed), next(iter(held)))
            del held[victim]
        held[session.sid] = session

    def inbound(self, peer: bytes, sid: bytes, now_ms: int) -> InSession | None:
        with self._lock:
            held = self._in.get(peer)
            session = None if held is None else held.get(sid)
            if session is not None and now_ms - session.opened_ms >= SESSION_REJECT_AFTER_MS:
                del held[sid]   # type: ignore[union-attr]
                return None
            return session

    def check(self, session: InSession, counter: int) -> None:
        with self._lock:
            session.window.check(counter)

    def record(self, session: InSession, counter: int) -> None:
        with self._lock:
            session.window.record(counter)
            session.confirmed = True
            reply, session.reply = session.reply, None
            current = self._out.get(session.peer)
            if reply is not None and (current is None or current.opened_ms <= reply.opened_ms):
                self._out[session.peer] = reply   # the peer holds this session: answer under it

    def drop_peer(self, peer: bytes) -> None:
        """A peer removed from peers.toml: its sessions end (both directions)."""
        with self._lock:
            self._out.pop(peer, None)
            self._in.pop(peer, None)

    def prune(self, now_ms: int) -> None:
        """Forget expired receiving halves and worn-out sending halves (called from the node's tick)."""
        with self._lock:
            for peer in list(self._in):
                self._expire(self._in[peer], now_ms)
                if not self._in[peer]:
                    del self._in[peer]
            for peer in [p for p, s in self._out.items() if now_ms - s.opened_ms >= SESSION_REJECT_AFTER_MS]:
                del self._out[peer]

    @staticmethod
    def _expire(held: dict[bytes, InSession], now_ms: int) -> None:
        for sid in [sid for sid, s in held.items() if now_ms - s.opened_ms >= SESSION_REJECT_AFTER_MS]:
            del held[sid]

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"outbound": len(self._out), "inbound": sum(len(h) for h in self._in.values())}
