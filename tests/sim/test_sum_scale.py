"""The secure sum's scale simulation (fedpeer/testing/sumsim.py, benchmarks/bench_sum_scale.py) at
small n: exact message counts with no drops, and a sum that completes over the survivors when
10 % of the members crash at random moments of the protocol."""

from __future__ import annotations

import pytest

from fedpeer.testing.sumsim import simulate_sum


@pytest.mark.parametrize(("mode", "per_member"), [("ring", 2), ("pairwise", 4)])
def test_clean_sum_sends_the_expected_messages(mode: str, per_member: int) -> None:
    n = 20
    run = simulate_sum(n, mode=mode)
    # ring: n chunk hops + n - 1 results; pairwise adds n - 1 seed requests and n - 1 reveals
    assert run.ok and run.participants == n and run.attempts == 1
    assert run.messages == per_member * n - (per_member - 1)
    assert run.bytes_max > run.bytes_mean       # the initiator sends every result


@pytest.mark.parametrize("mode", ["ring", "pairwise"])
@pytest.mark.parametrize("seed", range(4))
def test_sum_completes_with_ten_percent_dropping(mode: str, seed: int) -> None:
    run = simulate_sum(30, mode=mode, drop_fraction=0.1, seed=seed, attempts_max=16)
    assert run.dropped == 3
    assert run.ok, run                          # every survivor: the same exact total, with its vector in
    assert 27 <= run.participants <= 30
