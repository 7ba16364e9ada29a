"""The gate: every kind of bad frame is rejected with its own reason, and good ones round-trip."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.core.membership import swim as mb
from fedpeer.errors import RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.wire import frame as wire
from fedpeer.wire.session import (
    INBOUND_SESSIONS_PER_PEER_MAX,
    REPLAY_WINDOW_FRAMES,
    SESSION_REJECT_AFTER_MS,
    SESSION_REKEY_AFTER_BYTES,
    SESSION_REKEY_AFTER_MS,
    SUITE_CHACHA,
    Handshakes,
    ReplayWindow,
    Sessions,
)
from fedpeer.testing import frames

NOW_MS = 1_700_000_000     # monotonic milliseconds (sessions never read the wall clock)


class Peers:
    """Alice sends to Bob under a session; Bob's gate knows Alice; Mallory is not in Bob's allowlist."""

    def __init__(self, state: Path | None = None) -> None:
        self.alice, self.bob, self.mallory = Identity.generate(), Identity.generate(), Identity.generate()
        self.gate = self.new_gate()
        self.forger = frames.Forger(self.alice)
        self.forger.pair(self.gate, self.bob.public_key, NOW_MS)

    def new_gate(self, bytes_max: int = 1 << 20) -> wire.Gate:
        """Bob's gate with no sessions (as after a restart)."""
        return wire.Gate(self.bob, {self.alice.public_key}.__contains__, Sessions(), message_bytes_max=bytes_max)

    def ping(self, probe_id: int = 7) -> mb.Ping:
        upd = mb.Update(node=self.bob.public_key, state=mb.MemberState.SUSPECT, incarnation=3, address="127.0.0.1:9")
        return mb.Ping(probe_id=probe_id, incarnation=2, address="127.0.0.1:8", updates=(upd,))

    def frame(self, msg: object = None, **kw: object) -> bytes:
        return self.forger.seal(self.bob.public_key, msg or self.ping(), **kw)


@pytest.fixture
def peers() -> Peers:
    return Peers()


def reason(gate: wire.Gate, frame: bytes, now_ms: int = NOW_MS) -> str:
    with pytest.raises(RemoteProtocolError) as err:
        gate.open(frame, now_ms)
    return err.value.reason


def test_round_trip(peers: Peers) -> None:
    env = peers.gate.open(peers.frame(), NOW_MS)
    assert env.msg == peers.ping()
    assert (env.kind, env.src, env.dst, env.seq) == ("ping", peers.alice.public_key, peers.bob.public_key, 0)


def test_unknown_sender_rejected_before_decoding(peers: Peers) -> None:
    mallory = frames.Forger(peers.mallory)
    mallory.fake_session(peers.bob.public_key)
    assert reason(peers.gate, mallory.seal(peers.bob.public_key, peers.ping())) == "unknown_sender"
    with pytest.raises(RemoteProtocolError, match="unknown_sender"):
        mallory.pair(peers.gate, peers.bob.public_key, NOW_MS)   # nor can it open a session


def test_every_single_bit_flip_is_rejected(peers: Peers) -> None:
    frame = peers.frame()
    for i in range(0, len(frame) * 8, 3):    # every 3rd bit: header, ciphertext, AEAD tag
        flipped = bytearray(frame)
        flipped[i // 8] ^= 1 << (i % 8)
        assert reason(peers.gate, bytes(flipped)) in {
            "frame", "unknown_sender", "unknown_session", "header", "oversize", "decrypt"}
    peers.gate.open(frame, NOW_MS)   # the original still opens: no flip moved the window


def test_replay_rejected_and_old_sessions_refused_after_restart(peers: Peers) -> None:
    frame = peers.frame()
    peers.gate.open(frame, NOW_MS)
    assert reason(peers.gate, frame) == "replay"
    restarted = peers.new_gate()   # a restarted receiver holds no session: nothing of the old ones opens
    assert reason(restarted, frame) == "unknown_session"
    assert reason(restarted, peers.frame()) == "unknown_session"
    peers.forger.pair(restarted, peers.bob.public_key, NOW_MS)   # the sender just opens a new one
    assert restarted.open(peers.frame(), NOW_MS).seq == 0


def test_out_of_order_inside_window_accepted_once(peers: Peers) -> None:
    early, late = peers.frame(), peers.frame()
    peers.gate.open(late, NOW_MS)
    peers.gate.open(early, NOW_MS)           # concurrent requests may arrive out of order
    assert reason(peers.gate, early) == "replay"


def test_replay_window_is_constant_work_and_refuses_what_fell_behind() -> None:
    window = ReplayWindow()
    for counter in range(0, 100_000, 3):
        window.record(counter)
    assert window.high == 99_999 and window._seen.bit_length() <= REPLAY_WINDOW_FRAMES
    with pytest.raises(RemoteProtocolError, match="replay"):
        window.check(99_996)
    with pytest.raises(RemoteProtocolError) as err:
        window.check(99_999 - REPLAY_WINDOW_FRAMES)
    assert err.value.reason == "stale"
    window.record(99_998)    # inside the window, never seen: out of order, accepted once
    with pytest.raises(RemoteProtocolError, match="replay"):
        window.check(99_998)
    window.record(99_999 + 10 * REPLAY_WINDOW_FRAMES)   # a jump past the whole window forgets it all
    with pytest.raises(RemoteProtocolError) as err:
        window.check(99_998)
    assert err.value.reason == "stale"


def test_addressed_to_another_node(peers: Peers) -> None:
    carol = Identity.generate()
    carol_gate = wire.Gate(carol, {peers.alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    peers.forger.pair(carol_gate, carol.public_key, NOW_MS)
    frame = peers.forger.seal(carol.public_key, peers.ping())
    assert reason(peers.gate, frame) == "unknown_session"   # Bob never agreed to Alice's session with Carol


def test_a_frame_from_an_expired_session_is_refused(peers: Peers) -> None:
    frame = peers.frame()
    assert reason(peers.gate, frame, NOW_MS + SESSION_REJECT_AFTER_MS) == "unknown_session"


def test_handshake_replay_and_forgery(peers: Peers) -> None:
    pending = peers.forger.handshakes.hello(peers.bob.public_key)
    welcome = peers.gate.hello(pending.hello, NOW_MS)
    with pytest.raises(RemoteProtocolError) as err:   # the same hello again: that session is open
        peers.gate.hello(pending.hello, NOW_MS)
    assert err.value.reason == "replay"
    # a hello replayed once its session expired gets a welcome, but keys only the original
    # initiator could derive, from an ephemeral key it has dropped: the recorder can open nothing
    later = NOW_MS + SESSION_REJECT_AFTER_MS
    replayed = peers.gate.hello(pending.hello, later)
    assert replayed[:12] == welcome[:12] and replayed[12:44] != welcome[12:44]   # same sid, fresh e_R
    for i in (5, 80, 100, 130, 188):   # sender, ephemeral key, tag, signature: every part is bound
        with pytest.raises(RemoteProtocolError) as err:
            peers.gate.hello(frames.flip(peers.forger.handshakes.hello(peers.bob.public_key).hello, i), NOW_MS)
        assert err.value.reason in ("unknown_sender", "header", "signature")
    carol = Identity.generate()   # a hello for someone else
    with pytest.raises(RemoteProtocolError, match="header"):   # (refusal_hint: "another key")
        peers.gate.hello(peers.forger.handshakes.hello(carol.public_key).hello, NOW_MS)
    # a welcome that is not from Bob (or not for this hello) is refused by the initiator
    pending = peers.forger.handshakes.hello(peers.bob.public_key)
    good = peers.gate.hello(pending.hello, NOW_MS)
    for bad in (frames.flip(good, 20), frames.flip(good, 100), good[:4] + b"\0" * 8 + good[12:]):
        with pytest.raises(RemoteProtocolError):
            peers.forger.handshakes.finish(pending, bad, NOW_MS)


def test_half_open_sessions_are_bounded_per_peer(peers: Peers) -> None:
    peers.gate.open(peers.frame(), NOW_MS)   # the session in use is confirmed
    for _ in range(3 * INBOUND_SESSIONS_PER_PEER_MAX):   # replayed or abandoned hellos
        peers.gate.hello(peers.forger.handshakes.hello(peers.bob.public_key).hello, NOW_MS)
    assert peers.gate.sessions.counts()["inbound"] == INBOUND_SESSIONS_PER_PEER_MAX
    assert peers.gate.open(peers.frame(), NOW_MS).msg == peers.ping()   # the one in use survived (confirmed)


def test_sessions_rekey_by_time_and_volume(peers: Peers) -> None:
    session = peers.forger.sessions[peers.bob.public_key]
    assert not session.worn(NOW_MS + SESSION_REKEY_AFTER_MS - 1)
    assert session.worn(NOW_MS + SESSION_REKEY_AFTER_MS)
    session.bytes_sent = SESSION_REKEY_AFTER_BYTES
    assert session.worn(NOW_MS)


def test_forward_secrecy_keys_differ_per_session(peers: Peers) -> None:
    a = peers.forger.pair(peers.gate, peers.bob.public_key, NOW_MS)
    b = peers.forger.pair(peers.gate, peers.bob.public_key, NOW_MS)
    assert a.header_key != b.header_key and a.sid != b.sid


def seal_raw(peers: Peers, plaintext: bytes) -> bytes:
    """A correctly sealed frame around arbitrary plaintext (a compromised peer)."""
    return peers.forger.seal_raw(peers.bob.public_key, plaintext)


@pytest.mark.parametrize("frame", [b"", b"FPW3", b"FPW3" + b"\0" * 100, b"GET / HTTP/1.1\r\n\r\n" * 20,
                                   (2**32).to_bytes(8, "big") + b"x" * 200])
def test_truncated_and_foreign_frames(peers: Peers, frame: bytes) -> None:
    assert reason(peers.gate, frame) == "frame"


def test_oversize(peers: Peers) -> None:
    gate = peers.new_gate(bytes_max=100)
    assert reason(gate, peers.frame()) == "oversize"


def test_deep_nesting_from_an_authenticated_peer(peers: Peers) -> None:
    deep = b"\x91" * 10_000 + b"\xc0"
    assert reason(peers.gate, seal_raw(peers, deep)) == "decode"
    nested = [[]]
    for _ in range(100):
        nested = [nested]
    assert reason(peers.gate, seal_raw(peers, frames.envelope({"x": nested}))) == "decode"


@pytest.mark.parametrize("mutate,why", [
    (lambda b: {**b, "probe_id": -1}, "schema"),
    (lambda b: {**b, "probe_id": True}, "schema"),
    (lambda b: {**b, "extra": 1}, "schema"),
    (lambda b: {k: v for k, v in b.items() if k != "address"}, "schema"),
    (lambda b: {**b, "updates": [{"node": b"x", "state": "alive", "incarnation": 0, "address": ""}]}, "schema"),
    (lambda b: {**b, "updates": [{"node": b"x" * 32, "state": "zombie", "incarnation": 0, "address": ""}]}, "schema"),
])
def test_typed_validation(peers: Peers, mutate, why: str) -> None:
    body = {"probe_id": 1, "incarnation": 1, "address": "h:1", "updates": []}
    assert reason(peers.gate, seal_raw(peers, frames.envelope(mutate(body)))) == why


def test_unknown_kind_ext_types_and_old_envelopes(peers: Peers) -> None:
    assert reason(peers.gate, seal_raw(peers, frames.envelope({}, kind="exec"))) == "unknown_kind"
    assert reason(peers.gate, seal_raw(peers, frames.envelope(msgpack.ExtType(2, b"boom")))) == "decode"
    assert reason(peers.gate, seal_raw(peers, frames.envelope(msgpack.ExtType(1, b"boom")))) == "decode"
    old = {"v": 1, "kind": "ping", "src": peers.alice.public_key, "dst": peers.bob.public_key, "job": "",
           "term": 0, "seq": 1, "ts_ms": 0, "body": {}}   # protocol 1's envelope
    assert reason(peers.gate, seal_raw(peers, frames.plain(msgpack.packb(old)))) == "schema"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_crash_the_gate(data: bytes) -> None:
    gate = _FUZZ.gate
    with pytest.raises(RemoteProtocolError):
        gate.open(data, NOW_MS)
    with pytest.raises(RemoteProtocolError):
        gate.open(wire.MAGIC + _FUZZ.alice.public_key + data, NOW_MS)
    with pytest.raises(RemoteProtocolError):   # a known session id, then anything
        gate.open(wire.MAGIC + _FUZZ.alice.public_key + _FUZZ.forger.sessions[_FUZZ.bob.public_key].sid + data, NOW_MS)
    with pytest.raises(RemoteProtocolError):
        gate.hello(data, NOW_MS)


_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_msgpack_values, st.sampled_from(["ping", "ack", "ping_req", "indirect_ack", "nope"]))
def test_authenticated_garbage_bodies_are_rejected_or_typed(body, kind: str) -> None:
    """Whatever an allow-listed (but malicious) peer encodes, the gate returns a typed message or
    raises RemoteProtocolError — never another exception."""
    try:
        env = _FUZZ.gate.open(seal_raw(_FUZZ, frames.envelope(body, kind)), NOW_MS)
    except RemoteProtocolError:
        return
    assert isinstance(env.msg, (mb.Ping, mb.Ack, mb.PingReq, mb.IndirectAck))


@settings(max_examples=300, deadline=None)
@given(_msgpack_values | st.fixed_dictionaries({"tag": st.text(max_size=8), "refused": st.text(max_size=8)},
                                               optional={"data": _msgpack_values, "digests": _msgpack_values})
       | st.fixed_dictionaries({"tag": st.text(max_size=8), "reason": st.text(max_size=8)},
                               optional={"attempt": _msgpack_values, "base": _msgpack_values,
                                         "dropped": _msgpack_values, "order": _msgpack_values}),
       st.sampled_from(["ss_rm_result", "ss_rm_check", "ss_ar_reveal", "ss_chunk", "ss_change", "ss_list_ask"]))
def test_authenticated_garbage_secure_sum_bodies_are_rejected_or_typed(body, kind: str) -> None:
    """The secure sum's messages (the reduce-map's results and digests among them) pass the same
    gate: a typed message or RemoteProtocolError, never another exception."""
    from fedpeer.protocols.securesum import wire as ssw

    try:
        env = _FUZZ.gate.open(seal_raw(_FUZZ, frames.envelope(body, kind)), NOW_MS)
    except RemoteProtocolError:
        return
    assert isinstance(env.msg, (ssw.ArResult, ssw.ArCheck, ssw.ArReveal, ssw.SumChunk, ssw.SumChange, ssw.SumListAsk))


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=400))
def test_garbage_plaintext_from_an_authenticated_peer(plaintext: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        _FUZZ.gate.open(seal_raw(_FUZZ, plaintext), NOW_MS)


_FUZZ = Peers()


def test_array_codec_checks_length_and_dtype() -> None:
    check = wire.v_array(max_elements=100)
    a = np.arange(12, dtype=np.uint64).reshape(3, 4)
    assert (check(wire.encode_array(a), "x") == a).all()
    enc = wire.encode_array(a)
    with pytest.raises(RemoteProtocolError):
        check({**enc, "shape": [4, 4]}, "x")
    with pytest.raises(RemoteProtocolError):
        check({**enc, "dtype": "|O"}, "x")
    with pytest.raises(RemoteProtocolError):
        check({**enc, "shape": [1000, 1000]}, "x")
    with pytest.raises(RemoteProtocolError):
        check(wire.encode_array(np.array([np.nan])), "x")


# -- the frame header: the sender is known from the first 72 bytes ----------------------------

def test_header_authenticates_the_sender_before_the_body(peers: Peers) -> None:
    frame = peers.frame()
    header = peers.gate.open_header(frame[:wire.HEADER_BYTES], NOW_MS)
    assert (header.sender, header.length) == (peers.alice.public_key, len(frame))
    mallory = frames.Forger(peers.mallory)
    mallory.fake_session(peers.bob.public_key)
    stranger = mallory.seal(peers.bob.public_key, peers.ping())
    with pytest.raises(RemoteProtocolError, match="unknown_sender"):
        peers.gate.open_header(stranger[:wire.HEADER_BYTES], NOW_MS)
    # a stranger claiming Alice's key and session cannot make the tag; nor can anyone lengthen a real header
    forged = bytearray(stranger[:wire.HEADER_BYTES])
    forged[4:36] = peers.alice.public_key
    forged[36:44] = frame[36:44]
    longer = bytearray(frame[:wire.HEADER_BYTES])
    longer[52:56] = (len(frame) + 1000).to_bytes(4, "little")
    for bad in (bytes(forged), bytes(longer)):
        with pytest.raises(RemoteProtocolError) as err:
            peers.gate.open_header(bad, NOW_MS)
        assert err.value.reason == "header"
        assert getattr(err.value, "sender", None) is None      # not verified: nobody to blame


def test_a_replayed_header_is_refused_before_its_body(peers: Peers) -> None:
    frame = peers.frame()
    peers.gate.open(frame, NOW_MS)
    with pytest.raises(RemoteProtocolError) as err:
        peers.gate.open_header(frame[:wire.HEADER_BYTES], NOW_MS)
    assert err.value.reason == "replay" and err.value.sender == peers.alice.public_key


def test_header_declaring_more_than_the_cap_is_oversize(peers: Peers) -> None:
    gate = peers.new_gate(bytes_max=1024)
    big = peers.frame(msg=wire.DiagProbe(b"x" * 2000))
    with pytest.raises(RemoteProtocolError, match="oversize"):
        gate.open_header(big[:wire.HEADER_BYTES], NOW_MS)


def test_errors_after_the_header_name_the_verified_sender_and_job(peers: Peers) -> None:
    with pytest.raises(RemoteProtocolError) as err:
        peers.gate.open(seal_raw(peers, frames.envelope({"x": 1}, job="stats-1")), NOW_MS)
    assert (err.value.reason, err.value.sender, err.value.job) == ("schema", peers.alice.public_key, "stats-1")


def test_refusals_are_authenticated(peers: Peers) -> None:
    frame = peers.frame()
    tag = peers.gate.refusal_tag(wire.parse_header(frame), "schema")
    keys = peers.forger.keys
    assert wire.refusal_verified(keys, peers.bob.public_key, frame, "schema", tag)
    assert not wire.refusal_verified(keys, peers.bob.public_key, frame, "replay", tag)   # other reason
    assert not wire.refusal_verified(keys, peers.mallory.public_key, frame, "schema", tag)
    assert not wire.refusal_verified(keys, peers.bob.public_key, frame, "schema", "zz")
    assert not wire.refusal_verified(keys, peers.bob.public_key, peers.frame(), "schema", tag)   # another frame


def test_decoded_item_budget_stops_amplification_early(peers: Peers) -> None:
    """24 arrays of 2^20 empty arrays: within every length and depth limit, 24 MiB on the wire,
    1.8 GiB and 22 s to decode whole. The budget stops msgpack after DECODED_ITEMS_MAX items."""
    import time

    inner = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * (1 << 20)
    plaintext = b"\xdc" + (24).to_bytes(2, "big") + inner * 24
    gate = peers.new_gate(bytes_max=64 << 20)
    peers.forger.pair(gate, peers.bob.public_key, NOW_MS)
    frame = seal_raw(peers, frames.plain(plaintext))
    started = time.perf_counter()
    with pytest.raises(RemoteProtocolError) as err:
        gate.open(frame, NOW_MS)
    assert err.value.reason == "decode" and "decoded items" in err.value.detail
    assert time.perf_counter() - started < 5    # generous: the point is seconds, not 22 s


def test_legit_large_lists_fit_the_budget(peers: Peers) -> None:
    features = [f"f{i}" for i in range(100_000)]     # the largest list a job message may carry
    assert len(wire._decode(frames.plain(msgpack.packb({"features": features})), 1 << 30)["features"]) == 100_000


def test_chacha_suite_round_trips() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    gate = wire.Gate(bob, {alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    forger = frames.Forger(alice)
    forger.handshakes = Handshakes(alice, forger.keys.key, SUITE_CHACHA)
    forger.pair(gate, bob.public_key, NOW_MS)
    assert gate.open(forger.seal(bob.public_key, wire.DiagProbe(b"x" * 100)), NOW_MS).msg == wire.DiagProbe(b"x" * 100)


def test_large_arrays_and_bytes_travel_after_the_msgpack_part(peers: Peers) -> None:
    """Arrays and byte strings of RawBytes.BYTES_MIN or more are not copied into msgpack; they
    come back whole (arrays as writable views of the decrypted frame), and a tail that does not
    match its references exactly is refused."""
    from fedpeer.protocols.securesum.api import SumChunk
    data = np.arange(1 << 15, dtype=np.uint64)          # 256 KiB
    plaintext = wire.pack(SumChunk("t", data))
    head = int.from_bytes(plaintext[:4], "little")
    assert len(plaintext) - 4 - head == data.nbytes     # the array is the raw tail
    peers.gate._allowed = lambda k: True
    env = peers.gate.open(seal_raw(peers, plaintext), NOW_MS)
    assert np.array_equal(env.msg.data, data) and env.msg.data.flags.writeable
    probe = peers.gate.open(peers.frame(wire.DiagProbe(b"p" * 100_000)), NOW_MS)
    assert probe.msg.payload == b"p" * 100_000
    ref = msgpack.ExtType(wire.RAW_EXT, wire._RAW_REF.pack(0, 10))
    for tail, refs, why in ((b"x" * 11, [ref], "not referred"),           # a byte left over
                            (b"x" * 9, [ref], "outside the tail"),        # too short
                            (b"x" * 20, [msgpack.ExtType(wire.RAW_EXT, wire._RAW_REF.pack(10, 10)), ref],
                             "out of order")):
        packed = msgpack.packb({"v": wire.PROTOCOL_VERSION, "kind": "diag_probe", "job": "", "term": 0,
                                "body": {"payload": refs[0]} if len(refs) == 1 else {"payload": refs}})
        with pytest.raises(RemoteProtocolError) as err:
            peers.gate.open(seal_raw(peers, frames.plain(packed) + tail), NOW_MS)
        assert err.value.reason == "decode", why


def test_one_handshake_serves_both_directions_once_the_initiator_has_sent() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    gates = {k.public_key: wire.Gate(k, lambda _: True, Sessions(), message_bytes_max=1 << 20) for k in (alice, bob)}
    a, b = gates[alice.public_key], gates[bob.public_key]
    pending = a.handshakes.hello(bob.public_key)
    welcome = b.hello(pending.hello, NOW_MS)
    out, back = a.handshakes.finish(pending, welcome, NOW_MS)
    a.sessions.opened(out, back, NOW_MS)
    assert b.sessions.outbound(alice.public_key, NOW_MS) is None   # not before alice's first frame ...
    b.open(wire.Sealer(alice).seal(out, wire.DiagProbe(b"ping")), NOW_MS)
    reply = b.sessions.outbound(alice.public_key, NOW_MS)           # ... then bob answers under the same session
    assert reply is not None and reply.sid == out.sid and reply.header_key != out.header_key
    assert a.open(wire.Sealer(bob).seal(reply, wire.DiagProbe(b"ack")), NOW_MS).msg == wire.DiagProbe(b"ack")
    # a recorded hello replayed later never gives bob a session to answer under
    c = wire.Gate(bob, lambda _: True, Sessions(), message_bytes_max=1 << 20)
    c.hello(pending.hello, NOW_MS)
    assert c.sessions.outbound(alice.public_key, NOW_MS) is None


def test_a_replayed_hello_is_refused_before_its_signature_is_checked(monkeypatch) -> None:
    """A captured hello sent again costs no Ed25519 check nor key exchange: the hellos a sender had
    answered are remembered (HELLOS_REMEMBERED_PER_PEER, for SESSION_REJECT_AFTER_MS)."""
    from fedpeer.wire import session as ses

    alice, bob = Identity.generate(), Identity.generate()
    a_keys, b_keys = wire.PairKeys(alice), wire.PairKeys(bob)
    a, b = Handshakes(alice, a_keys.key), Handshakes(bob, b_keys.key)
    hello = a.hello(bob.public_key).hello
    b.answer(hello, {alice.public_key}.__contains__, NOW_MS)
    checks = []
    real = ses.verify
    monkeypatch.setattr(ses, "verify", lambda *args: checks.append(1) or real(*args))
    with pytest.raises(RemoteProtocolError) as err:
        b.answer(hello, {alice.public_key}.__contains__, NOW_MS + 1_000)
    assert err.value.reason == "replay" and checks == []
    fresh = a.hello(bob.public_key).hello                    # a new hello of the same peer still opens
    b.answer(fresh, {alice.public_key}.__contains__, NOW_MS + 1_000)
    assert checks == [1]
    later = NOW_MS + ses.SESSION_REJECT_AFTER_MS + 1          # forgotten with the sessions it could open
    b.answer(hello, {alice.public_key}.__contains__, later)
    for _ in range(ses.HELLOS_REMEMBERED_PER_PEER + 1):      # bounded per sender
        b.answer(a.hello(bob.public_key).hello, {alice.public_key}.__contains__, later)
    assert len(b._answered[alice.public_key]) == ses.HELLOS_REMEMBERED_PER_PEER
