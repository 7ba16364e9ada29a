"""Column moments of a site's rows, for secure sums: [n, Σy, Σx per column, Σx² per column] and
the fixed-point encoding they travel in (32 fraction bits in three 64-bit limbs). `stats` sums
them first; BOFRF's clustered variant derives its bounds from them; xgboost's label statistics
use the same encoding.

The checks below are what honest members' totals always satisfy (each raises ValueError naming
the check in words; the kinds end the job everywhere with it, fedpeer/jobs/kind.py
`checked_total`). They are exact inequalities of real arithmetic, loosened by PLAUSIBLE_RTOL
(relative) and PLAUSIBLE_ATOL_PER_ROW (absolute, per row) for the fixed-point and float rounding
of honest sums. A member can still shift a total within them (bounded poisoning); it cannot
make a total the checks know to be impossible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedpeer.protocols.fixedpoint import FixedPoint, decode_counts

FIXED = FixedPoint(frac_bits=32, limbs=3)
PLAUSIBLE_RTOL = 1e-6               # relative slack of every plausibility check (a fraction)
PLAUSIBLE_ATOL_PER_ROW = 1e-6       # absolute slack per row (fixed point's 2^-32 steps, float rounding)
FLOAT_EPS_EDGE = 1e-15             # relative rounding of a histogram edge (mean ± half, a fraction)
COUNT_SUM_BITS = 63                 # a summed count at or above 2^63 passed some member's declared maximum


def local_moments(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.concatenate([[X.shape[0], float(y.sum())], X.sum(axis=0), (X * X).sum(axis=0)])


def whole_counts(total: np.ndarray) -> np.ndarray:
    """Summed `encode_counts` vectors -> int64; ValueError when a sum is at or above 2^63 (every
    honest member's counts are below its declared maximum, whose sum is below 2^63)."""
    total = np.asarray(total)
    if total.dtype != np.uint64 or (total >> np.uint64(COUNT_SUM_BITS)).any():
        raise ValueError("every summed count is below 2^63")
    return decode_counts(total)


def exact_sum(counts: np.ndarray, axis: int | tuple[int, ...] | None = None) -> object:
    """The sum of integer counts in Python integers: a poisoned total's entries near 2^63 or 2^64
    cannot wrap a check's sum back to an honest one, as numpy's int64 and uint64 sums do. For
    the small arrays the checks add up (histograms, confusion counts, cluster sizes). Returns a
    Python int (axis None) or an object array of them."""
    values = np.asarray(counts)
    assert values.dtype.kind in "iu", f"exact_sum of {values.dtype}"
    return values.astype(object).sum(axis=axis)


def check_declared(counts: np.ndarray, most: int) -> None:
    """ValueError unless every summed count is at most `most`: the members' declared maximum
    (each member's counts at most its count_max, so their sum at most members x count_max)."""
    if (np.asarray(counts) > most).any():
        raise ValueError("every summed count is within the members' declared maximum")


def slack(scale: np.ndarray | float, rows: float) -> np.ndarray | float:
    """The rounding an honest total of magnitude `scale` over `rows` rows may carry."""
    return PLAUSIBLE_RTOL * np.abs(scale) + PLAUSIBLE_ATOL_PER_ROW * (1.0 + abs(rows))


def is_whole(value: float, rows: float) -> bool:
    """A count sent as a fixed-point float: a whole number up to rounding."""
    return bool(np.isfinite(value) and abs(value - round(value)) <= slack(value, rows))


def check_columns(n: float, sums: np.ndarray, squares: np.ndarray) -> None:
    """ValueError unless per-column Σx and Σx² over n rows can be honest: Σx² >= 0 and
    (Σx)² <= n Σx² (Cauchy–Schwarz)."""
    if not (np.isfinite(sums).all() and np.isfinite(squares).all()):
        raise ValueError("every column sum is finite")
    if (squares < -slack(0.0, n)).any() or (sums * sums > n * (squares + slack(squares, n))).any():
        raise ValueError("every column's (Σx)² is at most rows × Σx²")


def check_moments(totals: np.ndarray, d: int) -> tuple[int, int]:
    """ValueError unless summed `local_moments` can be honest: the rows and the positives whole,
    positives between 0 and the rows, `check_columns`. Returns (rows, positives)."""
    n, n_pos = float(totals[0]), float(totals[1])
    if not is_whole(n, 0.0) or n < 0:
        raise ValueError("the row count is a whole number, not negative")
    if not is_whole(n_pos, n) or not -0.5 < n_pos < n + 0.5:
        raise ValueError("the positives are a whole number between 0 and the rows")
    check_columns(n, totals[2:2 + d], totals[2 + d:2 + 2 * d])
    return round(n), round(n_pos)


def check_centred(n: int, sums: np.ndarray, squares: np.ndarray, centred: np.ndarray) -> None:
    """ValueError unless every column's summed Σ(x - mean)², mean = Σx / n, equals its
    Σx² - (Σx)²/n (up to rounding)."""
    if not np.isfinite(centred).all():
        raise ValueError("every column's Σ(x - mean)² is finite")
    expected = squares - sums * sums / n
    if (np.abs(centred - expected) > slack(squares, n)).any():
        raise ValueError("every column's Σ(x - mean)² equals Σx² - (Σx)²/rows")


def check_spread(n: int, sums: np.ndarray, squares: np.ndarray, centred: np.ndarray, edges: np.ndarray,
                 counts: np.ndarray) -> None:
    """ValueError unless the second `stats` sum fits the first: every column's Σ(x - mean)²
    equals its Σx² - (Σx)²/n; its histogram (below, bins, above) holds every row once; and no
    more rows lie beyond the outer edges (at distance h from the mean) than Σ(x - mean)² / h²
    allows (Chebyshev)."""
    check_centred(n, sums, squares, centred)
    if (counts < 0).any() or (counts > n).any() or (exact_sum(counts, axis=1) != n).any():
        raise ValueError("every column's histogram holds each row once")
    half = (edges[:, -1] - edges[:, 0]) / 2
    reach = half * (1 - PLAUSIBLE_RTOL) - FLOAT_EPS_EDGE * np.abs(edges).max(axis=1)   # the edges' own rounding
    spread = np.maximum(centred, 0.0) + slack(squares, n)
    tails = counts[:, 0] + counts[:, -1]
    beyond = np.where(reach > 0, spread / np.maximum(reach, np.finfo(np.float64).tiny) ** 2, np.inf)
    if (tails > np.floor(beyond * (1 + PLAUSIBLE_RTOL))).any():
        raise ValueError("every column's histogram tails hold no more rows than its spread allows")


# -- what stats reports of every column (horizontal and vertical sites alike) ------------------

SPREAD_SIGMAS = 3.0
STD_KIND = "sample standard deviation (denominator n - 1)"


def bin_edges(mean: np.ndarray, std: np.ndarray, bins: int) -> np.ndarray:
    """(columns, bins + 1) edges over mean ± 3 std; a constant column gets mean ± 0.5."""
    half = np.where(std > 0, SPREAD_SIGMAS * std, 0.5)
    steps = np.linspace(-1.0, 1.0, bins + 1)
    return mean[:, None] + half[:, None] * steps[None, :]


def local_histograms(X: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(columns, bins + 2) counts: below the first edge, each bin (right edge open, last closed),
    above; NaN in none. np.histogram's own counting (sort, then find each edge: `left` for all but
    the last, `right` for the last), one sorted column at a time (a copy of one column, not of the
    site's matrix; a third faster than np.histogram on 10,000 x 20 rows)."""
    counts = np.empty((X.shape[1], edges.shape[1] + 1), dtype=np.int64)
    for j in range(X.shape[1]):
        column, e = np.sort(X[:, j]), edges[j]          # NaN last, after +inf
        below = column.searchsorted(e[:-1], "left")              # rows < each edge but the last
        last, finite = column.searchsorted([e[-1], np.inf], "right")
        counts[j, 0] = below[0]
        counts[j, 1:-2] = np.diff(below)
        counts[j, -2] = last - below[-1]
        counts[j, -1] = finite - last
    return counts


def column_summaries(columns: Sequence[str], mean: np.ndarray, std: np.ndarray, edges: np.ndarray,
                     counts: np.ndarray) -> dict:
    """The result's per-column part: mean, std (and what kind), every histogram."""
    return {
        "mean": {c: float(v) for c, v in zip(columns, mean)},
        "std": {c: float(v) for c, v in zip(columns, std)},
        "std_kind": STD_KIND,
        "histograms": {c: {"edges": [float(e) for e in edges[j]], "below": int(counts[j, 0]),
                           "counts": [int(v) for v in counts[j, 1:-1]], "above": int(counts[j, -1])}
                       for j, c in enumerate(columns)},
    }
