"""Exact fixed-point encodings of floats and counts for the secure sum (docs/security.md, secure sum).

The secure sum adds vectors of uint64 modulo 2^64. To add floats exactly, each value x becomes
the integer q = round(x * 2^frac_bits) (round half to even), taken modulo 2^(32*limbs) and split
into `limbs` 32-bit limbs, each stored in its own uint64 entry. Limb sums never carry out of a
uint64 entry as long as fewer than 2^32 parties add (each adds < 2^32 per entry), so the secure
sum's total holds the exact limb sums; `decode` propagates the carries, reduces modulo
2^(32*limbs) and reads the result as a signed integer.

Exactness: decode(sum of encode(x_i)) is the float64 nearest to  Σ_i round(x_i * 2^frac_bits) /
2^frac_bits, computed without intermediate rounding. So the only error against the true sum
Σ x_i is the rounding of each input to a multiple of 2^-frac_bits (at most n * 2^-(frac_bits+1)
for n inputs) plus the final rounding to float64 (half an ulp of the result).

Safety: the signed sum must stay inside (-2^(B-1), 2^(B-1)) with B = 32*limbs, otherwise it
wraps silently. `encode` therefore refuses, with a DataError naming the bound, any value that is
not finite or for which |x| * 2^frac_bits * n_parties >= 2^(B-1): if every party respects that
bound, no sum of n_parties encodings can wrap. Defaults (frac_bits=32, limbs=3) allow
|x| * n_parties < 2^63 ≈ 9.2e18 with a resolution of 2^-32 ≈ 2.3e-10 — enough for a site's sum
of squares. `encode_counts` does the same for non-negative integer counts with a declared
maximum: count_max * n_parties must be < 2^63.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedpeer.errors import DataError

LIMB_BITS = 32
_LIMB_MASK = np.uint64((1 << LIMB_BITS) - 1)
PARTIES_MAX = (1 << LIMB_BITS) - 1        # more parties could carry a limb sum out of its uint64
FRAC_BITS_MAX = 512                       # keeps 2^-frac_bits a normal float64
LIMBS_MAX = 32
COUNT_SUM_LIMIT = 1 << 63                 # summed counts must stay below this (exclusive)


def fraction_bits(bound: float, magnitude_bits: int) -> int:
    """Fraction bits for values bounded by `bound`: the largest b with bound * 2^b <= 2^magnitude_bits
    (a value scaled by them stays within magnitude_bits). ValueError unless the bound is positive
    and finite."""
    bound = float(bound)
    if not math.isfinite(bound) or bound <= 0:
        raise ValueError(f"a bound must be positive and finite, got {bound!r}")
    mantissa, exponent = math.frexp(bound)          # bound = mantissa * 2^exponent, mantissa in [0.5, 1)
    return int(magnitude_bits) - (exponent - 1 if mantissa == 0.5 else exponent)


def _check_parties(n_parties: int) -> int:
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) \
            or not 1 <= n_parties <= PARTIES_MAX:
        raise ValueError(f"n_parties must be an integer in [1, {PARTIES_MAX}], got {n_parties!r}")
    return int(n_parties)


def _carry(limbs: np.ndarray, add: np.ndarray) -> np.ndarray:
    """Add `add` (one uint64 per row) to the lowest limb and propagate carries up the row,
    in place; what carries out of the top limb is dropped (arithmetic modulo 2^(32*L)).
    No uint64 overflows: a limb holds < 2^64 - 2^33 (sum of < 2^32 limbs) and a carry < 2^32."""
    carry = add.astype(np.uint64)
    for i in range(limbs.shape[1]):
        s = limbs[:, i] + carry
        limbs[:, i] = s & _LIMB_MASK
        carry = s >> np.uint64(LIMB_BITS)
    return limbs


def _negate(limbs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Two's complement (modulo 2^(32*L)) of the selected rows of normalised limbs, in place."""
    limbs[rows] = _LIMB_MASK - limbs[rows]
    return _carry(limbs, rows)


def _limbs_to_float(limbs: np.ndarray) -> np.ndarray:
    """Non-negative normalised limbs -> the nearest float64 (correctly rounded).

    Rows below 2^63 go through int64 (one exact-then-rounded conversion); larger ones through
    Python integers, whose float() is correctly rounded too. Summing limbs as floats would round
    twice."""
    n_rows, n_limbs = limbs.shape
    low = limbs[:, 0].copy()
    small = np.ones(n_rows, dtype=bool)
    if n_limbs > 1:
        small = (limbs[:, 1] < np.uint64(1 << 31)) & np.all(limbs[:, 2:] == 0, axis=1)
        low |= limbs[:, 1] << np.uint64(LIMB_BITS)
    out = np.empty(n_rows, dtype=np.float64)
    out[small] = low[small].astype(np.int64).astype(np.float64)
    for row in np.flatnonzero(~small):
        out[row] = float(sum(int(v) << (LIMB_BITS * i) for i, v in enumerate(limbs[row])))
    return out


@dataclass(frozen=True)
class FixedPoint:
    """x -> round(x * 2^frac_bits) as `limbs` 32-bit limbs (one uint64 entry each, lowest first);
    an encoded vector holds len(x) * limbs entries, the limbs of x[0] first."""

    frac_bits: int = 32
    limbs: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.limbs <= LIMBS_MAX:
            raise ValueError(f"limbs must be in [1, {LIMBS_MAX}], got {self.limbs}")
        if not 0 <= self.frac_bits <= min(FRAC_BITS_MAX, LIMB_BITS * self.limbs - 2):
            raise ValueError(f"frac_bits must be in [0, {min(FRAC_BITS_MAX, LIMB_BITS * self.limbs - 2)}] "
                             f"for {self.limbs} limbs, got {self.frac_bits}")

    @property
    def bits(self) -> int:
        return LIMB_BITS * self.limbs

    def max_abs(self, n_parties: int) -> float:
        """Every |x| <= max_abs(n_parties) is accepted for a sum over n_parties (a multiple of
        2^-frac_bits, so rounding cannot push it over the bound)."""
        n = _check_parties(n_parties)
        steps = ((1 << (self.bits - 1)) - 1) // n        # largest |round(x * 2^f)| allowed
        as_float = float(steps)
        if int(as_float) > steps:                        # float() rounded up: step back one ulp
            as_float = float(np.nextafter(as_float, 0.0))
        return float(np.ldexp(as_float, -self.frac_bits))

    def encode(self, x: np.ndarray, n_parties: int) -> np.ndarray:
        """Flattened float vector -> uint64 vector of len(x) * limbs entries, or DataError."""
        n = _check_parties(n_parties)
        values = np.asarray(x, dtype=np.float64).ravel()
        if not np.isfinite(values).all():
            bad = int(np.flatnonzero(~np.isfinite(values))[0])
            raise DataError(f"fixed point: value {values[bad]} at index {bad} is not finite")
        q = np.rint(np.ldexp(values, self.frac_bits))     # exact: scaling by a power of two
        self._check_bound(values, q, n)
        magnitude = np.abs(q)
        limbs = np.empty((len(values), self.limbs), dtype=np.uint64)
        for i in range(self.limbs):
            # Exact in float64: q is an integer below 2^(B-1), peeling 32 low bits off it
            # leaves a float with fewer significant bits.
            low = np.fmod(magnitude, float(1 << LIMB_BITS))
            limbs[:, i] = low.astype(np.uint64)
            magnitude = (magnitude - low) / float(1 << LIMB_BITS)
        assert not magnitude.any(), "bound check let through a value wider than the limbs"
        return _negate(limbs, q < 0).ravel()

    def _check_bound(self, values: np.ndarray, q: np.ndarray, n: int) -> None:
        if len(values) == 0:
            return
        at = int(np.argmax(np.abs(values)))
        num, den = abs(float(values[at])).as_integer_ratio()
        limit = 1 << (self.bits - 1)
        # Exact rational test of |x| * 2^f * n < 2^(B-1), and of the rounded integer too
        # (rounding can add 1/2, which matters for few bits).
        if num * (1 << self.frac_bits) * n >= limit * den or int(abs(q[at])) * n >= limit:
            raise DataError(
                f"fixed point: |{values[at]}| at index {at} is too large for a secure sum over "
                f"{n} parties: |x| * 2^{self.frac_bits} * {n} must be < 2^{self.bits - 1}, "
                f"i.e. |x| < {self.max_abs(n):.6g} (use more limbs or fewer fraction bits)")

    def decode(self, total: np.ndarray) -> np.ndarray:
        """Sum of encodings (uint64, as the secure sum returns it) -> float64 vector."""
        total = np.asarray(total)
        if total.dtype != np.uint64 or total.ndim != 1 or len(total) % self.limbs:
            raise ValueError(f"expected a 1-D uint64 vector with a multiple of {self.limbs} entries, "
                             f"got {total.dtype} of shape {total.shape}")
        limbs = _carry(total.reshape(-1, self.limbs).copy(), np.zeros(len(total) // self.limbs, np.uint64))
        negative = (limbs[:, -1] >> np.uint64(LIMB_BITS - 1)).astype(bool)
        magnitude = _limbs_to_float(_negate(limbs, negative))
        return np.ldexp(np.where(negative, -magnitude, magnitude), -self.frac_bits)


def encode_counts(counts: np.ndarray, n_parties: int, count_max: int) -> np.ndarray:
    """Non-negative integer counts, each at most count_max -> uint64, refusing (DataError) unless
    count_max * n_parties < 2^63, so the summed counts fit a signed 64-bit integer too."""
    n = _check_parties(n_parties)
    values = np.asarray(counts)
    if values.dtype.kind not in "iub":
        raise DataError(f"counts must be integers, got dtype {values.dtype}")
    if isinstance(count_max, bool) or not isinstance(count_max, (int, np.integer)) or count_max < 0:
        raise ValueError(f"count_max must be a non-negative integer, got {count_max!r}")
    if int(count_max) * n >= COUNT_SUM_LIMIT:
        raise DataError(f"counts: count_max {count_max} * {n} parties must be < 2^63 "
                        f"(i.e. count_max <= {(COUNT_SUM_LIMIT - 1) // n})")
    flat = values.ravel()
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) > int(count_max)):
        at = int(np.argmax((flat < 0) | (flat > count_max)))
        raise DataError(f"counts: value {int(flat[at])} at index {at} is outside [0, {count_max}]")
    return flat.astype(np.uint64)


def decode_counts(total: np.ndarray) -> np.ndarray:
    """Sum of `encode_counts` vectors -> int64 (exact: the sum is below 2^63 by construction)."""
    total = np.asarray(total)
    if total.dtype != np.uint64:
        raise ValueError(f"expected uint64, got {total.dtype}")
    if (total >> np.uint64(63)).any():   # only if a party sent more than count_max
        raise DataError("count sum at or above 2^63: some party exceeded the declared count_max")
    return total.astype(np.int64)
