"""Sparse mode of the secure sum (fedpeer/protocols/securesum/masks.py, `mask_neighbours`): pairwise
masks with O(log n) neighbours drawn from public randomness, the rest as pairwise mode."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.protocols.securesum import api as ss
from fedpeer.protocols.securesum.masks import mask_neighbours, pairwise_label, sparse_degree
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.sumsim import sim_keys, simulate_sum


def _plan(length: int = 12) -> ss._Plan:
    return ss._Plan("job", "t", ss.SPARSE, np.zeros(length, dtype=np.uint64), 6, 1_000, 3)


def test_neighbours_are_symmetric_few_and_fresh_per_attempt() -> None:
    members = tuple(sim_keys(200))
    label = pairwise_label(_plan(), 1)
    graph = {m: set(mask_neighbours(label, members, m)) for m in members}
    for m, peers in graph.items():
        assert m not in peers and all(m in graph[p] for p in peers), "masks must pair up to cancel"
        assert sparse_degree(200) <= len(peers) <= 4 * sparse_degree(200) < len(members) - 1
    assert graph == {m: set(mask_neighbours(label, members, m)) for m in members}     # public, the same at all
    again = {m: set(mask_neighbours(pairwise_label(_plan(), 2), members, m)) for m in members}
    assert again != graph, "a re-run draws new neighbours"


@pytest.mark.parametrize("n", [3, 12, 60])
def test_sparse_masks_cancel_and_every_contribution_is_masked(n: int) -> None:
    members = sim_keys(n)
    net = MemoryNetwork(members, seed=5)
    att = ss._Attempt(1, tuple(members))
    parts = []
    for m in members:
        masks = ss._Masks(net.channel(m), _plan(), att)
        assert len(masks.pair_seeds) == len(mask_neighbours(pairwise_label(_plan(), 1), members, m))
        masks.self_seed = masks.ring_seed = None    # removed separately (revealed seed, ring mask)
        parts.append(masks.contribution(0))
    assert not np.any(np.sum(parts, axis=0, dtype=np.uint64)), "sparse pairwise masks must cancel"
    assert all(np.all(p != 0) for p in parts)


@pytest.mark.parametrize("seed", range(3))
def test_sparse_sum_is_exact_and_survives_ten_percent_dropping(seed: int) -> None:
    assert simulate_sum(40, mode=ss.SPARSE, seed=seed).ok
    run = simulate_sum(40, mode=ss.SPARSE, drop_fraction=0.1, seed=seed, attempts_max=16)
    assert run.ok and 36 <= run.participants <= 40, run


@pytest.mark.parametrize("mode", ["ring", "pairwise", "sparse", "allreduce"])
@pytest.mark.parametrize("compact", [False, True])
def test_sumcheck_runs_every_mode_it_offers_with_and_without_compact_messages(mode: str, compact: bool) -> None:
    """sumcheck offers the sparse ring (capability secsum-sparse): its total over public vectors is
    checked exactly at every member, as in the other modes."""
    from fedpeer.jobs.kind import JobContext
    from fedpeer.kinds import sumcheck
    from fedpeer.testing.members import member_keys, run_members

    keys, names = member_keys("sumcheck", 7)
    params = sumcheck.KIND.check_params({"secure_sum": mode, "secure_sum_compact": compact, "entries": 2048})
    results = run_members(keys, lambda net, i, k: sumcheck.run(net.channel(k), params,
                                                               JobContext(names[k], names, 2_000)))
    assert all(isinstance(r, dict) and r["ok"] and len(r["participants"]) == 7 for r in results), results
