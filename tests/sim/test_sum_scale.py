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
    run = simulate_sum(30, mode=mode, drop_fraction=0.1, seed=seed, compact=bool(seed % 2))
    assert run.dropped == 3
    assert run.ok, run                          # every survivor: the same exact total, with its vector in
    assert 27 <= run.participants <= 30


N_LARGE, CLEAN_S = 200, 0.2       # a clean 200-member sum takes ~0.2 s of virtual time: drops land inside it


@pytest.mark.parametrize("mode", ["ring", "sparse"])
def test_200_members_with_twenty_dropping_finish_at_the_defaults(mode: str) -> None:
    """attempts_max at its default (3): the re-runs that lose members do not use it up. Drops spread
    over four times a clean sum's time take five attempts here; counted against attempts_max, as
    before, the sum failed (10 % dropping at 1,000 members failed in every mode: bench_sum_scale.py)."""
    run = simulate_sum(N_LARGE, mode=mode, drop_fraction=0.1, seed=1, compact=True, drop_window_s=4 * CLEAN_S)
    assert run.dropped == 20 and run.ok, run
    assert run.attempts > 3 and N_LARGE - 20 <= run.participants < N_LARGE


def test_compact_announcements_grow_with_the_members_dropped_not_with_n_squared() -> None:
    """Every re-run tells each survivor who was dropped (places in the job's members) and a digest of
    the list it holds: a fixed frame per survivor plus a few bytes per member dropped. The whole
    list to every survivor (the old messages, still run with members of older releases) is n² bytes."""
    full = simulate_sum(N_LARGE, drop_fraction=0.1, seed=1, drop_window_s=CLEAN_S)
    compact = simulate_sum(N_LARGE, drop_fraction=0.1, seed=1, compact=True, drop_window_s=CLEAN_S)
    assert full.ok and compact.ok and full.attempts == compact.attempts >= 3, (full, compact)
    reruns, n, dropped = compact.attempts - 1, N_LARGE, compact.dropped
    assert compact.announce_bytes <= reruns * (n - 1) * 256 + n * dropped * 4, compact
    assert full.announce_bytes >= reruns * (n - dropped) ** 2 * 32, full
    assert full.announce_bytes >= 20 * compact.announce_bytes


def test_a_member_lost_mid_lap_costs_one_more_attempt_and_an_announcement_to_every_survivor() -> None:
    """What a lost member costs with the whole-list announcements (members of releases without
    the compact messages; docs/security.md, "Members that drop"): the initiator re-runs the whole
    sum over the survivors, after announcing the new ring, the full list of its participants, to
    each of them: n - 2 lists of n - 1 keys more from the initiator."""
    n = 50
    clean = simulate_sum(n)
    rerun = 0
    for seed in range(6):
        run = simulate_sum(n, drop_fraction=1 / n, seed=seed, drop_window_s=clean.virtual_s / 2)
        assert run.ok, run
        if run.participants == n - 1:         # dropped before passing its chunk on: a re-run
            rerun += 1
            assert run.attempts == 2
            assert run.bytes_max - clean.bytes_max >= (n - 2) * (n - 1) * 32
            assert run.virtual_s > 4 * clean.virtual_s
        else:                                 # dropped after: its vector is in, nothing re-runs
            assert run.participants == n and run.attempts == 1
    assert rerun
