"""The secure all-reduce (fedpeer/protocols/securesum/allreduce.py) over the in-memory network, in
virtual time: exact totals for any member count and vector length (segments and pieces of every
shape), every member moving about 2(n-1)/n of the vector and no member more than 1.25x the mean,
what an owner receives and what it sends on are masked, three one-way legs, a lost member fails
the sum at the others (never a hang), and an owner that sends members different totals is named."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.errors import JobError
from fedpeer.protocols.securesum import allreduce as ar
from fedpeer.protocols.securesum.api import SumChunk, secure_sum
from fedpeer.protocols.securesum.wire import ArCheck, ArReveal
from fedpeer.testing.members import TwoFaced
from fedpeer.testing.memory import MemoryNetwork
from tests.sim.test_securesum import check_consistent, keys, random_vectors, run_sum, run_virtual

SIZE = (1 << 15) + 1             # past the all-to-all's line at up to 3 members: several pieces and segments


def test_segments_cover_the_vector_on_whole_aes_blocks() -> None:
    for length in (0, 1, 2, 3, 17, 1000, 1001):
        for n in (2, 3, 5, 10):
            segs = ar.segments(length, n)
            assert len(segs) == n and segs[0].start == 0 and segs[-1].stop == length
            assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))
            assert all(s.start % 2 == 0 for s in segs)
            sizes = [s.stop - s.start for s in segs]
            assert max(sizes) - min(sizes) <= 2 + (2 if length % 2 else 0)
            for s in segs:
                parts = ar.pieces(s, 7)
                assert parts[0].start == s.start and parts[-1].stop == s.stop
                assert all(p.stop - p.start <= 6 for p in parts)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 6), length=st.sampled_from([1, 17, 3000, 40_000, 40_001]),
       chunk=st.sampled_from([4096, 10_000, 1 << 18]), seed=st.integers(0, 2**16))
def test_exact_total_at_every_member(n: int, length: int, chunk: int, seed: int) -> None:
    """Both paths: all to all (small vectors, alltoall.py) and the all-reduce."""
    members = keys(n)
    vectors = random_vectors(members, length, seed)
    net = MemoryNetwork(members, seed=seed)
    results, _ = run_virtual(run_sum(net, vectors, mode="allreduce", chunk_entries=chunk))
    outcome = check_consistent(results, vectors, seed)
    assert outcome is not None and outcome.participants == tuple(members)


@pytest.mark.looptime
async def test_small_vectors_go_all_to_all_in_two_legs() -> None:
    """Below ALL_TO_ALL_BYTES_MAX every member sends its masked vector to every other, then its
    seed and digests: two legs of 10 ms, and no ring message."""
    members = keys(3)
    vectors = random_vectors(members, 100, 1)
    net = MemoryNetwork(members, seed=1, delay_ms=(10.0, 10.0))
    seen: list[tuple[str, np.ndarray | None]] = []
    net.refuse = lambda src, dst, msg: seen.append((msg.tag, getattr(msg, "data", None))) and None
    results, ended = await run_sum(net, vectors, mode="allreduce")
    check_consistent(results, vectors, 1)
    assert len(seen) == 2 * 3 * 2 and all("/ss-allreduce/" in tag for tag, _ in seen)
    assert all(0.020 <= t < 0.030 for t in ended.values()), ended
    sent = np.concatenate([d for _, d in seen if d is not None])
    assert (np.concatenate(list(vectors.values()))[:, None] == sent[None, :]).sum() == 0   # every copy masked


@pytest.mark.looptime
@pytest.mark.parametrize("compact", [False, True])
async def test_a_member_sending_different_small_vectors_is_named(compact: bool) -> None:
    members = keys(3)
    vectors = random_vectors(members, 50, 8)
    cheat = members[0]
    results, _ = await run_sum(MemoryNetwork(members, seed=8), vectors, mode="allreduce", compact=compact,
                               wrap={cheat: lambda ch: TwoFaced(ch, members[1], lambda m: isinstance(m, SumChunk))})
    errors = [str(r) for m, r in results.items() if m != cheat]
    assert all(f"vector of {cheat.hex()[:16]}" in e for e in errors), results


@pytest.mark.looptime
@pytest.mark.parametrize("n", [4, 12])
async def test_compact_reveal_carries_one_digest_and_names_a_two_faced_member(n: int) -> None:
    """Compact sums reveal one digest of the per-member digests (32 bytes whatever n); only the
    members whose digests differ exchange whole lists, which name the member that sent two
    versions of its vector; a clean sum exchanges none."""
    members = keys(n)
    vectors = random_vectors(members, 20, 9)
    net = MemoryNetwork(members, seed=9)
    results, _ = await run_sum(net, vectors, mode="allreduce", compact=True)
    check_consistent(results, vectors, 9)
    reveals = [m for _, _, m in net.sent if isinstance(m, ArReveal)]
    assert len(reveals) == n * (n - 1) and all(len(m.digests) == 1 for m in reveals)
    assert not any(isinstance(m, ArCheck) for _, _, m in net.sent)
    cheat, fooled = members[n // 2], members[-1]
    net = MemoryNetwork(members, seed=9)
    results, _ = await run_sum(net, vectors, mode="allreduce", compact=True,
                               wrap={cheat: lambda ch: TwoFaced(ch, fooled, lambda m: isinstance(m, SumChunk))})
    errors = [str(r) for m, r in results.items() if m != cheat]
    assert len(errors) == n - 1 and all(f"vector of {cheat.hex()[:16]}" in e for e in errors), results
    lists = {(s, d) for s, d, m in net.sent if isinstance(m, ArCheck)}
    assert lists and all(fooled in pair for pair in lists), "only the members whose digests differ exchange lists"


@pytest.mark.looptime
async def test_each_member_moves_its_share_and_none_more_than_125_percent_of_the_mean() -> None:
    n, length = 5, 1 << 16
    members = keys(n)
    vectors = random_vectors(members, length, 2)
    net = MemoryNetwork(members, seed=2)
    sent = dict.fromkeys(members, 0)

    def count(src: bytes, dst: bytes, msg: Any) -> None:
        if isinstance(msg, SumChunk):
            sent[src] += msg.data.nbytes
        return None
    net.refuse = count
    results, _ = await run_sum(net, vectors, mode="allreduce")
    check_consistent(results, vectors, 2)
    share = 2 * (n - 1) / n * 8 * length
    assert all(abs(b - share) <= 0.02 * share for b in sent.values()), (sent, share)
    assert max(sent.values()) <= 1.25 * (sum(sent.values()) / n)


@pytest.mark.looptime
@pytest.mark.parametrize("kind", ["/p", "/t"])     # contributions to owners, owners' sums to everyone
async def test_what_an_owner_receives_and_sends_on_is_masked(kind: str) -> None:
    members = keys(3)
    vectors = {m: np.zeros(SIZE, dtype=np.uint64) for m in members}   # all zeros: any zero seen leaks
    net = MemoryNetwork(members, seed=3)
    parts: list[np.ndarray] = []
    net.refuse = lambda src, dst, msg: parts.append(msg.data.copy()) if isinstance(msg, SumChunk) and kind in msg.tag \
        else None
    results, _ = await run_sum(net, vectors, mode="allreduce")
    assert all(not isinstance(r, Exception) and not r.total.any() for r in results.values())
    seen = np.concatenate(parts)
    assert len(seen) and (seen == 0).mean() < 0.001


@pytest.mark.looptime
async def test_three_one_way_legs() -> None:
    """Scatter, gather, reveal: with every message taking 10 ms, the sum ends after 30 ms and some
    computing, where five legs (a readiness and a digest step besides) took 50."""
    members = keys(4)
    vectors = random_vectors(members, SIZE, 6)
    net = MemoryNetwork(members, seed=6, delay_ms=(10.0, 10.0))
    results, ended = await run_sum(net, vectors, mode="allreduce")
    check_consistent(results, vectors, 6)
    assert all(0.030 <= t < 0.040 for t in ended.values()), ended


@pytest.mark.looptime
@pytest.mark.parametrize(("length", "legs"), [(100, 2), (SIZE, 3)])
async def test_a_leg_costs_one_way_not_a_round_trip(length: int, legs: int) -> None:
    """Acknowledgements that come back 10 ms after each 10 ms delivery: a member takes each step
    on what it received, so all to all still ends after 2 x 10 ms and the all-reduce after 3 x 10
    ms (waiting for its own sends' acknowledgements made them 40 and 60)."""
    members = keys(4 if length == SIZE else 3)
    vectors = random_vectors(members, length, 9)
    net = MemoryNetwork(members, seed=9, delay_ms=(10.0, 10.0), ack_ms=10.0)
    results, ended = await run_sum(net, vectors, mode="allreduce")
    check_consistent(results, vectors, 9)
    assert all(legs * 0.010 <= t < (legs + 1) * 0.010 for t in ended.values()), ended


@pytest.mark.looptime
async def test_a_send_that_fails_fails_the_step_without_waiting_for_the_others() -> None:
    """A member's scatter to one owner is refused (its gate), while the messages it waits for
    arrive only after 200 ms: it fails at once, naming that owner, not when its waits end."""
    members = keys(4)
    vectors = random_vectors(members, SIZE, 3)
    net = MemoryNetwork(members, seed=3, delay_ms=(1.0, 1.0))
    victim, target = members[0], members[1]
    net.refuse = lambda src, dst, msg: "schema" if (src, dst) == (victim, target) else None
    slow = {m: (lambda ch: _Slow(ch, 0.2)) for m in members if m != victim}
    results, ended = await run_sum(net, vectors, mode="allreduce", wrap=slow)
    assert isinstance(results[victim], JobError) and target.hex()[:16] in str(results[victim]), results[victim]
    assert ended[victim] < 0.1, ended


@pytest.mark.looptime
async def test_cancelling_a_member_stops_the_sends_it_posted() -> None:
    """The job cancelled at one member (an operator's cancel, an abort, the daemon stopping) right
    after its scatter was posted, on a slow link: none of its posted sends goes out afterwards."""
    members = keys(3)
    vectors = random_vectors(members, SIZE, 1)
    net = MemoryNetwork(members, seed=1, delay_ms=(50.0, 50.0), ack_ms=50.0)
    victim = members[0]
    tasks = {m: asyncio.ensure_future(secure_sum(net.channel(m), "t", vectors[m], mode="allreduce",
                                                 hop_timeout_ms=1000, chunk_entries=4096)) for m in members}
    await asyncio.sleep(0.010)
    tasks[victim].cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    await asyncio.sleep(1.0)
    assert tasks[victim].cancelled()
    assert not [msg for src, _, msg in net.sent if src == victim], "a cancelled member's sends went on"
    assert all(isinstance(tasks[m].exception(), JobError) for m in members[1:])


class _Slow:
    """A channel whose sends leave `delay_s` late (the member is busy elsewhere)."""

    def __init__(self, ch: Any, delay_s: float) -> None:
        self._ch, self._delay_s = ch, delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ch, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        await asyncio.sleep(self._delay_s)
        await self._ch.send(dst, msg)


@pytest.mark.looptime
async def test_a_member_lost_mid_sum_fails_it_at_the_others_without_hanging() -> None:
    members = keys(4)
    vectors = random_vectors(members, 4 * SIZE, 4)
    net = MemoryNetwork(members, seed=4)
    crashed = []

    def crash_after_first_part(src: bytes, dst: bytes, msg: Any) -> None:
        if not crashed and isinstance(msg, SumChunk) and src == members[2]:
            crashed.append(src)
            net.crash(src)
        return None
    net.refuse = crash_after_first_part
    results, ended = await run_sum(net, vectors, mode="allreduce", bound_s=300)
    others = [m for m in members if m != members[2]]
    assert all(isinstance(results[m], JobError) for m in others), results
    assert max(ended[m] for m in others) < 300


def a_total(msg: Any) -> bool:
    """An owner's sum of its segment (all-gather), not a member's contribution."""
    return isinstance(msg, SumChunk) and "/t" in msg.tag


@pytest.mark.looptime
@pytest.mark.parametrize("compact", [False, True])
async def test_an_owner_sending_different_totals_is_named(compact: bool) -> None:
    members = keys(3)
    vectors = random_vectors(members, SIZE, 5)
    net = MemoryNetwork(members, seed=5)
    cheat = members[1]
    results, _ = await run_sum(net, vectors, mode="allreduce", compact=compact,
                               wrap={cheat: lambda ch: TwoFaced(ch, members[2], a_total)})
    errors = [str(r) for m, r in results.items() if isinstance(r, JobError) and m != cheat]
    assert errors and all(f"owner {cheat.hex()[:16]}" in e for e in errors), results
