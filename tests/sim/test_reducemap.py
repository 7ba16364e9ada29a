"""The secure reduce-map (fedpeer/protocols/securesum/reducemap.py) over the in-memory network, in
virtual time: each owner's function sees exactly its segment's total (any bounds: odd, empty,
uneven), every member gets every owner's result, what an owner receives is masked, no total
travels, an owner's refusal fails the sum at every member naming it, one that sends members
different results is named, and a lost member fails the sum without a hang."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.errors import JobError
from fedpeer.protocols.securesum.api import SegmentRefused, SumChunk, secure_reduce_map
from fedpeer.protocols.securesum.wire import ArResult
from fedpeer.testing.members import TwoFaced
from fedpeer.testing.memory import MemoryNetwork
from tests.sim.test_securesum import HOP_MS, TAG, channel, exact_sum, keys, random_vectors, run_virtual


def is_result(msg: Any) -> bool:
    return isinstance(msg, ArResult)


def summary(k: int, total: np.ndarray) -> np.ndarray:
    """An owner's result: its index, its segment's length and the segment's total itself."""
    return np.concatenate([np.array([k, len(total)], dtype=np.uint64), total])


async def run_map(net: MemoryNetwork, vectors: dict[bytes, np.ndarray], bounds: list[int], owner_fn: Any = summary,
                  wrap: dict[bytes, Any] | None = None, **kw: Any) -> tuple[dict[bytes, Any], dict[bytes, float]]:
    ended: dict[bytes, float] = {}

    async def one(node: bytes) -> Any:
        ch = channel(net, node, "job")
        ch = (wrap or {}).get(node, lambda c: c)(ch)
        try:
            return await secure_reduce_map(ch, TAG, vectors[node], bounds, owner_fn, hop_timeout_ms=HOP_MS, **kw)
        finally:
            ended[node] = asyncio.get_running_loop().time()
    async with asyncio.timeout(600):
        results = await asyncio.gather(*(one(n) for n in net.members), return_exceptions=True)
    return dict(zip(net.members, results)), ended


def random_bounds(length: int, n: int, rng: np.random.Generator) -> list[int]:
    return [0, *sorted(int(x) for x in rng.integers(0, length + 1, n - 1)), length]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 6), length=st.integers(1, 3000), chunk=st.sampled_from([7, 1000, 1 << 18]),
       seed=st.integers(0, 2**16))
def test_each_owner_maps_exactly_its_segment_and_everyone_gets_every_result(n: int, length: int, chunk: int,
                                                                             seed: int) -> None:
    members = keys(n)
    vectors = random_vectors(members, length, seed)
    bounds = random_bounds(length, n, np.random.default_rng(seed))
    results, _ = run_virtual(run_map(MemoryNetwork(members, seed=seed), vectors, bounds, chunk_entries=chunk))
    total = exact_sum(vectors, members)
    for node, r in results.items():
        assert not isinstance(r, BaseException), (node.hex()[:8], r)
        assert r.participants == tuple(members)
        for k, res in enumerate(r.results):
            if bounds[k + 1] == bounds[k]:          # an empty segment: k owns nothing, maps nothing
                assert res.size == 0
                continue
            assert res[:2].tolist() == [k, bounds[k + 1] - bounds[k]]
            assert res[2:].tolist() == total[bounds[k]:bounds[k + 1]], f"seed {seed}: segment {k}"


@pytest.mark.looptime
async def test_what_an_owner_receives_is_masked_and_no_total_travels() -> None:
    members = keys(4)
    length = 4096
    vectors = {m: np.zeros(length, dtype=np.uint64) for m in members}   # all zeros: any zero seen leaks
    net = MemoryNetwork(members, seed=3)
    parts: list[np.ndarray] = []
    sent = dict.fromkeys(members, 0)

    def watch(src: bytes, dst: bytes, msg: Any) -> None:
        if isinstance(msg, SumChunk):
            parts.append(msg.data.copy())
            sent[src] += msg.data.nbytes
        return None
    net.refuse = watch
    bounds = [0, 1001, 2048, 3000, length]          # odd bounds: masks addressed by entry
    results, _ = await run_map(net, vectors, bounds, lambda k, t: np.array([int(t.any())], dtype=np.uint64))
    assert all(r.results == (np.zeros(1, np.uint64),) * 4 or [x.tolist() for x in r.results] == [[0]] * 4
               for r in results.values())
    seen = np.concatenate(parts)
    assert len(seen) and (seen == 0).mean() < 0.001
    for k, m in enumerate(members):                 # each member sent the segments it does not own, once
        assert sent[m] == 8 * (length - (bounds[k + 1] - bounds[k]))


@pytest.mark.looptime
async def test_an_owner_refusing_its_total_fails_the_sum_everywhere_naming_it() -> None:
    members = keys(3)
    vectors = random_vectors(members, 600, 7)

    def picky(k: int, total: np.ndarray) -> np.ndarray:
        if k == 1:
            raise ValueError("summed histograms: features disagree on a node's totals")
        return total[:1]
    results, _ = await run_map(MemoryNetwork(members, seed=7), vectors, [0, 200, 400, 600], picky)
    for node, r in results.items():
        assert isinstance(r, SegmentRefused), r
        assert r.reason == "summed histograms: features disagree on a node's totals"
        assert r.owner == ("this member" if node == members[1] else members[1].hex()[:16])


@pytest.mark.looptime
@pytest.mark.parametrize("compact", [False, True])
async def test_an_owner_sending_different_results_is_named(compact: bool) -> None:
    members = keys(3)
    vectors = random_vectors(members, 900, 5)
    cheat = members[1]
    results, _ = await run_map(MemoryNetwork(members, seed=5), vectors, [0, 300, 600, 900], compact=compact,
                               wrap={cheat: lambda ch: TwoFaced(ch, members[2], is_result)})
    errors = [str(r) for m, r in results.items() if isinstance(r, JobError) and m != cheat]
    assert errors and all(f"owner {cheat.hex()[:16]}" in e for e in errors), results


@pytest.mark.looptime
@pytest.mark.parametrize("check", [False, True])
async def test_a_leg_costs_one_way_not_a_round_trip(check: bool) -> None:
    """Acknowledgements 10 ms after each 10 ms delivery, two owners of five: scatter and result are
    two one-way legs (the digest check a third), not round trips. Waiting for its own sends'
    acknowledgements, an owner (which also scatters to the other owner) took four."""
    members = keys(5)
    vectors = random_vectors(members, 2000, 12)
    net = MemoryNetwork(members, seed=12, delay_ms=(10.0, 10.0), ack_ms=10.0)
    results, ended = await run_map(net, vectors, [0, 1000, 2000, 2000, 2000, 2000], check=check)
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    legs = 3 if check else 2
    assert all(legs * 0.010 <= t < (legs + 1) * 0.010 for t in ended.values()), ended


@pytest.mark.looptime
async def test_a_member_lost_mid_sum_fails_it_at_the_others_without_hanging() -> None:
    members = keys(4)
    vectors = random_vectors(members, 8000, 4)
    net = MemoryNetwork(members, seed=4)
    crashed: list[bytes] = []

    def crash_after_first_part(src: bytes, dst: bytes, msg: Any) -> None:
        if not crashed and isinstance(msg, SumChunk) and src == members[2]:
            crashed.append(src)
            net.crash(src)
        return None
    net.refuse = crash_after_first_part
    results, ended = await run_map(net, vectors, [0, 2000, 4000, 6000, 8000], chunk_entries=500)
    for m in members:
        if m != members[2]:
            assert isinstance(results[m], JobError), results[m]
    assert max(ended.values()) < 10 * HOP_MS / 1000


@pytest.mark.looptime
async def test_results_left_unchecked_are_checked_later_naming_the_two_faced_owner() -> None:
    """check=False skips step 4; check_results over a hash of each owner's results (histogram
    XGBoost: once per tree) names the owner that sent members different results."""
    import hashlib

    from fedpeer.protocols.securesum.api import secure_results_check

    members = keys(3)
    vectors = random_vectors(members, 900, 9)
    cheat = members[2]
    net = MemoryNetwork(members, seed=9)

    async def one(node: bytes) -> Any:
        ch = channel(net, node, "job")
        if node == cheat:
            ch = TwoFaced(ch, members[0], is_result)
        hashes = [hashlib.sha256() for _ in members]
        for level in range(2):
            out = await secure_reduce_map(ch, f"{TAG}{level}", vectors[node], [0, 300, 600, 900], summary,
                                          hop_timeout_ms=HOP_MS, check=False)
            for h, d in zip(hashes, out.digests):
                h.update(d)
        await secure_results_check(ch, f"{TAG}check", [h.digest() for h in hashes], hop_timeout_ms=HOP_MS)
        return out
    results = await asyncio.gather(*(one(n) for n in members), return_exceptions=True)
    errors = [str(r) for m, r in zip(members, results) if m != cheat]
    assert all(f"owner {cheat.hex()[:16]}" in e for e in errors), results


@pytest.mark.looptime
async def test_a_two_faced_owner_fails_the_epochs_sum_at_once_without_waiting_for_the_dead() -> None:
    """Epochs (fedpeer/protocols/epochs.py) waits up to DEAD_WAIT_MS for the failure detector
    after a failed sum; an Equivocation names a member and nobody died, so it fails at once."""
    import hashlib

    from fedpeer.protocols.epochs import DEAD_WAIT_MS, Epochs
    from fedpeer.protocols.securesum.api import Equivocation

    members = keys(3)
    vectors = random_vectors(members, 900, 10)
    cheat = members[1]
    net = MemoryNetwork(members, seed=10)

    async def one(node: bytes) -> Any:
        ch = channel(net, node, "job")
        epochs = Epochs(TwoFaced(ch, members[2], is_result) if node == cheat else ch, "t", "allreduce", HOP_MS)
        out = await epochs.reduce_map("level", vectors[node], [0, 300, 600, 900], summary, check=False)
        await epochs.check_results("check", [hashlib.sha256(d).digest() for d in out.digests])
    started = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(one(n) for n in members), return_exceptions=True)
    assert all(isinstance(r, Equivocation) for m, r in zip(members, results) if m != cheat), results
    assert asyncio.get_running_loop().time() - started < DEAD_WAIT_MS / 1000 / 2
