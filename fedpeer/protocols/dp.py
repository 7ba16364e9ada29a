"""Differential privacy inside the secure sum: the Skellam mechanism, its calibration and accounting
(docs/security.md, differential privacy).

Rules:
- Every DP sum is of integers (fixed-point quanta or counts). Each member first clips its own
  contribution to the sum's declared sensitivity (`clip_l2` for vectors bounded in L2 norm,
  `clip_entries` for per-entry bounds), then adds its share of noise, then masks. No member,
  the initiator included, ever holds an un-noised total: the noise is in every contribution
  before it leaves its member.
- The noise of a sum is Skellam with variance μ per entry: Sk = Poisson(μ/2) − Poisson(μ/2).
  Skellam is closed under addition, so a member of n draws Skellam with variance μ/(n − t)
  (`share_mu`), and the total of the n shares carries Skellam with variance μ·n/(n − t) ≥ μ
  exactly, whatever n: t = 0 gives exactly μ; t > 0 (colluders assumed) keeps μ for every member's
  data even when t members subtract their own shares.
- Privacy of one release (Agarwal, Kairouz, Liu: "The Skellam Mechanism for Differentially Private
  Federated Learning", NeurIPS 2021, Theorem 3.5), for integer orders α > 1 and integer
  sensitivities Δ1 (L1) and Δ2 (L2) in the sum's own units:
      ε_RDP(α) ≤ α·Δ2²/(2μ) + min( ((2α − 1)·Δ2² + 6·Δ1) / (4μ²),  3·Δ1/(2μ) )
  Rényi DP composes by adding over every release (every sum, every attempt of a sum); the
  composed curve becomes (ε, δ) by dp-accounting's conversion (`compute_epsilon`, Balle et al.
  2020's tighter conversion). Nothing here is a float comparison of a secret: μ is public.
- The budget split of a job (`calibrate`): every sum gets the same noise multiplier, μ_i = c·Δ2_i²
  (its RDP's leading term is then the same for every sum: an equal share of the budget), or public
  weights w_i of it, μ_i = c·w_i·Δ2_i² (histogram XGBoost's hessians take more noise than its
  gradients), and the one scalar c is the least (up to 0.1 %) for which the composition of all the job's sums meets
  the job's (ε, δ). Every member computes it from public numbers alone, so identically.
- Checks of noised totals allow the noise's high-probability range and no more (`noise_bound`:
  Bernstein's inequality for a centred Poisson difference, union over the entries): an honest
  total lies outside it with probability below NOISE_TAIL.

Pure maths and one noise draw from a caller's numpy Generator (seeded in tests, from the OS in the
daemon: `os_rng`).
"""

from __future__ import annotations

import math
import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedpeer.protocols.fixedpoint import fraction_bits

ORDERS = tuple(range(2, 65)) + tuple(range(72, 1025, 8))   # integer Rényi orders (Theorem 3.5 needs integers)
NOISE_TAIL = 1e-9          # a check of a noised total fails an honest federation at most this often
CALIBRATE_RTOL = 1e-3      # c is within 0.1 % of the least that meets the budget
MU_MAX = float(2 ** 80)    # a variance beyond this leaves no bits for data in a 64-bit sum
EPSILON_MIN, EPSILON_MAX = 1e-3, 100.0
DELTA_MAX = 0.1


@dataclass(frozen=True)
class DpSum:
    """One noised release: its name, its sensitivities in the sum's integer units, its entries."""
    name: str
    l1: float
    l2: float
    entries: int

    def __post_init__(self) -> None:
        assert self.l2 > 0 and self.l1 >= self.l2 and self.entries >= 1, self


def skellam_rdp(alpha: int, l1: float, l2: float, mu: float) -> float:
    """ε_RDP(α) of one Skellam release with variance `mu` per entry (Theorem 3.5, above)."""
    assert alpha > 1 and mu > 0
    return alpha * l2 * l2 / (2 * mu) + min(((2 * alpha - 1) * l2 * l2 + 6 * l1) / (4 * mu * mu),
                                             3 * l1 / (2 * mu))


_ORDERS = np.array(ORDERS, dtype=float)


def rdp_curve(releases: Sequence[tuple[DpSum, float]]) -> list[float]:
    """The composed RDP curve over ORDERS of releases [(sum, μ), ...] (a retried sum appears twice):
    skellam_rdp at every order, vectorised over the orders; alike releases (the same sensitivities
    and μ: a tree's levels) are computed once and counted."""
    a, total = _ORDERS, np.zeros(len(ORDERS))
    alike = Counter((s.l1, s.l2, mu) for s, mu in releases)
    for (l1, l2, mu), times in alike.items():
        l2sq = l2 * l2
        total += times * (a * l2sq / (2 * mu) + np.minimum(((2 * a - 1) * l2sq + 6 * l1) / (4 * mu * mu),
                                                          3 * l1 / (2 * mu)))
    return total.tolist()


def epsilon_of(releases: Sequence[tuple[DpSum, float]], delta: float) -> float:
    """The (ε, δ)-DP ε of releasing every sum in `releases` (composition by RDP)."""
    if not releases:
        return 0.0
    # dp-accounting imports scipy.stats and its PLD half on import (~1.5 s of CPU): only a DP job
    # pays for it, in its calibration's worker thread (or the daemon's ML preload), never every
    # `fedpeer` command and daemon start.
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
    eps, _ = compute_epsilon(ORDERS, rdp_curve(releases), delta)
    return float(eps)


def check_budget(epsilon: float, delta: float) -> None:
    if not (EPSILON_MIN <= epsilon <= EPSILON_MAX and 0 < delta <= DELTA_MAX):
        raise ValueError(f"(ε, δ) = ({epsilon}, {delta}) outside ε in [{EPSILON_MIN}, {EPSILON_MAX}], "
                         f"δ in (0, {DELTA_MAX}]")


def calibrate(sums: Sequence[DpSum], epsilon: float, delta: float,
              weights: Sequence[float] | None = None) -> list[float]:
    """The variance μ_i per entry of every sum so that releasing all of them once is (ε, δ)-DP:
    μ_i = c·w_i·Δ2_i² with the least c found by bisection in log space — equal noise multipliers,
    or with `weights` w_i (public, e.g. more noise on a sum that tolerates it) in that proportion."""
    check_budget(epsilon, delta)
    assert sums
    w = [1.0] * len(sums) if weights is None else [float(x) for x in weights]
    assert len(w) == len(sums) and min(w) > 0

    def eps(c: float) -> float:
        return epsilon_of([(s, c * wi * s.l2 * s.l2) for s, wi in zip(sums, w)], delta)

    lo, hi = 1e-6, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 4
        if hi * max(wi * s.l2 ** 2 for s, wi in zip(sums, w)) > MU_MAX:
            raise ValueError(f"ε {epsilon} needs more noise than a 64-bit sum can carry")
    while hi / lo > 1 + CALIBRATE_RTOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
    return [hi * wi * s.l2 * s.l2 for s, wi in zip(sums, w)]


def default_delta(rows_max: int) -> float:
    """δ = 1/N² for a public bound N on the federation's rows (the usual δ ≪ 1/N)."""
    return 1.0 / float(max(int(rows_max), 2)) ** 2


def share_mu(mu: float, members: int, colluders: int = 0) -> float:
    """Each member's share of a sum's variance: μ/(members − colluders) (the rules above)."""
    if not 0 <= colluders < members:
        raise ValueError(f"{colluders} colluders among {members} members leaves no honest noise")
    return mu / (members - colluders)


def spread(members: int, colluders: int = 0) -> float:
    """The total's noise variance per unit μ: n shares of μ/(n − t) carry μ·n/(n − t) (= 1 at t = 0),
    what checks of a noised total allow for (`noise_bound`)."""
    return members * share_mu(1.0, members, colluders)


def draw_share(rng: np.random.Generator, mu_share: float, entries: int) -> np.ndarray:
    """One member's noise share: int64 Skellam with variance `mu_share` per entry. A retry of a sum
    calls this again (fresh noise); the caller charges both attempts."""
    half = mu_share / 2.0
    return rng.poisson(half, entries).astype(np.int64) - rng.poisson(half, entries).astype(np.int64)


def os_rng() -> np.random.Generator:
    """A Generator seeded from the operating system (the daemon's noise; never a job's seed)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


LOST_INSIDE = ("a member was lost inside a DP sum: the total lacks its noise share, so the job stops "
               "(every site's ledger keeps the charge)")


def whole_total(participants: Sequence[bytes], members: Sequence[bytes], total: np.ndarray) -> np.ndarray:
    """A DP sum's total read as signed integers, or ValueError(LOST_INSIDE) when it went without a
    member: a DP sum gets one attempt (docs/security.md, a DP sum's retry), so a total short of a
    member's noise share is never used."""
    if len(participants) != len(members):
        raise ValueError(LOST_INSIDE)
    return signed(total)


def add_noise(vector: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """`vector` (uint64, the member's encoded contribution) plus signed `noise`, modulo 2^64."""
    assert vector.dtype == np.uint64 and vector.shape == noise.shape
    return vector + noise.astype(np.int64).view(np.uint64)


def signed(total: np.ndarray) -> np.ndarray:
    """A noised uint64 total read as signed integers (noise may take a count below zero)."""
    return total.view(np.int64)


def noised_vector(values: Sequence[np.ndarray], sums: Sequence[DpSum], mus: Sequence[float], members: int,
                  rng: np.random.Generator, colluders: int = 0) -> np.ndarray:
    """A member's contribution to one secure sum: its int64 values, group by group, each plus its
    Skellam share of that group's variance (`share_mu`), as the uint64 vector the sum masks."""
    parts = [np.asarray(v, dtype=np.int64) + draw_share(rng, share_mu(mu, members, colluders), s.entries)
             for v, s, mu in zip(values, sums, mus, strict=True)]
    return np.concatenate(parts).view(np.uint64)


def summed_quanta(x: np.ndarray, bound: float, value_bits: int) -> np.ndarray:
    """Σ round(x·2^f) per column with bound·2^f <= 2^value_bits, exactly: every rounded value is at
    most 2^value_bits, so float64 sums of fewer than 2^(52 - value_bits) rows stay whole (no int64
    copy of the rows). `x` is scaled in place."""
    assert x.shape[0] < 2 ** (52 - value_bits)
    x *= 2.0 ** fraction_bits(bound, value_bits)
    return np.rint(x, out=x).sum(axis=0).astype(np.int64)


def clip_l2(rows: np.ndarray, bound: float) -> np.ndarray:
    """Every row scaled down to L2 norm at most `bound` (a row's contribution to a vector sum)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, bound / np.maximum(norms, 1e-300))


def clip_entries(values: np.ndarray, low: np.ndarray | float, high: np.ndarray | float) -> np.ndarray:
    """Every entry clipped into [low, high] (per-entry bounds, e.g. a column's public bounds)."""
    return np.clip(values, low, high)


def noise_bound(mu: float, entries: int, tail: float = NOISE_TAIL) -> float:
    """t with P(any of `entries` Skellam(μ) entries has |noise| > t) <= tail. Bernstein: a centred
    Poisson difference of variance μ has log E e^{sX} <= μs²/(2(1 − s/3)), so
    P(|X| >= t) <= 2·exp(−t²/(2(μ + t/3))); solved for t with the tail split over the entries."""
    log_term = math.log(2.0 * entries / tail)
    return log_term / 3.0 + math.sqrt(log_term * log_term / 9.0 + 2.0 * log_term * mu)


def noise_bits(mu: float, entries: int, tail: float = NOISE_TAIL) -> int:
    """Bits the noise adds to a sum's signed range (sign included) at its high-probability bound."""
    return max(1, math.ceil(math.log2(noise_bound(mu, entries, tail) + 1))) + 1
