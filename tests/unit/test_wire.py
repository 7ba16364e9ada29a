"""The gate: every kind of bad frame is rejected with its own reason, and good ones round-trip."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer import wire
from fedpeer.core import membership as mb
from fedpeer.errors import RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.store import Counter
from tests import frames

NOW_MS = 1_700_000_000_000
NOW_US = NOW_MS * 1000


class Peers:
    """Alice sends to Bob; Bob's gate knows Alice; Mallory is not in Bob's allowlist."""

    def __init__(self, state: Path) -> None:
        self.alice, self.bob, self.mallory = Identity.generate(), Identity.generate(), Identity.generate()
        self.state = state
        self.alice_sealer = wire.Sealer(self.alice)
        self.gate = self.new_gate()

    def new_gate(self, bytes_max: int = 1 << 20) -> wire.Gate:
        """Bob's gate, reading the replay marks persisted under `state` (as after a restart)."""
        replay = wire.ReplayGuard(window_us=10_000_000, recent_max=64,
                                  counter_for=lambda k: Counter(self.state / k.hex()))
        return wire.Gate(self.bob, {self.alice.public_key}.__contains__, replay,
                         message_bytes_max=bytes_max, clock_skew_ms_max=30_000)

    def ping(self, probe_id: int = 7) -> mb.Ping:
        upd = mb.Update(node=self.bob.public_key, state=mb.MemberState.SUSPECT, incarnation=3, address="127.0.0.1:9")
        return mb.Ping(probe_id=probe_id, incarnation=2, address="127.0.0.1:8", updates=(upd,))

    def frame(self, now_us: int = NOW_US, msg: object = None) -> bytes:
        return self.alice_sealer.seal(self.bob.public_key, msg or self.ping(), now_us)


@pytest.fixture
def peers(tmp_path: Path) -> Peers:
    return Peers(tmp_path)


def reason(gate: wire.Gate, frame: bytes, now_ms: int = NOW_MS) -> str:
    with pytest.raises(RemoteProtocolError) as err:
        gate.open(frame, now_ms)
    return err.value.reason


def test_round_trip(peers: Peers) -> None:
    env = peers.gate.open(peers.frame(), NOW_MS)
    assert env.msg == peers.ping()
    assert (env.kind, env.src, env.dst) == ("ping", peers.alice.public_key, peers.bob.public_key)


def test_unknown_sender_rejected_before_decoding(peers: Peers) -> None:
    frame = wire.Sealer(peers.mallory).seal(peers.bob.public_key, peers.ping(), NOW_US)
    assert reason(peers.gate, frame) == "unknown_sender"


def test_every_single_bit_flip_is_rejected(peers: Peers) -> None:
    frame = peers.frame()
    for i in range(0, len(frame) * 8, 7):    # every 7th bit: header, signature, nonce, body
        flipped = bytearray(frame)
        flipped[i // 8] ^= 1 << (i % 8)
        assert reason(peers.gate, bytes(flipped)) in {"frame", "unknown_sender", "header", "oversize", "signature"}


def test_replay_rejected_also_after_restart(peers: Peers) -> None:
    frame = peers.frame()
    peers.gate.open(frame, NOW_MS)
    assert reason(peers.gate, frame) == "replay"
    assert reason(peers.new_gate(), frame) == "replay"   # fresh gate = restarted receiver


def test_out_of_order_inside_window_accepted_once(peers: Peers) -> None:
    early, late = peers.frame(NOW_US), peers.frame(NOW_US + 5)
    peers.gate.open(late, NOW_MS)
    peers.gate.open(early, NOW_MS)           # concurrent requests may arrive out of order
    assert reason(peers.gate, early) == "replay"


def test_addressed_to_another_node(peers: Peers) -> None:
    carol = Identity.generate()
    frame = peers.alice_sealer.seal(carol.public_key, peers.ping(), NOW_US)
    assert reason(peers.gate, frame) == "header"   # sealed to carol: the header tag is not for bob


def test_wrong_dst_inside_a_frame_bob_can_open(peers: Peers) -> None:
    # Alice seals to Bob, but the envelope names someone else: only a buggy or malicious sender does this.
    envelope = {"v": 1, "kind": "ping", "src": peers.alice.public_key, "dst": b"\x01" * 32, "job": "",
                "term": 0, "seq": 1, "ts_ms": NOW_MS, "body": {}}
    assert reason(peers.gate, seal_raw(peers, msgpack.packb(envelope))) == "wrong_dst"


def seal_raw(peers: Peers, plaintext: bytes) -> bytes:
    """A correctly signed and sealed frame around arbitrary plaintext (a compromised peer)."""
    return frames.seal_raw(peers.alice, peers.bob.public_key, plaintext)


def test_skewed_timestamp(peers: Peers) -> None:
    assert reason(peers.gate, peers.frame(NOW_US - 31_000_000)) == "skew"


@pytest.mark.parametrize("frame", [b"", b"FPW1", b"FPW1" + b"\0" * 100, b"GET / HTTP/1.1\r\n\r\n" * 20,
                                   (2**32).to_bytes(8, "big") + b"x" * 200])
def test_truncated_and_foreign_frames(peers: Peers, frame: bytes) -> None:
    assert reason(peers.gate, frame) == "frame"


def test_oversize(peers: Peers) -> None:
    gate = peers.new_gate(bytes_max=200)
    assert reason(gate, peers.frame()) == "oversize"


def test_deep_nesting_from_an_authenticated_peer(peers: Peers) -> None:
    deep = b"\x91" * 10_000 + b"\xc0"
    assert reason(peers.gate, seal_raw(peers, deep)) == "decode"
    nested = [[]]
    for _ in range(100):
        nested = [nested]
    envelope = {"v": 1, "kind": "ping", "src": peers.alice.public_key, "dst": peers.bob.public_key,
                "job": "", "term": 0, "seq": 1, "ts_ms": NOW_MS, "body": {"x": nested}}
    assert reason(peers.gate, seal_raw(peers, msgpack.packb(envelope))) == "decode"


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
    envelope = {"v": 1, "kind": "ping", "src": peers.alice.public_key, "dst": peers.bob.public_key,
                "job": "", "term": 0, "seq": 1, "ts_ms": NOW_MS, "body": mutate(body)}
    assert reason(peers.gate, seal_raw(peers, msgpack.packb(envelope))) == why


def test_unknown_kind_and_ext_types(peers: Peers) -> None:
    envelope = {"v": 1, "kind": "exec", "src": peers.alice.public_key, "dst": peers.bob.public_key,
                "job": "", "term": 0, "seq": 1, "ts_ms": NOW_MS, "body": {}}
    assert reason(peers.gate, seal_raw(peers, msgpack.packb(envelope))) == "unknown_kind"
    envelope["kind"], envelope["body"] = "ping", msgpack.ExtType(1, b"boom")
    assert reason(peers.gate, seal_raw(peers, msgpack.packb(envelope))) == "decode"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_crash_the_gate(data: bytes) -> None:
    gate = _FUZZ.gate
    with pytest.raises(RemoteProtocolError):
        gate.open(data, NOW_MS)
    with pytest.raises(RemoteProtocolError):
        gate.open(wire.MAGIC + _FUZZ.alice.public_key + data, NOW_MS)


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
    envelope = {"v": 1, "kind": kind, "src": _FUZZ.alice.public_key, "dst": _FUZZ.bob.public_key,
                "job": "", "term": 0, "seq": _FUZZ.next_seq(), "ts_ms": NOW_MS, "body": body}
    try:
        env = _FUZZ.gate.open(seal_raw(_FUZZ, msgpack.packb(envelope)), NOW_MS)
    except RemoteProtocolError:
        return
    assert isinstance(env.msg, (mb.Ping, mb.Ack, mb.PingReq, mb.IndirectAck))


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=400))
def test_garbage_plaintext_from_an_authenticated_peer(plaintext: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        _FUZZ.gate.open(seal_raw(_FUZZ, plaintext), NOW_MS)


class _Fuzz(Peers):
    def __init__(self) -> None:
        import tempfile
        super().__init__(Path(tempfile.mkdtemp(prefix="fedpeer-fuzz-")))
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq


_FUZZ = _Fuzz()


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


# -- the frame header: the sender is known from the first 64 bytes ----------------------------

def test_header_authenticates_the_sender_before_the_body(peers: Peers) -> None:
    frame = peers.frame()
    header = peers.gate.open_header(frame[:wire.HEADER_BYTES])
    assert (header.sender, header.length) == (peers.alice.public_key, len(frame))
    stranger = wire.Sealer(peers.mallory).seal(peers.bob.public_key, peers.ping(), NOW_US)
    with pytest.raises(RemoteProtocolError, match="unknown_sender"):
        peers.gate.open_header(stranger[:wire.HEADER_BYTES])
    # a stranger claiming Alice's key cannot make the tag; nor can anyone lengthen a real header
    forged = frame[:4] + peers.alice.public_key + frame[36:wire.HEADER_BYTES]
    longer = bytearray(frame[:wire.HEADER_BYTES])
    longer[44:48] = (len(frame) + 1000).to_bytes(4, "little")
    for bad in (forged[:-1] + bytes([forged[-1] ^ 1]), bytes(longer)):
        with pytest.raises(RemoteProtocolError) as err:
            peers.gate.open_header(bad)
        assert err.value.reason == "header"
        assert getattr(err.value, "sender", None) is None      # not verified: nobody to blame


def test_a_replayed_header_is_refused_before_its_body(peers: Peers) -> None:
    frame = peers.frame()
    peers.gate.open(frame, NOW_MS)
    with pytest.raises(RemoteProtocolError) as err:
        peers.gate.open_header(frame[:wire.HEADER_BYTES])
    assert err.value.reason == "replay" and err.value.sender == peers.alice.public_key


def test_header_declaring_more_than_the_cap_is_oversize(peers: Peers) -> None:
    gate = peers.new_gate(bytes_max=1024)
    big = peers.frame(msg=wire.DiagProbe(b"x" * 2000))
    with pytest.raises(RemoteProtocolError, match="oversize"):
        gate.open_header(big[:wire.HEADER_BYTES])


def test_errors_after_the_header_name_the_verified_sender_and_job(peers: Peers) -> None:
    env = msgpack.packb({"v": 1, "kind": "ping", "src": peers.alice.public_key, "dst": peers.bob.public_key,
                         "job": "stats-1", "term": 0, "seq": NOW_US + 5, "ts_ms": NOW_MS, "body": {"x": 1}})
    with pytest.raises(RemoteProtocolError) as err:
        peers.gate.open(frames.seal_raw(peers.alice, peers.bob.public_key, env), NOW_MS)
    assert (err.value.reason, err.value.sender, err.value.job) == ("schema", peers.alice.public_key, "stats-1")


def test_refusals_are_authenticated(peers: Peers) -> None:
    frame = peers.frame()
    tag = peers.gate.refusal_tag(peers.alice.public_key, wire.parse_header(frame).seq, "schema")
    keys = peers.alice_sealer.keys
    assert wire.refusal_verified(keys, peers.bob.public_key, frame, "schema", tag)
    assert not wire.refusal_verified(keys, peers.bob.public_key, frame, "replay", tag)   # other reason
    assert not wire.refusal_verified(keys, peers.mallory.public_key, frame, "schema", tag)
    assert not wire.refusal_verified(keys, peers.bob.public_key, frame, "schema", "zz")


def test_decoded_item_budget_stops_amplification_early(peers: Peers) -> None:
    """24 arrays of 2^20 empty arrays: within every length and depth limit, 24 MiB on the wire,
    1.8 GiB and 22 s to decode whole. The budget stops msgpack after DECODED_ITEMS_MAX items."""
    import time

    inner = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * (1 << 20)
    plaintext = b"\xdc" + (24).to_bytes(2, "big") + inner * 24
    gate = peers.new_gate(bytes_max=64 << 20)
    frame = frames.seal_raw(peers.alice, peers.bob.public_key, plaintext, seq=NOW_US)
    started = time.perf_counter()
    with pytest.raises(RemoteProtocolError) as err:
        gate.open(frame, NOW_MS)
    assert err.value.reason == "decode" and "decoded items" in err.value.detail
    assert time.perf_counter() - started < 5    # generous: the point is seconds, not 22 s


def test_legit_large_lists_fit_the_budget(peers: Peers) -> None:
    features = [f"f{i}" for i in range(100_000)]     # the largest list a job message may carry
    assert len(wire._decode(msgpack.packb({"features": features}), 1 << 30)["features"]) == 100_000


def test_replay_marks_stay_bounded_and_cheap_for_long_streams(tmp_path: Path) -> None:
    """Each accepted seq is pruned once it falls out of the window (a heap, not a rescan of every
    remembered seq per message), and every seq still inside the window is refused again."""
    guard = wire.ReplayGuard(window_us=1_000, recent_max=4096, counter_for=lambda k: Counter(tmp_path / "c"))
    sender = b"s" * 32
    for seq in range(1, 100_001, 3):
        guard.check_and_record(sender, seq)
    assert len(guard._recent[sender]) <= 1_000 // 3 + 1 and len(guard._oldest[sender]) == len(guard._recent[sender])
    for seq in (99_997, 99_001):
        with pytest.raises(RemoteProtocolError, match="replay"):
            guard.check_and_record(sender, seq)
    guard.check_and_record(sender, 99_999)   # inside the window, never seen: out of order, accepted
