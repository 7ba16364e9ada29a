"""Fixed-point encodings for the secure sum: exact sums, and refusal of anything that could wrap."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.errors import DataError
from fedpeer.protocols.fixedpoint import (
    PARTIES_MAX,
    FixedPoint,
    decode_counts,
    encode_counts,
)

FORMATS = [FixedPoint(), FixedPoint(32, 3), FixedPoint(16, 2), FixedPoint(0, 1), FixedPoint(20, 1),
           FixedPoint(60, 4), FixedPoint(0, 2)]


def wire_sum(encoded: list[np.ndarray]) -> np.ndarray:
    """What the secure sum returns: entry-wise sum modulo 2^64."""
    total = np.zeros_like(encoded[0])
    for e in encoded:
        total = total + e          # uint64 arrays wrap silently, like the ring
    return total


def quantized_sum(fp: FixedPoint, rows: list[np.ndarray]) -> list[float]:
    """The documented result: the float nearest to Σ round(x * 2^f) / 2^f, computed exactly."""
    steps = [sum(int(np.rint(np.ldexp(r[i], fp.frac_bits))) for r in rows) for i in range(len(rows[0]))]
    return [float(Fraction(s, 2**fp.frac_bits)) for s in steps]


@st.composite
def parties(draw: st.DrawFn) -> tuple[FixedPoint, list[np.ndarray]]:
    fp = draw(st.sampled_from(FORMATS))
    n = draw(st.integers(1, 12))
    length = draw(st.integers(1, 8))
    bound = fp.max_abs(n)
    value = st.one_of(st.floats(-bound, bound, allow_nan=False, allow_infinity=False),
                      st.sampled_from([bound, -bound, 0.0, -0.0, 2.0**-fp.frac_bits, 0.5, -0.5]))
    rows = [np.array(draw(st.lists(value, min_size=length, max_size=length))) for _ in range(n)]
    return fp, rows


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parties())
def test_sum_of_encodings_decodes_to_the_sum(case: tuple[FixedPoint, list[np.ndarray]]) -> None:
    fp, rows = case
    n = len(rows)
    decoded = fp.decode(wire_sum([fp.encode(r, n) for r in rows]))
    assert decoded.tolist() == quantized_sum(fp, rows)           # exact, as documented
    for i, got in enumerate(decoded):                           # and close to the true sum
        true = sum(Fraction(float(r[i])) for r in rows)
        assert abs(Fraction(got) - true) <= n * Fraction(1, 2**(fp.frac_bits + 1)) + Fraction(math.ulp(got)) / 2


def test_many_parties_and_negative_values() -> None:
    fp = FixedPoint()
    rng = np.random.default_rng(1)
    rows = [rng.normal(0, 1e6, 50) for _ in range(200)]
    decoded = fp.decode(wire_sum([fp.encode(r, 200) for r in rows]))
    assert decoded.tolist() == quantized_sum(fp, rows)
    assert np.allclose(decoded, np.sum(rows, axis=0), rtol=0, atol=200 * 2.0**-33 + 1e-6)
    assert (decoded < 0).any() and (decoded > 0).any()


@pytest.mark.parametrize("fp", FORMATS, ids=repr)
def test_extreme_allowed_values_sum_to_the_edge(fp: FixedPoint) -> None:
    for n in (1, 2, 7):
        top = fp.max_abs(n)
        for sign in (1.0, -1.0):
            rows = [np.array([sign * top, 0.0])] * n
            decoded = fp.decode(wire_sum([fp.encode(r, n) for r in rows]))
            assert decoded.tolist() == quantized_sum(fp, rows)      # in particular, no wrap-around
            assert np.sign(decoded[0]) == sign and decoded[1] == 0.0


@pytest.mark.parametrize("fp", FORMATS, ids=repr)
def test_values_that_could_overflow_are_refused(fp: FixedPoint) -> None:
    limit = Fraction(2**(fp.bits - 1))
    for n in (1, 3, 1000):
        edge = 2.0**(fp.bits - 1 - fp.frac_bits) / n        # |x| * 2^f * n == 2^(B-1), up to rounding
        candidates = [edge, np.nextafter(edge, np.inf), np.nextafter(np.nextafter(edge, np.inf), np.inf), edge * 4]
        bad = [x for x in candidates if Fraction(x) * 2**fp.frac_bits * n >= limit]
        assert len(bad) >= 2
        for x in bad + [-x for x in bad]:
            with pytest.raises(DataError, match=r"must be < 2\^"):
                fp.encode(np.array([0.0, x]), n)
        fp.encode(np.array([fp.max_abs(n), -fp.max_abs(n)]), n)     # the documented maximum passes


def test_both_the_stated_bound_and_the_rounded_value_are_checked() -> None:
    fp = FixedPoint(frac_bits=0, limbs=1)                   # 32 bits: |sum| < 2^31
    with pytest.raises(DataError):      # below the bound, but rounds up to 2^31, which would wrap
        fp.encode(np.array([2**31 - 0.3]), 1)
    with pytest.raises(DataError):      # rounds down to a safe value, but |x| * 7 >= 2^31 as stated
        fp.encode(np.array([306_783_378.3]), 7)
    fp.encode(np.array([306_783_378.2]), 7)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(bad: float) -> None:
    with pytest.raises(DataError, match="not finite"):
        FixedPoint().encode(np.array([1.0, bad]), 2)


def test_rounding_is_to_the_nearest_step() -> None:
    fp = FixedPoint(frac_bits=2, limbs=1)                   # steps of 0.25
    assert fp.decode(fp.encode(np.array([0.1, 0.2, -0.2, 0.375, -0.625]), 1)).tolist() == [0.0, 0.25, -0.25, 0.5, -0.5]


def test_decode_works_on_any_wrapped_sum() -> None:
    """The ring adds masks modulo 2^64; after they cancel, decode sees only the limb sums."""
    fp = FixedPoint()
    rng = np.random.default_rng(2)
    rows = [np.array([-3.5, 1e12, -1e-9]), np.array([1.25, -2e12, 4e-9])]
    masks = rng.integers(0, 2**64, size=(2, 9), dtype=np.uint64, endpoint=False)
    masked = [fp.encode(rows[0], 2) + masks[0], fp.encode(rows[1], 2) + masks[1] - masks[0] - masks[1]]
    assert fp.decode(wire_sum(masked)).tolist() == quantized_sum(fp, rows)


def test_bad_formats_and_arguments() -> None:
    for frac_bits, limbs in ((-1, 3), (95, 3), (31, 1), (0, 0), (0, 33)):
        with pytest.raises(ValueError):
            FixedPoint(frac_bits, limbs)
    for n in (0, -1, PARTIES_MAX + 1, True, 2.0):
        with pytest.raises(ValueError):
            FixedPoint().encode(np.array([1.0]), n)
    with pytest.raises(ValueError):
        FixedPoint().decode(np.zeros(4, dtype=np.uint64))     # not a multiple of 3 limbs
    with pytest.raises(ValueError):
        FixedPoint().decode(np.zeros(3, dtype=np.int64))


# -- counts ------------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, derandomize=True)
@given(n=st.integers(1, 50), data=st.data())
def test_counts_sum_exactly(n: int, data: st.DataObject) -> None:
    count_max = data.draw(st.integers(0, (2**63 - 1) // n))
    rows = [np.array(data.draw(st.lists(st.integers(0, count_max), min_size=3, max_size=3)), dtype=np.uint64)
            for _ in range(n)]
    total = decode_counts(wire_sum([encode_counts(r, n, count_max) for r in rows]))
    assert total.tolist() == [sum(int(r[i]) for r in rows) for i in range(3)]


def test_counts_refused_when_the_sum_could_overflow() -> None:
    with pytest.raises(DataError, match=r"< 2\^63"):
        encode_counts(np.array([1, 2]), 4, 2**61)                # 4 * 2^61 == 2^63
    encode_counts(np.array([1, 2]), 4, 2**61 - 1)
    with pytest.raises(DataError, match="outside"):
        encode_counts(np.array([1, 11]), 4, 10)                  # above the declared maximum
    with pytest.raises(DataError, match="outside"):
        encode_counts(np.array([-1, 2]), 4, 10)
    with pytest.raises(DataError, match="integers"):
        encode_counts(np.array([1.0, 2.0]), 4, 10)
    with pytest.raises(DataError, match="exceeded"):
        decode_counts(np.array([2**63], dtype=np.uint64))
