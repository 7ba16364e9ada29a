"""The ring secure sum (fedpeer/protocols/securesum/api.py) over the in-memory network.

Everything runs in virtual time (looptime), seeded: a failing seed is printed and replays
exactly with `MemoryNetwork(keys, seed=...)`. Hypothesis tests build their own looptime loop
per example (`run_virtual`), the others are marked `looptime`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import random
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import looptime
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedpeer.errors import JobError, LocalProtocolError, RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.protocols.securesum import api as ss
from fedpeer.protocols.securesum.api import (
    RingBroken,
    SeedRequest,
    SeedReveal,
    SumChunk,
    SumHere,
    SumOutcome,
    SumChange,
    SumListAsk,
    SumRestart,
    SumResult,
    SumWhere,
    secure_sum,
)
from fedpeer.runtime.channel import PeerUnreachable
from fedpeer.testing.memory import MemoryChannel, MemoryNetwork
from fedpeer.testing.members import close_loop
from fedpeer.testing.sumsim import SteadyChannel
from fedpeer.wire import frame as wire
from fedpeer.wire.session import Sessions
from fedpeer.testing import frames

TAG = "t"
HOP_MS = 1_000                 # short hops: virtual time, but keeps the bounds readable
U64 = 2**64
P_MIN = 0.001                  # uniformity tests fail below this p-value


def keys(n: int) -> list[bytes]:
    """Distinct 32-byte member keys, sorted (ring order)."""
    return sorted(hashlib.sha256(bytes([i])).digest() for i in range(n))


def run_virtual(coro: Any) -> Any:
    """Run a coroutine on a fresh looptime loop (virtual time) — for Hypothesis examples."""
    loop = looptime.new_event_loop(start=0)
    try:
        return loop.run_until_complete(coro)
    finally:
        close_loop(loop)


def exact_sum(vectors: dict[bytes, np.ndarray], nodes: Sequence[bytes]) -> list[int]:
    """The expected total with Python integers, independent of numpy's wrapping."""
    length = len(next(iter(vectors.values())))
    return [sum(int(vectors[n][i]) for n in nodes) % U64 for i in range(length)]


def channel(net: MemoryNetwork, node: bytes, job_id: str = "job") -> SteadyChannel:
    return SteadyChannel(net.channel(node, job_id))


class CrashingChannel:
    """A member's channel that crashes the member (MemoryNetwork.crash) just before the first
    send for which `when(msg)` holds; the send then fails as a crashed member's does."""

    def __init__(self, inner: Any, when: Callable[[object], bool]) -> None:
        self.inner, self.when = inner, when
        self.crashed_at: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: object) -> None:
        if self.crashed_at is None and self.when(msg):
            self.inner.net.crash(self.inner.me)
            self.crashed_at = asyncio.get_running_loop().time()
        await self.inner.send(dst, msg)


def chunk_sends(count: int, attempt: int = 1) -> Callable[[object], bool]:
    """True on the (count+1)-th SumChunk send of the given attempt: crash after `count` sends."""
    seen = [0]

    def when(msg: object) -> bool:
        if isinstance(msg, SumChunk) and f"/a{attempt}/" in msg.tag:
            seen[0] += 1
            return seen[0] > count
        return False
    return when


async def run_sum(net: MemoryNetwork, vectors: dict[bytes, np.ndarray], *, skip: Sequence[bytes] = (),
                  wrap: dict[bytes, Callable[[Any], Any]] | None = None,
                  bound_s: float = 600.0, job_id: str = "job",
                  **kwargs: Any) -> tuple[dict[bytes, Any], dict[bytes, float]]:
    """Every member not in `skip` runs secure_sum; returns each one's outcome or exception and
    the virtual time it ended. Fails (never hangs) if the whole run exceeds bound_s."""
    wrap = wrap or {}
    ended: dict[bytes, float] = {}
    kwargs.setdefault("hop_timeout_ms", HOP_MS)

    async def one(node: bytes) -> Any:
        ch = channel(net, node, job_id)
        ch = wrap[node](ch) if node in wrap else ch
        try:
            return await secure_sum(ch, TAG, vectors[node], **kwargs)
        finally:
            ended[node] = asyncio.get_running_loop().time()

    nodes = [n for n in net.members if n not in skip]
    async with asyncio.timeout(bound_s):
        results = await asyncio.gather(*(one(n) for n in nodes), return_exceptions=True)
    return dict(zip(nodes, results)), ended


def random_vectors(members: Sequence[bytes], length: int, seed: int) -> dict[bytes, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {m: rng.integers(0, U64, length, dtype=np.uint64, endpoint=False) for m in members}


def check_consistent(results: dict[bytes, Any], vectors: dict[bytes, np.ndarray], seed: int) -> SumOutcome | None:
    """All outcomes are equal and exact over their participants; everyone else raised JobError.
    Returns the common outcome (None if nobody got one)."""
    outcomes = [r for r in results.values() if isinstance(r, SumOutcome)]
    for node, r in results.items():
        assert isinstance(r, (SumOutcome, JobError, asyncio.CancelledError)), f"seed {seed}: {node.hex()[:8]}: {r!r}"
    if not outcomes:
        return None
    first = outcomes[0]
    assert all(o == first for o in outcomes), f"seed {seed}: members disagree"
    assert first.total.tolist() == exact_sum(vectors, first.participants), f"seed {seed}: wrong total"
    for node in first.participants:     # CancelledError: a participant that crashed after the ring
        assert isinstance(results.get(node), (SumOutcome, asyncio.CancelledError, type(None))), \
            f"seed {seed}: participant {node.hex()[:8]} failed: {results[node]!r}"
    return first


# -- wire --------------------------------------------------------------------------------------

def _alice_to_bob() -> tuple[Identity, wire.Gate, frames.Forger]:
    alice, bob = Identity.generate(), Identity.generate()
    gate = wire.Gate(bob, {alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 24)
    forger = frames.Forger(alice)
    forger.pair(gate, bob.public_key, 0)
    return bob, gate, forger


def test_messages_round_trip_through_the_gate() -> None:
    bob, gate, sealer = _alice_to_bob()
    alice = sealer.identity
    data = np.array([0, 1, 2**64 - 1, 12345678901234567890], dtype=np.uint64)
    messages = [SumChunk("t/ss-ring/a1/c0", data), SumResult("t/ss-ring/a1/r0", data),
                SumChunk("t/ss-ring/a1/c1", np.full(ss.CHUNK_ENTRIES_MAX, 7, dtype=np.uint64)),
                RingBroken("t/ss-ring/a1/broken", bob.public_key, "refused"),
                SumRestart("t/ss-ring/restart", 2, (alice.public_key, bob.public_key), "x unreachable"),
                SeedRequest("t/ss-pairwise/a1/seed"), SeedReveal("t/ss-pairwise/a1/seed", bytes(range(32))),
                SumWhere("t/ss-ring/a1/where", 3), SumHere("t/ss-ring/a1/where", 3, True, False),
                SumChange("t/ss-ring/restart", 3, bytes(32), (1, 127), (), ""),
                SumChange("t/ss-ring/restart", 2, bytes(range(32)), (), (0, 2, 1), "dropped x"),
                SumListAsk("t/ss-ring/list")]
    for msg in messages:
        env = gate.open(sealer.seal(bob.public_key, msg), 0)
        got = env.msg
        assert type(got) is type(msg) and env.kind == wire.kind_of(msg)
        if isinstance(msg, (SumChunk, SumResult)):
            assert got.tag == msg.tag and got.data.dtype == np.uint64 and np.array_equal(got.data, msg.data)
        else:
            assert got == msg


@pytest.mark.parametrize("change", [dict(dropped=(ss.PARTICIPANTS_MAX,)), dict(base=bytes(31)),
                                    dict(order=tuple(range(ss.PARTICIPANTS_MAX + 1))),
                                    dict(attempt=ss.ATTEMPTS_MAX + 2)])
def test_gate_rejects_bad_announcements(change: dict) -> None:
    """A compact announcement's places must be in the job's members (at most PARTICIPANTS_MAX), its
    base a SHA-256, its attempt on the wire's bound."""
    bob, gate, sealer = _alice_to_bob()
    msg = dataclasses.replace(SumChange("t/ss-ring/restart", 2, bytes(32), (1,), (), ""), **change)
    with pytest.raises(RemoteProtocolError) as err:
        gate.open(sealer.seal(bob.public_key, msg), 0)
    assert err.value.reason == "schema"


@pytest.mark.parametrize("data", [np.zeros(3, dtype=np.float64), np.zeros((2, 2), dtype=np.uint64),
                                  np.zeros(ss.CHUNK_ENTRIES_MAX + 1, dtype=np.uint64)])
def test_gate_rejects_bad_chunks(data: np.ndarray) -> None:
    bob, gate, sealer = _alice_to_bob()
    frame = sealer.seal(bob.public_key, SumChunk("t", data))
    with pytest.raises(RemoteProtocolError) as err:
        gate.open(frame, 0)
    assert err.value.reason == "schema"


# -- masks -------------------------------------------------------------------------------------

def test_pairwise_masks_cancel_and_are_fresh_per_attempt_and_chunk() -> None:
    members = keys(5)
    net = MemoryNetwork(members, seed=3)
    zero = np.zeros(12, dtype=np.uint64)

    def contributions(attempt: int, k: int) -> list[np.ndarray]:
        plan = ss._Plan("job", TAG, "pairwise", zero, 6, HOP_MS, 3)
        att = ss._Attempt(attempt, tuple(members))
        out = []
        for m in members:
            masks = ss._Masks(net.channel(m), plan, att)
            masks.self_seed = None      # self masks are removed separately, via the revealed seeds
            masks.ring_seed = None      # and the initiator's ring mask when the chunk comes back
            out.append(masks.contribution(k))
        return out

    first = contributions(1, 0)
    assert not np.any(np.sum(first, axis=0, dtype=np.uint64)), "pairwise masks must cancel"
    assert all(np.all(c != 0) for c in first), "each site's contribution must be masked"
    for other in (contributions(2, 0), contributions(1, 1)):
        assert not np.any(np.sum(other, axis=0, dtype=np.uint64))
        assert all(np.all(a != b) for a, b in zip(first, other)), "masks reused across attempts or chunks"


# -- exact sums --------------------------------------------------------------------------------

EXTREME = st.one_of(st.integers(U64 - 8, U64 - 1), st.integers(0, U64 - 1), st.sampled_from([0, 1, 2**63]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(2, 9), length=st.integers(0, 24), chunk=st.integers(1, 7),
       mode=st.sampled_from(ss.RING_MODES), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_exact_sum_every_member_same_outcome(n: int, length: int, chunk: int, mode: str, seed: int,
                                             data: st.DataObject) -> None:
    members = keys(n)
    matrix = data.draw(arrays(np.uint64, (n, length), elements=EXTREME))
    vectors = dict(zip(members, matrix))
    net = MemoryNetwork(members, seed=seed)
    results, _ = run_virtual(run_sum(net, vectors, mode=mode, chunk_entries=chunk))
    for node, r in results.items():
        assert isinstance(r, SumOutcome), f"seed {seed}: {node.hex()[:8]} raised {r!r}"
        assert r == results[members[0]], f"seed {seed}: outcomes differ"
        assert r.participants == tuple(members) and r.attempts == 1
        assert r.total.tolist() == exact_sum(vectors, members), f"seed {seed}"


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_large_vector_default_chunks_and_progress(mode: str) -> None:
    members = keys(3)
    net = MemoryNetwork(members, seed=11)
    vectors = random_vectors(members, 3 * ss.DEFAULT_CHUNK_ENTRIES + 5, seed=11)
    results, _ = await run_sum(net, vectors, mode=mode)
    expected = sum(v.astype(object) for v in vectors.values()) % U64
    for r in results.values():
        assert isinstance(r, SumOutcome) and r.total.astype(object).tolist() == expected.tolist()
    chunks = [m for _, _, m in net.sent if isinstance(m, SumChunk)]
    assert len(chunks) == 4 * 3 and max(len(c.data) for c in chunks) == ss.DEFAULT_CHUNK_ENTRIES
    assert (members[0], "secure sum", 4, 4) in net.progress_log


@pytest.mark.looptime
async def test_chunks_are_pipelined_within_a_bounded_window() -> None:
    members = keys(4)
    net = MemoryNetwork(members, seed=8)
    vectors = random_vectors(members, 40, seed=8)
    results, _ = await run_sum(net, vectors, chunk_entries=1)
    assert all(isinstance(r, SumOutcome) for r in results.values())
    in_flight, most = 0, 0
    for src, dst, msg in net.sent:
        if isinstance(msg, SumChunk) and src == members[0]:
            in_flight += 1
        elif isinstance(msg, SumChunk) and dst == members[0]:
            in_flight -= 1
        most = max(most, in_flight)
    assert most == ss.CHUNKS_IN_FLIGHT_MAX, f"{most} chunks on the ring at once"


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_members_pass_chunks_on_without_waiting_for_each_acknowledgement(mode: str) -> None:
    """Pipelined (issue 13): every member has several chunks in flight to its successor at once,
    never more than SENDS_IN_FLIGHT_MAX, and the initiator several results to each member."""
    members = keys(4)
    net = MemoryNetwork(members, seed=5, delay_ms=(5.0, 10.0))
    in_flight: dict[tuple[bytes, type], int] = {}
    most: dict[tuple[bytes, type], int] = {}

    class Counting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def send(self, dst: bytes, msg: object) -> None:
            key = (self.inner.me, type(msg))
            in_flight[key] = in_flight.get(key, 0) + 1
            most[key] = max(most.get(key, 0), in_flight[key])
            try:
                await self.inner.send(dst, msg)
            finally:
                in_flight[key] -= 1

    vectors = random_vectors(members, 40, seed=5)
    results, _ = await run_sum(net, vectors, mode=mode, chunk_entries=1, wrap={m: Counting for m in members})
    outcome = check_consistent(results, vectors, 5)
    assert outcome is not None and outcome.participants == tuple(members)
    for m in members:
        assert 1 < most[(m, SumChunk)] <= ss.SENDS_IN_FLIGHT_MAX, (m.hex()[:8], most)
    assert 1 < most[(members[0], SumResult)] <= ss.SENDS_IN_FLIGHT_MAX * (len(members) - 1)


# -- privacy -----------------------------------------------------------------------------------

def inputs(kind: str, members: Sequence[bytes], length: int) -> dict[bytes, np.ndarray]:
    """Two very different input sets: all zeros, or all near the top of the range."""
    if kind == "zeros":
        return {m: np.zeros(length, dtype=np.uint64) for m in members}
    return {m: np.full(length, U64 - 1 - i, dtype=np.uint64) for i, m in enumerate(members)}


async def received_values(mode: str, kind: str, runs: int, n: int = 4, length: int = 8) -> np.ndarray:
    """Everything member 1 (not the initiator) received in SumChunks, over `runs` seeds."""
    members = keys(n)
    seen = []
    for seed in range(runs):
        net = MemoryNetwork(members, seed=seed)
        await run_sum(net, inputs(kind, members, length), mode=mode)
        seen += [m.data for _, dst, m in net.sent if dst == members[1] and isinstance(m, SumChunk)]
    return np.concatenate(seen)


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_what_a_member_receives_is_uniform_whatever_the_inputs(mode: str) -> None:
    runs = 150
    zeros = await received_values(mode, "zeros", runs)
    high = await received_values(mode, "high", runs)
    for name, values in (("zeros", zeros), ("high", high)):
        p = stats.kstest(values / U64, "uniform").pvalue
        assert p > P_MIN, f"{mode}/{name}: received values not uniform (p={p:.2g}, seeds 0..{runs - 1})"
    p = stats.ks_2samp(zeros / U64, high / U64).pvalue
    assert p > P_MIN, f"{mode}: received values depend on the inputs (p={p:.2g})"
    # The same test does detect structure: unmasked, the inputs and running sums would fail it.
    raw = np.concatenate(list(inputs("high", keys(4), 8).values()))
    assert stats.kstest(raw / U64, "uniform").pvalue < P_MIN


async def neighbour_view(mode: str, seed: int, vectors: dict[bytes, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """What sites 0 (initiator) and 2, colluding, can compute about site 1 with 4 members: what
    1 sent minus what it received, minus its self mask (seed revealed to 0) and minus its
    pairwise masks with 0 and 2. Returns (that residual, 1's remaining mask with honest site 3).
    Each seed runs as its own job: pairwise seeds differ per job, as in the daemon."""
    members = keys(4)
    net = MemoryNetwork(members, seed=seed)
    job_id = f"job-{seed}"
    await run_sum(net, vectors, mode=mode, job_id=job_id)
    me = members[1]
    got = [m.data for s, d, m in net.sent if d == me and isinstance(m, SumChunk)]
    sent = [m.data for s, d, m in net.sent if s == me and isinstance(m, SumChunk)]
    residual = sent[0] - got[0]
    if mode == "ring":
        return residual, np.zeros_like(residual)
    seed_msg = next(m for s, d, m in net.sent if s == me and isinstance(m, SeedReveal))
    residual = residual - ss.expand_mask(ss._SELF_DOMAIN, seed_msg.seed, 0, len(residual))
    label = ss.pairwise_label(SimpleNamespace(job_id=job_id, tag=TAG, mode=mode, initiator=None), 1)
    ch = net.channel(me, job_id)
    remaining = np.zeros_like(residual)
    for peer in (members[0], members[2], members[3]):
        mask = ss.expand_mask(ss._PAIR_DOMAIN, ch.pairwise_seed(peer, label), 0, len(residual))
        signed = mask if me < peer else np.zeros_like(mask) - mask
        if peer == members[3]:
            remaining = signed
        else:
            residual = residual - signed
    return residual, remaining


@pytest.mark.looptime
async def test_neighbours_and_initiator_colluding_learn_nothing_in_pairwise_mode() -> None:
    members = keys(4)
    residuals = {}
    for kind in ("zeros", "high"):
        values = []
        for seed in range(150):
            vectors = inputs(kind, members, 8)
            residual, remaining = await neighbour_view("pairwise", seed, vectors)
            # Sanity of the reconstruction: removing the honest site's mask too gives the vector.
            assert np.array_equal(residual - remaining, vectors[members[1]]), f"seed {seed}"
            values.append(residual)
        residuals[kind] = np.concatenate(values) / U64
        p = stats.kstest(residuals[kind], "uniform").pvalue
        assert p > P_MIN, f"pairwise/{kind}: colluders' view not uniform (p={p:.2g})"
    assert stats.ks_2samp(residuals["zeros"], residuals["high"]).pvalue > P_MIN


@pytest.mark.looptime
async def test_ring_mode_neighbours_learn_the_vector_as_documented() -> None:
    members = keys(4)
    vectors = random_vectors(members, 8, seed=5)
    residual, _ = await neighbour_view("ring", 5, vectors)
    assert np.array_equal(residual, vectors[members[1]])


# -- dropouts ----------------------------------------------------------------------------------

@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_member_crashed_before_the_ring(mode: str) -> None:
    n = 5
    members = keys(n)
    for seed in range(12):
        dead = members[1 + seed % (n - 1)]
        net = MemoryNetwork(members, seed=seed)
        net.crash(dead)
        vectors = random_vectors(members, 10, seed)
        results, _ = await run_sum(net, vectors, skip=[dead], mode=mode, chunk_entries=3)
        outcome = check_consistent(results, vectors, seed)
        assert outcome is not None and dead not in outcome.participants, f"seed {seed}"
        assert len(outcome.participants) == n - 1 and outcome.attempts == 2, f"seed {seed}"
        assert all(isinstance(r, SumOutcome) for r in results.values()), f"seed {seed}"


def first_hop(net: MemoryNetwork, mode: str, attempt: int) -> np.ndarray:
    tag = f"{TAG}/ss-{mode}/a{attempt}/c0"
    return next(m.data for s, _, m in net.sent if s == net.members[0] and isinstance(m, SumChunk) and m.tag == tag)


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_member_crashed_mid_ring_is_excluded_and_masks_are_fresh(mode: str) -> None:
    n = 6
    members = keys(n)
    for seed in range(12):
        victim = members[1 + seed % (n - 1)]
        net = MemoryNetwork(members, seed=seed)
        vectors = random_vectors(members, 14, seed)
        wrap = {victim: lambda ch: CrashingChannel(ch, chunk_sends(2))}
        results, _ = await run_sum(net, vectors, wrap=wrap, mode=mode, chunk_entries=3, compact=bool(seed % 2))
        outcome = check_consistent(results, vectors, seed)
        assert outcome is not None and victim not in outcome.participants, f"seed {seed}"
        assert outcome.participants == tuple(m for m in members if m != victim), f"seed {seed}"
        assert outcome.attempts == 2, f"seed {seed}"
        # Same vector, fresh mask: every entry of the initiator's first hop differs.
        assert np.all(first_hop(net, mode, 1) != first_hop(net, mode, 2)), f"seed {seed}: mask reused"


@pytest.mark.looptime
async def test_member_crashed_before_revealing_its_seed_is_excluded() -> None:
    members = keys(5)
    for seed in range(6):
        victim = members[1 + seed % 4]
        net = MemoryNetwork(members, seed=seed)
        vectors = random_vectors(members, 7, seed)
        wrap = {victim: lambda ch: CrashingChannel(ch, lambda m: isinstance(m, SeedReveal))}
        results, _ = await run_sum(net, vectors, wrap=wrap, mode="pairwise", chunk_entries=4)
        outcome = check_consistent(results, vectors, seed)
        assert outcome is not None and outcome.attempts == 2, f"seed {seed}"
        assert outcome.participants == tuple(m for m in members if m != victim), f"seed {seed}"
        seeds = [m.seed for _, _, m in net.sent if isinstance(m, SeedReveal)]
        # n-2 reveal in attempt 1 (all followers but the victim), n-2 again in attempt 2.
        assert len(seeds) == 2 * (len(members) - 2) and len(set(seeds)) == len(seeds), f"seed {seed}: seed reused"


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_a_crashed_initiator_is_replaced_by_the_next_in_ring_order(mode: str) -> None:
    """The initiator dies at any point of the ring: once the failure detector declares it dead,
    the next member in ring order runs the sum anew over the survivors, under its own tags and
    with fresh masks, and every survivor gets the same exact total soon after the declaration
    (not a member's patience later, and not a failure)."""
    n = 5
    members = keys(n)
    for seed in range(8):
        net = MemoryNetwork(members, seed=seed)
        crashing: dict[str, CrashingChannel] = {}

        def wrap(ch: MemoryChannel) -> CrashingChannel:
            crashing["c"] = CrashingChannel(ch, chunk_sends(seed % 4))
            return crashing["c"]

        vectors = random_vectors(members, 12, seed)
        results, ended = await run_sum(net, vectors, wrap={members[0]: wrap}, mode=mode, chunk_entries=3,
                                       compact=bool(seed % 2))
        crashed_at = crashing["c"].crashed_at
        assert crashed_at is not None
        outcome = check_consistent({m: results[m] for m in members[1:]}, vectors, seed)
        assert outcome is not None and outcome.participants == tuple(members[1:]), f"seed {seed}"
        assert all(isinstance(results[m], SumOutcome) for m in members[1:]), f"seed {seed}: {results}"
        for node in members[1:]:
            late = ended[node] - crashed_at
            assert late <= net.detect_ms / 1000 + 1.0, f"seed {seed}: ended {late:.1f} s after the crash"
        era = f"{TAG}/ss-{mode}/by-{members[1].hex()[:16]}/"
        chunks = [m for s, _, m in net.sent if isinstance(m, SumChunk) and s == members[1] and m.tag.startswith(era)]
        assert chunks, f"seed {seed}: the next in ring order did not lead the re-run under its own tags"


@pytest.mark.looptime
async def test_when_the_next_initiator_is_dead_too_the_one_after_it_takes_over() -> None:
    n = 6
    members = keys(n)
    for seed in range(4):
        net = MemoryNetwork(members, seed=seed)
        net.crash(members[1])
        vectors = random_vectors(members, 5, seed)
        wrap = {members[0]: lambda ch: CrashingChannel(ch, chunk_sends(0))}   # dies at its first chunk
        results, _ = await run_sum(net, vectors, skip=[members[1]], wrap=wrap, mode="pairwise", chunk_entries=2)
        outcome = check_consistent({m: results[m] for m in members[2:]}, vectors, seed)
        assert outcome is not None and outcome.participants == tuple(members[2:]), f"seed {seed}"


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_initiator_crash_without_a_failure_detector_fails_every_member_within_bounded_time(mode: str) -> None:
    """Nobody declares the initiator dead (detection off): nobody takes over, and every member
    still ends, with JobError, within its patience."""
    n = 5
    members = keys(n)
    patience_s = (2 * (n + 1) + 5) * HOP_MS / 1000
    for seed in range(4):
        net = MemoryNetwork(members, seed=seed, detect_ms=1e9)
        crashing: dict[str, CrashingChannel] = {}

        def wrap(ch: MemoryChannel) -> CrashingChannel:
            crashing["c"] = CrashingChannel(ch, chunk_sends(seed % 4))
            return crashing["c"]

        vectors = random_vectors(members, 12, seed)
        results, ended = await run_sum(net, vectors, wrap={members[0]: wrap}, mode=mode, chunk_entries=3,
                                       bound_s=200.0)
        crashed_at = crashing["c"].crashed_at
        assert crashed_at is not None
        for node in members[1:]:
            assert isinstance(results[node], JobError), f"seed {seed}: {results[node]!r}"
            late = ended[node] - crashed_at
            assert late <= patience_s + (n + 1) * HOP_MS / 1000, f"seed {seed}: failed {late:.1f} s after the crash"


PARTITIONS = [({0, 1, 2}, {3, 4}), ({0, 3}, {1, 2, 4}), ({0}, {1, 2, 3, 4}), ({0, 4}, {1, 2, 3}),
              ({0, 1, 2, 4}, {0, 3})]       # the last one overlaps: 0 reaches 3, nobody else does


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
@pytest.mark.parametrize("groups", PARTITIONS, ids=str)
async def test_partition_gives_survivors_sum_or_clean_failure(mode: str, groups: tuple[set[int], ...]) -> None:
    n = 5
    members = keys(n)
    for seed in range(6):
        net = MemoryNetwork(members, seed=seed)
        net.partition(*({members[i] for i in g} for g in groups))
        vectors = random_vectors(members, 9, seed)
        results, _ = await run_sum(net, vectors, mode=mode, chunk_entries=4, bound_s=120)
        outcome = check_consistent(results, vectors, seed)
        home = next(g for g in groups if 0 in g and len(g) > 1) if any(0 in g and len(g) > 1 for g in groups) else {0}
        if outcome is None:
            assert all(isinstance(r, JobError) for r in results.values()), f"seed {seed}"
            continue
        assert set(outcome.participants) <= {members[i] for i in home}, f"seed {seed}"
        for node, r in results.items():
            if node not in outcome.participants:
                assert isinstance(r, JobError), f"seed {seed}: excluded member got {r!r}"


@pytest.mark.looptime
async def test_excluded_but_reachable_member_is_told() -> None:
    members = keys(4)
    net = MemoryNetwork(members, seed=1)
    net.partition({members[0], members[1], members[3]}, {members[0], members[2]})  # 1 cannot reach 2
    vectors = random_vectors(members, 5, 1)
    results, ended = await run_sum(net, vectors, mode="pairwise")
    outcome = check_consistent(results, vectors, 1)
    assert outcome is not None and outcome.participants == (members[0], members[1], members[3])
    assert isinstance(results[members[2]], JobError) and "left out" in str(results[members[2]])
    assert ended[members[2]] < 5 * HOP_MS / 1000, "the excluded member should hear it, not time out"


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_participant_the_initiator_cannot_reach(mode: str) -> None:
    """The ring needs only neighbours to reach each other; the result goes straight from the
    initiator. In ring mode a participant it cannot reach misses only the result: it fails
    (bounded), the others succeed with its vector in their sum. In pairwise mode the seed round
    finds it unreachable and the sum is re-run without it (module header)."""
    members = keys(4)
    net = MemoryNetwork(members, seed=9)
    net.partition({members[0], members[1], members[3]}, {members[1], members[2], members[3]})
    vectors = random_vectors(members, 6, 9)
    results, ended = await run_sum(net, vectors, mode=mode)
    outcomes = [results[m] for m in (members[0], members[1], members[3])]
    assert all(isinstance(o, SumOutcome) and o == outcomes[0] for o in outcomes)
    expected = tuple(members) if mode == "ring" else (members[0], members[1], members[3])
    assert outcomes[0].participants == expected
    assert outcomes[0].total.tolist() == exact_sum(vectors, expected)
    assert isinstance(results[members[2]], JobError)
    patience_s = (2 * (len(members) + 1) + 5) * HOP_MS / 1000
    assert ended[members[2]] <= 2 * patience_s


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_attempts_that_lose_members_do_not_use_up_attempts_max(mode: str) -> None:
    """Two members crash in turn (attempts 1 and 2): each re-run drops one, so with attempts_max 2
    the third attempt still runs; attempts_max 1 keeps the sum to its one attempt."""
    members = keys(5)
    vectors = random_vectors(members, 10, 2)

    def wrap() -> dict[bytes, Callable[[Any], Any]]:
        return {members[2]: lambda ch: CrashingChannel(ch, chunk_sends(1, attempt=1)),
                members[3]: lambda ch: CrashingChannel(ch, chunk_sends(1, attempt=2))}
    results, _ = await run_sum(MemoryNetwork(members, seed=2), vectors, wrap=wrap(), mode=mode, chunk_entries=3,
                               attempts_max=2)
    rest = (members[0], members[1], members[4])
    for node in rest:
        assert isinstance(results[node], SumOutcome) and results[node].attempts == 3, results[node]
        assert results[node].participants == rest and results[node].total.tolist() == exact_sum(vectors, rest)
    results, _ = await run_sum(MemoryNetwork(members, seed=2), vectors, wrap=wrap(), mode=mode, chunk_entries=3,
                               attempts_max=1)
    for node in rest:
        assert isinstance(results[node], JobError), results[node]
        assert "failed after 1 attempt(s)" in str(results[node])


def test_attempts_that_drop_nobody_count_and_all_attempts_are_bounded() -> None:
    from fedpeer.protocols.securesum.lead import _out_of_attempts
    plan = ss._Plan("job", "t", "ring", np.zeros(1, dtype=np.uint64), 1, HOP_MS, 3)
    assert not _out_of_attempts(plan, 3, 3) and _out_of_attempts(plan, 4, 4)     # three that drop nobody
    assert not _out_of_attempts(plan, 12, 2)                                     # ten re-runs that drop someone
    assert _out_of_attempts(plan, ss.ATTEMPTS_MAX + 1, 1)                        # the absolute bound
    one = dataclasses.replace(plan, attempts_max=1)
    assert not _out_of_attempts(one, 1, 1) and _out_of_attempts(one, 2, 1)      # one attempt, never re-run


@pytest.mark.looptime
async def test_fewer_than_two_participants_left_fails() -> None:
    members = keys(3)
    net = MemoryNetwork(members, seed=4)
    net.crash(members[1])
    net.crash(members[2])
    results, _ = await run_sum(net, random_vectors(members, 3, 4), skip=members[1:])
    assert isinstance(results[members[0]], JobError)
    assert "fewer than 2 participants" in str(results[members[0]])


@pytest.mark.looptime
async def test_a_member_running_another_mode_is_the_one_left_out() -> None:
    """It never sees the others' messages (their tags name the mode), so it answers nothing:
    the initiator finds it silent when the chunk does not come back and runs without it."""
    members = keys(4)
    net = MemoryNetwork(members, seed=6)
    vectors = random_vectors(members, 6, 6)

    async def one(node: bytes) -> Any:
        mode = "ring" if node == members[2] else "pairwise"
        return await secure_sum(channel(net, node), TAG, vectors[node], mode=mode, hop_timeout_ms=HOP_MS)

    async with asyncio.timeout(300):
        results = await asyncio.gather(*(one(m) for m in members), return_exceptions=True)
    rest = (members[0], members[1], members[3])
    assert isinstance(results[2], JobError), results[2]
    for r in (results[0], results[1], results[3]):
        assert isinstance(r, SumOutcome) and r.participants == rest, r
        assert r.total.tolist() == exact_sum(vectors, rest)


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_a_member_with_another_vector_length_is_the_one_left_out(mode: str) -> None:
    """Its chunks have the wrong length for both neighbours it gets in turn (and theirs for it):
    two disputes, so it is the culprit; the others sum without it."""
    members = keys(4)
    net = MemoryNetwork(members, seed=6)
    vectors = random_vectors(members, 6, 6)
    vectors[members[2]] = vectors[members[2]][:5]
    results, _ = await run_sum(net, vectors, mode=mode)
    odd = results.pop(members[2])
    assert isinstance(odd, JobError) and "left out" in str(odd) and "disputes with two" in str(odd), odd
    rest = (members[0], members[1], members[3])
    assert all(isinstance(r, SumOutcome) and r.participants == rest for r in results.values()), results
    assert results[members[0]].total.tolist() == exact_sum(vectors, rest)


@pytest.mark.looptime
async def test_bad_arguments_are_refused() -> None:
    members = keys(2)
    net = MemoryNetwork(members)
    ch = channel(net, members[0])
    good = np.zeros(3, dtype=np.uint64)
    for bad in (dict(vector=np.zeros(3)), dict(mode="star"), dict(chunk_entries=0),
                dict(chunk_entries=ss.CHUNK_ENTRIES_MAX + 1), dict(attempts_max=0), dict(tag="")):
        args = {"tag": TAG, "vector": good} | bad
        with pytest.raises(LocalProtocolError):
            await secure_sum(ch, args.pop("tag"), args.pop("vector"), **args)
    alone = channel(MemoryNetwork(members[:1]), members[0])
    with pytest.raises(JobError, match="at least 2"):
        await secure_sum(alone, TAG, good)


# -- a Byzantine member (issue 11: blame on evidence) ------------------------------------------

BYZANTINE_ATTACKS = ("malformed", "short", "claim_unreachable", "frame_pred", "lie", "refuse", "silent", "quit")


def gate_refuses(liar: bytes | None = None, rng: random.Random | None = None,
                 rate: float = 0.0) -> Callable[[bytes, bytes, object], str | None]:
    """MemoryNetwork.refuse as the real gate plays it: a chunk that is not 1-D uint64 is refused
    (schema). With `liar`, that member's gate also refuses good chunks at `rate` (it lies)."""
    def refuse(src: bytes, dst: bytes, msg: object) -> str | None:
        if isinstance(msg, SumChunk) and (msg.data.dtype != np.uint64 or msg.data.ndim != 1):
            return "schema: secure-sum chunk is not 1-D uint64"
        if dst == liar and isinstance(msg, SumChunk) and rng is not None and rng.random() < rate:
            return "schema: (a lie)"
        return None
    return refuse


class ByzantineChannel:
    """A member's channel that misbehaves on the chunks it forwards, each with probability
    `rate`, by one of `attacks` (seeded): sends a malformed chunk (wrong dtype, refused by the
    successor's gate), a chunk of the wrong length, claims its successor unreachable without
    sending, swallows the chunk, stops altogether, or sends its chunk and then a false ring
    report (blaming its predecessor, or any honest member with any fault). The member's own
    protocol code runs otherwise, so it also reports what happens to it as an honest member
    would ("refuse" is played by the gate)."""

    def __init__(self, inner: Any, rng: random.Random, attacks: Sequence[str], rate: float) -> None:
        self.inner, self.rng, self.attacks, self.rate = inner, rng, attacks, rate
        self.pred: bytes | None = None
        self.quit = False       # after "quit" it does nothing more (its code hangs), whatever task sends

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def recv(self, kind: type, tag: str, src: bytes | None = None, timeout_ms: int = 30_000) -> Any:
        got = await self.inner.recv(kind, tag, src, timeout_ms)
        if kind is SumChunk:
            self.pred = got[0]
        return got

    async def send(self, dst: bytes, msg: object) -> None:
        if self.quit:
            raise asyncio.CancelledError()
        attacks = [a for a in self.attacks if a != "refuse"]
        if not isinstance(msg, SumChunk) or not attacks or self.rng.random() >= self.rate:
            return await self.inner.send(dst, msg)
        attack = self.rng.choice(attacks)
        if attack == "malformed":
            return await self.inner.send(dst, SumChunk(msg.tag, msg.data.astype(np.float64)))
        if attack == "short":
            return await self.inner.send(dst, SumChunk(msg.tag, msg.data[:-1]))
        if attack == "silent":          # swallows the chunk, says it passed it on
            return None
        if attack == "quit":            # stops answering altogether (its code is still "alive")
            self.quit = True
            raise asyncio.CancelledError()
        me, initiator = self.inner.me, self.inner.members[0]
        if attack == "claim_unreachable" and dst == initiator:
            # its own code would quit here (nobody to report to): the "quit" case; this one lies
            report = RingBroken(msg.tag.rsplit("/", 1)[0] + "/broken", initiator, "unreachable")
            return await self.inner.send(initiator, report)
        if attack == "claim_unreachable":
            raise PeerUnreachable(dst, "claimed by a Byzantine member")
        await self.inner.send(dst, msg)
        others = [m for m in self.inner.members if m != me]
        if attack == "frame_pred" and self.pred is not None:
            report = RingBroken(msg.tag.rsplit("/", 1)[0] + "/broken", self.pred, "malformed")
        else:
            report = RingBroken(msg.tag.rsplit("/", 1)[0] + "/broken", self.rng.choice(others),
                                self.rng.choice(ss.FAULTS))
        if initiator != me:
            await self.inner.send(initiator, report)


def byzantine_setup(seed: int) -> tuple[list[bytes], bytes, MemoryNetwork, dict[str, Any]]:
    rng = random.Random(seed)
    members = keys(rng.randint(3, 6))
    liar = rng.choice(members[1:])          # the initiator decides who is in: see the docstring
    attacks = rng.sample(BYZANTINE_ATTACKS, rng.randint(1, len(BYZANTINE_ATTACKS)))
    rate = rng.choice([0.2, 0.5, 1.0])
    net = MemoryNetwork(members, seed=seed)
    net.refuse = gate_refuses(liar, rng, rate if "refuse" in attacks else 0.0)
    kwargs = dict(mode=rng.choice(ss.RING_MODES), chunk_entries=rng.randint(1, 3), compact=rng.random() < 0.5)
    return members, liar, net, {"attacks": attacks, "rate": rate, **kwargs}


def check_no_honest_member_blamed(seed: int, members: Sequence[bytes], liar: bytes, net: MemoryNetwork,
                                  results: dict[bytes, Any], vectors: dict[bytes, np.ndarray]) -> str:
    """The properties of issue 11 for one run; returns how it ended, for the tally."""
    honest = [m for m in members if m != liar]
    name = liar.hex()[:16]
    for src, _, msg, listed in announcements(net):
        if src == members[0] and listed:
            assert set(honest) <= set(listed), f"seed {seed}: honest member dropped: {msg.reason}"
    outcomes = [results[m] for m in honest if isinstance(results[m], SumOutcome)]
    for m in honest:
        assert isinstance(results[m], (SumOutcome, JobError)), f"seed {seed}: {results[m]!r}"
    if outcomes:
        assert len(outcomes) == len(honest), f"seed {seed}: some honest members failed: {results}"
        first = outcomes[0]
        assert all(o == first for o in outcomes), f"seed {seed}: honest members disagree"
        assert set(honest) <= set(first.participants), f"seed {seed}: honest member left out"
        assert first.total.tolist() == exact_sum(vectors, first.participants), f"seed {seed}: wrong total"
        return "sum with the liar" if liar in first.participants else "sum without the liar"
    for m in honest:
        assert name in str(results[m]), f"seed {seed}: error does not name the offender: {results[m]}"
    return "error naming the liar"


@pytest.mark.looptime
async def test_a_byzantine_member_never_gets_an_honest_one_excluded() -> None:
    """400 seeds (FEDPEER_SIM_SCALE=2.5: the 1,000 of issue 11; kept short for the suite's 10-minute
    budget): 3-6 members, one of them (not the initiator) lies in every way the ring lets
    it (malformed and short chunks, false unreachable claims, false reports about any member,
    refusing good chunks at its gate). No honest member is ever dropped from an attempt; every
    honest member ends with the same exact total over participants that include all honest
    members, or with an error naming the liar."""
    tally: dict[str, int] = {}
    for seed in range(int(400 * float(os.environ.get("FEDPEER_SIM_SCALE", "1")))):
        members, liar, net, how = byzantine_setup(seed)
        rng = random.Random(seed + 1)
        wrap = {liar: lambda ch: ByzantineChannel(ch, rng, how["attacks"], how["rate"])}
        vectors = random_vectors(members, 1 + seed % 7, seed)
        results, _ = await run_sum(net, vectors, wrap=wrap, mode=how["mode"],
                                   chunk_entries=how["chunk_entries"], compact=how["compact"], bound_s=300)
        end = check_no_honest_member_blamed(seed, members, liar, net, results, vectors)
        tally[end] = tally.get(end, 0) + 1
    # The liar is caught often enough for the test to mean something.
    assert tally.get("sum without the liar", 0) >= 200 and tally.get("error naming the liar", 0) >= 20, tally


def announcements(net: MemoryNetwork) -> list[tuple[bytes, bytes, Any, tuple[bytes, ...]]]:
    """Every announcement delivered (src, dst, message, the list it announces: () when the
    initiator gives up), a compact one (SumChange) applied to the list its receiver held."""
    held: dict[bytes, tuple[bytes, ...]] = {}
    out = []
    for src, dst, msg in net.sent:
        if isinstance(msg, SumRestart):
            listed = tuple(msg.participants)
        elif isinstance(msg, SumChange):
            before = held.get(dst, tuple(net.members))
            assert msg.base == hashlib.sha256(b"".join(before)).digest(), "a change to a list its receiver holds"
            gone = {net.members[i] for i in msg.dropped}
            listed = (tuple(net.members[i] for i in msg.order) if msg.order
                      else (src, *sorted(p for p in before if p not in gone and p != src)))
        else:
            continue
        if dst in listed:
            held[dst] = listed
        out.append((src, dst, msg, listed))
    return out


def restarts(net: MemoryNetwork) -> list[tuple[bytes, ...]]:
    """The participant lists the initiator announced, in order (one per member it told)."""
    seen: list[tuple[bytes, ...]] = []
    for _src, _, _msg, listed in announcements(net):
        if listed and (not seen or seen[-1] != listed):
            seen.append(listed)
    return seen


async def run_with_liar(n: int, liar_at: int, attacks: Sequence[str], mode: str, seed: int = 0,
                        ) -> tuple[list[bytes], MemoryNetwork, dict[bytes, Any], dict[bytes, np.ndarray]]:
    members = keys(n)
    liar = members[liar_at]
    net = MemoryNetwork(members, seed=seed)
    net.refuse = gate_refuses(liar, random.Random(seed), 1.0 if "refuse" in attacks else 0.0)
    wrap = {liar: lambda ch: ByzantineChannel(ch, random.Random(seed), attacks, 1.0)}
    vectors = random_vectors(members, 7, seed)
    results, _ = await run_sum(net, vectors, wrap=wrap, mode=mode, chunk_entries=3)
    return members, net, results, vectors


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
@pytest.mark.parametrize("attack", ["malformed", "short", "claim_unreachable", "refuse", "silent"])
async def test_the_member_at_fault_is_dropped_not_its_neighbour(mode: str, attack: str) -> None:
    """The finding of issue 11: site 2 sends malformed chunks (or short ones, or claims its live
    successor unreachable, or its gate refuses good chunks). Attempt 1 ends in a dispute between
    site 2 and a neighbour, so attempt 2 keeps everyone but separates the two; there site 2 has a
    second dispute with another member and attempt 3 runs without it. The neighbours stay in."""
    members, net, results, vectors = await run_with_liar(5, 2, [attack], mode)
    liar, rest = members[2], tuple(m for m in members if m != members[2])
    announced = restarts(net)
    assert [set(a) for a in announced] == [set(members), set(rest)], [len(a) for a in announced]
    assert announced[0][1:] != tuple(members[1:]), "attempt 2 must separate the disputing members"
    for m in rest:
        r = results[m]
        assert isinstance(r, SumOutcome) and r.participants == rest and r.attempts == 3, r
        assert r.total.tolist() == exact_sum(vectors, rest)
    assert isinstance(results[liar], JobError)


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_a_false_report_about_a_non_neighbour_drops_the_reporter_at_once(mode: str) -> None:
    members = keys(5)
    liar, victim = members[1], members[3]          # 3 is neither of 1's neighbours
    net = MemoryNetwork(members, seed=4)

    class Liar(ByzantineChannel):
        async def send(self, dst: bytes, msg: object) -> None:
            await self.inner.send(dst, msg)
            if isinstance(msg, SumChunk) and msg.tag.endswith("/a1/c0"):
                await self.inner.send(members[0], RingBroken(f"{TAG}/ss-{mode}/a1/broken", victim, "unreachable"))

    vectors = random_vectors(members, 4, 4)
    results, _ = await run_sum(net, vectors, wrap={liar: lambda ch: Liar(ch, random.Random(0), (), 0.0)}, mode=mode)
    rest = tuple(m for m in members if m != liar)
    assert all(isinstance(results[m], SumOutcome) and results[m].participants == rest
               and results[m].attempts == 2 for m in rest), results
    assert "false ring report" in str(results[liar])


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_two_disputing_members_of_three_fail_the_sum_naming_both(mode: str) -> None:
    """With one member besides the initiator, nobody can stand between the two: the initiator
    cannot tell which one lies, so it drops neither and fails, naming both."""
    members, net, results, _ = await run_with_liar(3, 1, ["malformed"], mode)
    assert restarts(net) == [], "nobody may be dropped on an unverifiable claim"
    for m in (members[0], members[2]):
        err = results[m]
        assert isinstance(err, JobError) and "one of the two is faulty" in str(err), err
        assert members[1].hex()[:16] in str(err) and members[2].hex()[:16] in str(err)


@pytest.mark.looptime
async def test_a_lagging_failure_detector_costs_no_attempt_and_no_honest_member() -> None:
    """A crashed member is first only *claimed* unreachable (the detector has not noticed yet):
    the initiator asks it first, finds it unreachable and re-runs under the same fresh number."""
    members = keys(5)
    net = MemoryNetwork(members, seed=3, detect_ms=60_000)     # the detector never notices in time
    victim = members[2]
    vectors = random_vectors(members, 8, 3)
    wrap = {victim: lambda ch: CrashingChannel(ch, chunk_sends(1))}
    results, _ = await run_sum(net, vectors, wrap=wrap, chunk_entries=3)
    outcome = check_consistent(results, vectors, 3)
    assert outcome is not None and outcome.participants == tuple(m for m in members if m != victim)
    assert outcome.attempts == 2


@pytest.mark.looptime
@pytest.mark.parametrize("mode", ss.RING_MODES)
async def test_a_member_that_stops_without_a_word_is_found_and_dropped(mode: str) -> None:
    """Site 2 stops (its code hangs: alive for the failure detector, silent on the ring). The
    chunk does not come back; asked where it is, site 1 says it passed it on and site 2 says
    nothing: site 2 is dropped, and the re-run over the others succeeds."""
    members, net, results, vectors = await run_with_liar(5, 2, ["quit"], mode)
    rest = tuple(m for m in members if m != members[2])
    assert restarts(net) == [rest]
    assert all(isinstance(results[m], SumOutcome) and results[m].participants == rest
               and results[m].attempts == 2 for m in rest), results
    assert results[members[0]].total.tolist() == exact_sum(vectors, rest)


@pytest.mark.parametrize(("entries", "threaded"), [(31, False), (262_143, False), (262_144, True), (1 << 20, True)])
async def test_only_chunks_of_2_mib_or_more_are_masked_in_a_thread(monkeypatch, entries: int, threaded: bool) -> None:
    """The hand-off to a worker thread is decided by the chunks' own size, not by chunk_entries: with
    2 MiB chunks by default, a 31-entry vector (a logistic regression's sums) went to a thread per
    chunk, and the in-memory FedAvg crash test then failed 4 times in 12 (thread completions race
    virtual time)."""
    from fedpeer.protocols.securesum import core

    calls = []

    async def to_thread(fn, *args):
        calls.append(fn)
        return fn(*args)

    monkeypatch.setattr(core.asyncio, "to_thread", to_thread)
    plan = core._Plan("job", "t", "ring", np.zeros(entries, np.uint64), core.DEFAULT_CHUNK_ENTRIES, 1_000, 1)
    assert await core._compute(plan, len, "abc") == 3
    assert bool(calls) == threaded


class LosesOneChange:
    """A member's channel that loses the first compact announcement it receives (as a full
    mailbox would drop it): the next change is made to a list it does not hold."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lost = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def recv(self, kind: type, tag: str, src: bytes | None = None, timeout_ms: int = 30_000) -> Any:
        got = await self.inner.recv(kind, tag, src, timeout_ms)
        if kind is SumChange and not self.lost:
            self.lost += 1
            got = await self.inner.recv(kind, tag, src, timeout_ms)
        return got


@pytest.mark.looptime
async def test_a_member_that_missed_a_compact_announcement_asks_for_the_whole_list() -> None:
    """Compact announcements say who is dropped relative to the list the members hold: a member
    that lost one (member 4: attempt 2's) cannot apply the next (attempt 3's), asks the
    initiator for the whole list, gets it and takes part; every survivor ends with the same
    exact total."""
    members = keys(6)
    net = MemoryNetwork(members, seed=1)
    vectors = random_vectors(members, 10, 1)
    wrap = {members[2]: lambda ch: CrashingChannel(ch, chunk_sends(1, attempt=1)),
            members[3]: lambda ch: CrashingChannel(ch, chunk_sends(0, attempt=2)),
            members[4]: LosesOneChange}
    results, _ = await run_sum(net, vectors, mode="pairwise", chunk_entries=3, compact=True, wrap=wrap)
    rest = (members[0], members[1], members[4], members[5])
    outcome = check_consistent({m: results[m] for m in rest}, vectors, 1)
    assert outcome is not None and outcome.participants == rest and outcome.attempts == 3
    assert all(isinstance(results[m], SumOutcome) for m in rest), results
    asks = [(s, d) for s, d, m in net.sent if isinstance(m, SumListAsk)]
    full = [(s, d) for s, d, m in net.sent if isinstance(m, SumRestart) and m.participants]
    assert asks == [(members[4], members[0])] and full == [(members[0], members[4])]


def test_an_announced_reason_fits_every_gate() -> None:
    """A reason naming many members dropped at once is cut to REASON_BYTES_MAX bytes: a receiver's
    gate would refuse a longer one, and the initiator drop that receiver for it."""
    from fedpeer.protocols.securesum.lead import _said
    long = "unreachable when announcing the next attempt: " + ", ".join("é" + "ab" * 8 for _ in range(200))
    assert len(_said(long).encode()) <= ss.REASON_BYTES_MAX < len(long.encode())
    assert _said("short") == "short"
    bob, gate, sealer = _alice_to_bob()
    msg = SumRestart("t/ss-ring/restart", 2, (), _said(long))
    assert gate.open(sealer.seal(bob.public_key, msg), 0).msg == msg
