"""The Skellam mechanism of fedpeer/protocols/dp.py: the total's noise has the calibrated
distribution whatever the members, calibration meets the budget, checks' slack holds."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats as sps

from fedpeer.protocols import dp

MU = 40.0
DRAWS = 40_000


@pytest.mark.parametrize("members", [1, 2, 5, 13])
def test_the_sum_of_members_shares_is_skellam_with_the_calibrated_variance(members):
    rng = np.random.default_rng(1000 + members)
    share = dp.share_mu(MU, members)
    total = sum(dp.draw_share(rng, share, DRAWS) for _ in range(members))
    # Sk(μ): mean 0, variance μ, fourth cumulant μ, so Var(sample variance) ≈ (2μ² + μ)/N
    half_width = 5 * math.sqrt((2 * MU * MU + MU) / DRAWS)
    assert abs(total.var() - MU) < half_width
    assert abs(total.mean()) < 5 * math.sqrt(MU / DRAWS)
    # the whole distribution, not its first two moments: chi-square against Skellam(μ/2, μ/2)
    values, counts = np.unique(np.clip(total, -15, 15), return_counts=True)
    pmf = sps.skellam(MU / 2, MU / 2)
    expected = np.array([pmf.cdf(-15) if v == -15 else pmf.sf(14) if v == 15 else pmf.pmf(v) for v in values])
    assert sps.chisquare(counts, expected * DRAWS / expected.sum()).pvalue > 1e-4


def test_colluders_assumed_leave_every_member_the_full_variance():
    # t of n members subtracting their own shares leave n - t shares: still variance μ
    assert dp.share_mu(MU, 5, colluders=4) * 1 == MU
    assert dp.share_mu(MU, 5, colluders=2) * 3 == pytest.approx(MU)
    with pytest.raises(ValueError):
        dp.share_mu(MU, 3, colluders=3)


def test_noised_vectors_wrap_modulo_2_64_and_read_back_signed():
    rng = np.random.default_rng(3)
    values = rng.integers(0, 1000, 64).astype(np.uint64)
    noise = dp.draw_share(rng, 25.0, 64)
    total = dp.add_noise(values, noise)
    assert np.array_equal(dp.signed(total), values.astype(np.int64) + noise)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 8.0])
def test_calibration_meets_the_budget_and_is_not_wasteful(epsilon):
    sums = [dp.DpSum("moments", 2 ** 20, 2 ** 20, 5), dp.DpSum("hist", 6, math.sqrt(6), 80)]
    mus = dp.calibrate(sums, epsilon, 1e-8)
    assert dp.epsilon_of(list(zip(sums, mus)), 1e-8) <= epsilon
    assert dp.epsilon_of([(s, mu * 0.99) for s, mu in zip(sums, mus)], 1e-8) > epsilon
    # equal noise multipliers: μ_i / Δ2_i² the same for every sum
    assert mus[0] / 2 ** 40 == pytest.approx(mus[1] / 6)


def test_skellam_costs_a_little_more_than_the_gaussian_of_the_same_variance():
    # a check against dp-accounting's own Gaussian: Theorem 3.5's leading term is the Gaussian's
    mu, delta = 400.0, 1e-6
    skellam = dp.epsilon_of([(dp.DpSum("s", 1, 1, 1), mu)], delta)
    acc = dp_accounting.rdp.RdpAccountant(list(dp.ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(math.sqrt(mu)))
    gaussian = acc.get_epsilon(delta)
    assert gaussian <= skellam <= gaussian * 1.05


def test_a_retried_sum_is_charged_twice():
    s = dp.DpSum("s", 1, 1, 1)
    mu = dp.calibrate([s], 1.0, 1e-6)[0]
    once, twice = dp.epsilon_of([(s, mu)], 1e-6), dp.epsilon_of([(s, mu), (s, mu)], 1e-6)
    assert once <= 1.0 < twice


def test_the_noise_bound_holds_at_its_stated_tail():
    rng = np.random.default_rng(7)
    tail, entries = 1e-3, 100
    bound = dp.noise_bound(MU, entries, tail)
    outside = sum(bool((np.abs(dp.draw_share(rng, MU, entries)) > bound).any()) for _ in range(2000))
    assert outside <= 2000 * tail + 5
    # and is not loose by more than a factor 2 against the Gaussian quantile
    assert bound < 2 * sps.norm.isf(tail / (2 * entries)) * math.sqrt(MU) + 10


def test_clipping_bounds_every_rows_contribution():
    rows = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    assert np.allclose(np.linalg.norm(dp.clip_l2(rows, 1.0), axis=1), [1.0, 0.5, 0.0])
    assert np.array_equal(dp.clip_entries(np.array([-5.0, 0.5, 9.0]), 0.0, 1.0), [0.0, 0.5, 1.0])


def test_budgets_outside_the_declared_range_are_refused():
    with pytest.raises(ValueError):
        dp.calibrate([dp.DpSum("s", 1, 1, 1)], 0.0, 1e-6)
    with pytest.raises(ValueError):
        dp.calibrate([dp.DpSum("s", 1, 1, 1)], 1.0, 0.5)
    assert dp.default_delta(1000) == 1e-6


def test_the_vectorised_curve_is_theorem_3_5_at_every_order():
    releases = [(dp.DpSum("a", 7, 3, 4), 50.0), (dp.DpSum("b", 2, 1.5, 1), 9.0)]
    want = [sum(dp.skellam_rdp(a, s.l1, s.l2, mu) for s, mu in releases) for a in dp.ORDERS]
    assert np.allclose(dp.rdp_curve(releases), want, rtol=1e-12)
