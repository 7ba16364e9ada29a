"""Federated cut points for histogram-mode XGBoost: a quantile sketch in which only
federation-wide counts travel (docs/algorithms.md, "Lossless histogram federated XGBoost";
the bisection of FATE's homo-SecureBoost quantile sketch) — pure functions on arrays.

Why: every site must bin its features with the *same* cut points, or the sum of the sites'
histograms is not the histogram of the pooled rows. A site's values never leave it; what travels
is, per step, ONE vector of counts "rows with x_f <= t" for every feature f and every candidate
threshold t, which the job secure-sums. Every member runs the same step machine on the same sums,
so every member ends with identical cut points by construction.

The step machine (the job only moves its inputs and outputs):

    sk = sketch_start(n_features, max_bin)
    while not sk.done:
        keys = sk.request()                          # uint32 (F, Q * (arity - 1)), identical at every member
        mine = site_counts(prepared_X, keys)         # int64, the same shape: this site's counts
        sk = sketch_advance(sk, secure_sum(mine))    # the federation's counts
    cuts = sketch_cuts(sk)

Thresholds are float32 values written as order-preserving uint32 *keys* (`float_keys`): a search
over the 2^32 keys needs no knowledge of any feature's range. Step 0 asks for the non-missing
counts n_f (every threshold +inf); then Q = max_bin - 1 quantiles per feature are searched at
once. Quantile q (1 <= q <= Q) targets rank r_q = ceil(q * n_f / max_bin) and converges to the
smallest float32 value t with #{x_f <= t} >= r_q — the r_q-th smallest pooled value, exactly:
tolerance zero in rank, zero in value. Each step cuts every quantile's interval into `arity`
parts (A - 1 thresholds each; `sketch_arity`: 2 to SKETCH_ARITY_MAX, the most that keeps a
step's F * Q * (A - 1) counts within SKETCH_ENTRIES_MAX) and keeps the part that holds the rank.
All intervals have the same width, so all converge together: `sketch_steps(F, max_bin)` secure
sums whatever the data — 12 of 89,250 counts for 50 features at max_bin 256 (8 parts a step),
where halving took 33 sums of 12,750. The cut points do not depend on the arity: each is the
one smallest key with enough rows below it.

What the sums reveal: per feature, up to max_bin - 1 pooled quantiles (the model's split
thresholds reveal a subset of them anyway), and the federation-wide count of rows at or below
every threshold asked — arity - 1 per quantile per sum, all inside the interval that closes in
on that quantile: 77 per quantile at 8 parts (11 sums), where halving asked 32. Counts over
every site together, never one site's.

Binning (`bin_matrix`): a feature with cuts c_1 < .. < c_m puts x in bin #{c_i <= x} in [0, m],
so "bin < k" is exactly xgboost's "x < split_condition" with split_condition = c_k (float32
compare, as xgboost compares). Missing values (NaN) go to the feature's own slot `max_bin`, so a
histogram has max_bin + 1 slots per feature; the split finder learns their default direction.
-0.0 is read as +0.0 (they compare equal). A cut equal to a feature's minimum (nothing below it)
is dropped: it can never split.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedpeer.errors import DataError

__all__ = [
    "MAX_BIN_MAX",
    "SKETCH_ARITY_MAX",
    "Cuts",
    "Sketch",
    "bin_matrix",
    "float_keys",
    "keys_to_float",
    "prepare_site",
    "site_counts",
    "sketch_advance",
    "sketch_arity",
    "sketch_cuts",
    "sketch_start",
    "sketch_steps",
]

MAX_BIN_MAX = 65535               # bins and the missing slot must fit a uint16
FEATURES_MAX = 1_000_000
KEY_MISSING = np.uint32(0xFFFFFFFF)   # NaN: above every real key, so never counted as <= t
KEY_POS_INF = np.uint32(0xFF800000)   # float_keys(+inf)
KEY_NEG_INF = np.uint32(0x007FFFFF)   # float_keys(-inf)
SKETCH_ARITY_MAX = 16            # parts per step: 16 -> 9 sums, 8 -> 12, 2 (halving) -> 33
SKETCH_ENTRIES_MAX = 1 << 17      # counts in one step's sum (1 MiB of uint64 per member) before the arity shrinks
_SIGN = np.uint32(0x80000000)


def float_keys(values: Any) -> np.ndarray:
    """float32 values -> uint32 keys with the same order (-0.0 as +0.0; NaN -> KEY_MISSING)."""
    v = np.asarray(values, dtype=np.float32) + np.float32(0.0)      # -0.0 + 0.0 is +0.0
    bits = v.view(np.uint32)
    keys = np.where(bits & _SIGN, ~bits, bits | _SIGN).astype(np.uint32)
    keys[np.isnan(v)] = KEY_MISSING
    return keys


def keys_to_float(keys: Any) -> np.ndarray:
    """Inverse of `float_keys` for keys of real values: uint32 -> float32."""
    k = np.asarray(keys, dtype=np.uint32)
    return np.where(k & _SIGN, k ^ _SIGN, ~k).astype(np.uint32).view(np.float32)


def _features_f32(X: Any, n_features: int | None = None) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2 or X.dtype.kind not in "biuf":
        raise DataError(f"X must be a numeric (rows, features) array, got {X.dtype} {X.shape}")
    if n_features is not None and X.shape[1] != n_features:
        raise DataError(f"X has {X.shape[1]} features, the cuts {n_features}")
    return X.astype(np.float32)     # xgboost's own precision: it compares float32 values


def _combined(keys: np.ndarray) -> np.ndarray:
    """(rows, F) uint32 keys -> uint64 (feature << 32 | key): one sorted array serves all features."""
    feature = np.arange(keys.shape[1], dtype=np.uint64) << np.uint64(32)
    return keys.astype(np.uint64) | feature


def prepare_site(X: Any) -> np.ndarray:
    """A site's matrix -> its sorted combined keys (uint64, rows * F), computed once per job."""
    return np.sort(_combined(float_keys(_features_f32(X))), axis=None)


def site_counts(prepared: np.ndarray, keys: Any) -> np.ndarray:
    """This site's #{x_f <= key[f, q]} for every feature f and threshold q: int64 (F, Q).
    Vectorised: two searchsorted calls over the site's sorted combined keys."""
    keys = np.asarray(keys, dtype=np.uint32)
    if keys.ndim != 2:
        raise ValueError(f"keys must be (features, thresholds), got shape {keys.shape}")
    feature = np.arange(keys.shape[0], dtype=np.uint64)[:, None] << np.uint64(32)
    start = np.searchsorted(prepared, feature, side="left")
    return (np.searchsorted(prepared, keys.astype(np.uint64) | feature, side="right") - start).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Sketch:
    """Bisection state, identical at every member. Before the first sum `present` is None."""

    max_bin: int
    n_features: int
    step: int
    arity: int                     # parts each interval is cut into per step (sketch_arity)
    rows_max: int | None           # the federation's training rows, if known: a bound on step 0's counts
    present: np.ndarray | None     # int64 (F,): non-missing rows per feature, federation-wide
    lo: np.ndarray                 # int64 (F, Q): #{x <= lo} < rank (lo = KEY_NEG_INF - 1: nothing)
    hi: np.ndarray                 # int64 (F, Q): #{x <= hi} >= rank
    below: np.ndarray              # int64 (F, Q): #{x <= lo}, i.e. rows strictly below the cut

    @property
    def done(self) -> bool:
        """Every interval is down to one key (hi - lo <= 1) after sketch_steps sums, whatever the
        counts: the number of sums is public."""
        return self.present is not None and self.step >= sketch_steps(self.n_features, self.max_bin)

    def request(self) -> np.ndarray:
        """The thresholds whose counts the next sum must carry: uint32 keys (F, Q) in step 0,
        then (F, Q * (arity - 1)): quantile q's thresholds at columns q * (arity - 1) ..."""
        if self.done:
            raise ValueError("the sketch is done: take sketch_cuts")
        if self.present is None:
            return np.full(self.lo.shape, KEY_POS_INF, dtype=np.uint32)
        return self._thresholds().reshape(self.n_features, -1).astype(np.uint32)

    def _thresholds(self) -> np.ndarray:
        """int64 (F, Q, arity - 1): lo + (hi - lo) * j // arity, j = 1 .. arity - 1, ascending."""
        j = np.arange(1, self.arity, dtype=np.int64)
        return self.lo[..., None] + (self.hi - self.lo)[..., None] * j // self.arity

    def ranks(self) -> np.ndarray:
        """Target rank of each quantile: ceil(q * n_f / max_bin), q = 1..max_bin-1; int64 (F, Q)."""
        assert self.present is not None
        q = np.arange(1, self.max_bin, dtype=np.int64)
        return (q[None, :] * self.present[:, None] + self.max_bin - 1) // self.max_bin


def sketch_arity(n_features: int, max_bin: int) -> int:
    """Parts per step: the largest power of two up to SKETCH_ARITY_MAX whose step carries at most
    SKETCH_ENTRIES_MAX counts (at least 2: halving)."""
    per = int(n_features) * (int(max_bin) - 1)
    arity = 2
    while 2 * arity <= SKETCH_ARITY_MAX and per * (2 * arity - 1) <= SKETCH_ENTRIES_MAX:
        arity *= 2
    return arity


def sketch_steps(n_features: int, max_bin: int) -> int:
    """The secure sums the sketch takes: one for the counts, then one per cut of the key range."""
    width, arity, steps = int(KEY_POS_INF) - int(KEY_NEG_INF) + 1, sketch_arity(n_features, max_bin), 1
    while width > 1:
        width, steps = -(-width // arity), steps + 1
    return steps


def sketch_start(n_features: int, max_bin: int = 256, rows_max: int | None = None) -> Sketch:
    """A sketch's first state. `rows_max`: the federation's training rows when the job knows them
    (histogram XGBoost: from the label sum) — no feature can have more non-missing rows."""
    if isinstance(max_bin, bool) or not isinstance(max_bin, (int, np.integer)) or not 2 <= max_bin <= MAX_BIN_MAX:
        raise ValueError(f"max_bin must be an integer in [2, {MAX_BIN_MAX}], got {max_bin!r}")
    if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) \
            or not 1 <= n_features <= FEATURES_MAX:
        raise ValueError(f"n_features must be an integer in [1, {FEATURES_MAX}], got {n_features!r}")
    shape = (int(n_features), int(max_bin) - 1)
    return Sketch(max_bin=int(max_bin), n_features=int(n_features), step=0,
                  arity=sketch_arity(int(n_features), int(max_bin)), rows_max=rows_max, present=None,
                  lo=np.full(shape, int(KEY_NEG_INF) - 1, dtype=np.int64),
                  hi=np.full(shape, int(KEY_POS_INF), dtype=np.int64), below=np.zeros(shape, dtype=np.int64))


def sketch_advance(sketch: Sketch, summed_counts: Any) -> Sketch:
    """One step: the federation's counts for `sketch.request()` -> the next state. ValueError if
    the counts cannot be sums of honest counts (wrong shape, negative; in step 0 not the same n_f
    per feature, or above `rows_max`; later above n_f, falling as the threshold rises, or below
    the count an earlier step gave the interval's lower end)."""
    counts = np.asarray(summed_counts)
    want = sketch.lo.shape if sketch.present is None else (sketch.n_features, sketch.lo.shape[1] * (sketch.arity - 1))
    if counts.shape != want or counts.dtype.kind not in "iu":
        raise ValueError(f"summed counts must be integers of shape {want}, got {counts.dtype} {counts.shape}")
    counts = counts.astype(np.int64)
    if (counts < 0).any():
        raise ValueError("summed counts hold a negative count")
    if sketch.present is None:
        if (counts != counts[:, :1]).any():
            raise ValueError("step 0 counts differ between thresholds of one feature")
        if sketch.rows_max is not None and (counts[:, 0] > sketch.rows_max).any():
            raise ValueError("step 0 counts more non-missing rows than the federation's training rows")
        return replace(sketch, step=1, present=counts[:, 0].copy())
    if (counts > sketch.present[:, None]).any():
        raise ValueError("summed counts exceed the feature's non-missing rows")
    counts = counts.reshape(sketch.lo.shape + (sketch.arity - 1,))
    if (np.diff(counts, axis=-1) < 0).any() or (counts[..., 0] < sketch.below).any():
        raise ValueError("summed counts fall as the threshold rises")
    t = sketch._thresholds()
    # the first part whose upper end holds the rank: thresholds below it have too few rows
    short = (counts < sketch.ranks()[..., None]).sum(axis=-1)           # 0 .. arity - 1
    last = sketch.arity - 1
    upper = np.take_along_axis(t, np.minimum(short, last - 1)[..., None], -1)[..., 0]
    lower = np.take_along_axis(t, np.maximum(short - 1, 0)[..., None], -1)[..., 0]
    lower_count = np.take_along_axis(counts, np.maximum(short - 1, 0)[..., None], -1)[..., 0]
    return replace(sketch, step=sketch.step + 1,
                   lo=np.where(short == 0, sketch.lo, lower),
                   hi=np.where(short == last, sketch.hi, upper),
                   below=np.where(short == 0, sketch.below, lower_count))


@dataclass(frozen=True, eq=False)
class Cuts:
    """Cut points of every feature: values[ptr[f]:ptr[f+1]] ascending float32 (xgboost's
    HistogramCuts layout). Bins 0..max_bin-1 hold values, slot max_bin the missing ones."""

    values: np.ndarray        # float32 (total cuts,)
    ptr: np.ndarray           # int64 (F + 1,)
    max_bin: int

    @property
    def n_features(self) -> int:
        return len(self.ptr) - 1

    @property
    def n_slots(self) -> int:
        return self.max_bin + 1

    @property
    def missing_bin(self) -> int:
        return self.max_bin

    def counts(self) -> np.ndarray:
        return np.diff(self.ptr)


def sketch_cuts(sketch: Sketch) -> Cuts:
    """The final cut points: per feature the distinct located quantiles with rows below them."""
    if not sketch.done:
        raise ValueError(f"the sketch is not done (step {sketch.step} of "
                         f"{sketch_steps(sketch.n_features, sketch.max_bin)})")
    useful = (sketch.ranks() >= 1) & (sketch.below > 0)      # a cut with nothing below never splits
    feature = np.broadcast_to(np.arange(sketch.n_features, dtype=np.int64)[:, None], sketch.hi.shape)
    pairs = np.unique(feature[useful] << 32 | sketch.hi[useful])   # sorted by feature, then key; distinct
    per_feature = np.bincount(pairs >> 32, minlength=sketch.n_features)
    ptr = np.concatenate(([0], np.cumsum(per_feature))).astype(np.int64)
    values = keys_to_float((pairs & 0xFFFFFFFF).astype(np.uint32))
    return Cuts(values=values, ptr=ptr, max_bin=sketch.max_bin)


def bin_matrix(X: Any, cuts: Cuts, column_major: bool = True) -> np.ndarray:
    """A site's matrix -> bin indices (rows, F): uint8 when max_bin <= 255, else uint16. Bin
    #{cuts <= x} for a value, `cuts.missing_bin` for NaN. Vectorised: one searchsorted.
    Column-major for readers of one feature at a time (the tree's histograms), else row-major
    (histogram XGBoost gathers a node's rows whole)."""
    keys = float_keys(_features_f32(X, cuts.n_features))
    feature_of_cut = np.repeat(np.arange(cuts.n_features, dtype=np.uint64), cuts.counts())
    cut_keys = float_keys(cuts.values).astype(np.uint64) | (feature_of_cut << np.uint64(32))   # ascending
    bins = np.searchsorted(cut_keys, _combined(keys), side="right") - cuts.ptr[:-1][None, :]
    bins[keys == KEY_MISSING] = cuts.missing_bin
    bins = bins.astype(np.uint8 if cuts.max_bin <= 255 else np.uint16)
    return np.asfortranarray(bins) if column_major else bins
