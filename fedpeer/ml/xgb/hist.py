"""A site's part of one level of histogram-mode XGBoost (docs/algorithms.md, "Exact histogram
mode, the formulas"; Chen & Guestrin 2016 §2-3) — pure functions on arrays: gradients of the
objective, their fixed-point encoding, the (node, feature, bin) histograms of a level, and the
uint64 vector that goes through the secure sum.

Fixed point, at the row (why): every row's g and h become integers round(g * 2^grad_bits) and
round(h * 2^hess_bits) *before* any sum, with the bits derived from bounds the job declares
(`grad_abs_max`, `hess_max`) so that |row value| <= 2^ROW_Q_BITS. Histograms are then sums of
integers: exact, in any order, on any partition of the rows — so the sum of the sites' histograms
is bit for bit the histogram of the pooled rows, and "parent - built child = sibling" is exact
too. A site whose g or h leaves its declared bound raises DataError naming the bound: nothing
is clipped, nothing wraps. A site's cell sums are int64 and stay below 2^52: at most
SITE_ROWS_MAX = 2^24 rows per site (2^24 * 2^28 = 2^52), so their float64 images in the split
search are exact too.

Histogram layout: int64 (nodes, F, S, 3) with S = max_bin + 1 slots per feature (bins
0..max_bin-1, slot max_bin = missing values) and channels (Σ g_q, Σ h_q, rows). The secure sum
carries it raveled (C order). `encode_histograms` gives one uint64 per channel (two's complement;
the sum is exact while every site's |cell| * n_parties < 2^63, checked): a level with n built
nodes sends n * F * (max_bin + 1) * 3 * 8 bytes. Once the federation's training rows R are known
(from the label sums), `Packing` packs a cell's channels into fewer uint64 lanes, each channel at
the width its bound needs: rows < 2^b with b = R.bit_length(), |Σ g_q| < 2^(b+28), Σ h_q <
2^(b+28). A lane holds fields side by side, the lowest unsigned; the secure sum adds lanes mod
2^64, and since every honest field total fits its width no carry crosses into the next field, so
the total's fields are the fields' totals. Binary and multi-class: lane 1 = Σ g, lane 2 = Σ h and
rows while 2b + 28 <= 64 (R < 2^18), else three lanes. Squared error: every row's h_q is exactly
2^hess_bits, so Σ h_q is rows * 2^hess_bits and only rows travel: one lane (Σ g, rows) while
2b + 29 <= 64 (R < 2^17), else two. Only slots that can hold rows travel: a feature with m cut
points has m + 1 bins (small data: far fewer than max_bin), plus its missing-value slot. Any
lane value decodes to some fields in range: a member's garbage is checked like any total
(`check_plausible`, `check_root`, and children = parent in histtree).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.ml.xgb.kernels import PACK_BAD_COUNT, PACK_BAD_HESSIAN, PACK_DROPPED_ROWS, hist_kernel, pack_kernel
from fedpeer.protocols.fixedpoint import fraction_bits

__all__ = [
    "CHANNELS",
    "FeatureBlocks",
    "Packing",
    "ROW_Q_BITS",
    "SITE_ROWS_MAX",
    "check_plausible",
    "check_root",
    "decode_histograms",
    "encode_histograms",
    "gradients",
    "level_histograms",
    "predictions",
    "quantize_gradients",
    "scale_bits",
]

ROW_Q_BITS = 28            # |quantised g| and h of one row <= 2^28
SITE_ROWS_MAX = 1 << 24    # so a site's cell sum <= 2^52: float64 sums of them are exact
CHANNELS = 3               # Σ g, Σ h, rows
HESS_FLOOR = 1e-16         # xgboost's kRtEps-like floor on logistic/softmax hessians
_INT_SUM_LIMIT = 1 << 63   # a secure-summed int64 cell must stay below this in magnitude


def scale_bits(bound: float) -> int:
    """Fraction bits for values bounded by `bound`: the largest b with bound * 2^b <= 2^ROW_Q_BITS."""
    try:
        return fraction_bits(bound, ROW_Q_BITS)
    except ValueError:
        raise ValueError(f"a gradient bound must be positive and finite, got {bound!r}") from None


def gradients(objective: str, margins: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and second derivatives of the loss at the current margins (xgboost's objectives):
    binary:logistic g = p - y, h = max(p(1-p), 1e-16); multi:softprob g_k = p_k - [y = k],
    h_k = max(2 p_k (1 - p_k), 1e-16); reg:squarederror g = margin - y, h = 1.
    margins float64 (rows, K); returns float64 (rows, K) each."""
    m = np.asarray(margins, dtype=np.float64)
    if objective == "binary:logistic":
        p = predictions(objective, m)[:, None]
        return p - y[:, None], np.maximum(p * (1.0 - p), HESS_FLOOR)
    if objective == "multi:softprob":
        p = predictions(objective, m)
        onehot = (np.asarray(y, dtype=np.int64)[:, None] == np.arange(m.shape[1])[None, :])
        return p - onehot, np.maximum(2.0 * p * (1.0 - p), HESS_FLOOR)
    if objective == "reg:squarederror":
        return m - np.asarray(y, dtype=np.float64)[:, None], np.ones_like(m)
    raise ValueError(f"no gradients for objective {objective!r}")


def predictions(objective: str, margins: np.ndarray) -> np.ndarray:
    """What the model predicts at these margins (float64 (rows, K)), as xgboost's predict does:
    binary:logistic P(positive) (rows,), multi:softprob every class's P (rows, K), reg:squarederror
    the value (rows,)."""
    m = np.asarray(margins, dtype=np.float64)
    if objective == "binary:logistic":
        return 1.0 / (1.0 + np.exp(-m[:, 0]))
    if objective == "multi:softprob":
        e = np.exp(m - m.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if objective == "reg:squarederror":
        return m[:, 0].copy()
    raise ValueError(f"no predictions for objective {objective!r}")


def _check_bound(values: np.ndarray, low: float, high: float, name: str, bound: float) -> None:
    bad = ~np.isfinite(values) | (values < low) | (values > high)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"histogram mode: {name} {float(values[i])!r} of row {i} is outside the declared bound "
                        f"{'grad_abs_max' if name == 'gradient' else 'hess_max'}={bound!r} (the job's fixed-point "
                        "scale; raise the bound for every member, or check the labels)")


def quantize_gradients(g: Any, h: Any, grad_abs_max: float, hess_max: float) -> tuple[np.ndarray, np.ndarray]:
    """One tree's g, h (rows,) -> int64 round(g * 2^scale_bits(grad_abs_max)), round(h * 2^..).
    DataError naming the bound if some |g| > grad_abs_max or h outside [0, hess_max]."""
    g = np.asarray(g, dtype=np.float64)
    h = np.asarray(h, dtype=np.float64)
    if g.ndim != 1 or g.shape != h.shape:
        raise ValueError(f"g and h must be (rows,) of equal shape, got {g.shape} and {h.shape}")
    if len(g) > SITE_ROWS_MAX:
        raise DataError(f"histogram mode: {len(g)} rows at one site exceed SITE_ROWS_MAX={SITE_ROWS_MAX}")
    _check_bound(g, -float(grad_abs_max), float(grad_abs_max), "gradient", grad_abs_max)
    _check_bound(h, 0.0, float(hess_max), "hessian", hess_max)
    gq = np.rint(np.ldexp(g, scale_bits(grad_abs_max))).astype(np.int64)     # ldexp: exact scaling
    hq = np.rint(np.ldexp(h, scale_bits(hess_max))).astype(np.int64)
    return gq, hq


def level_histograms(bins: np.ndarray, gq: np.ndarray, hq: np.ndarray, positions: np.ndarray,
                     build_nodes: Any, n_slots: int, sampled: np.ndarray | None = None) -> np.ndarray:
    """This site's histograms of the nodes `build_nodes` (tree node ids): int64
    (len(build_nodes), F, n_slots, 3) of (Σ gq, Σ hq, rows) per (node, feature, bin).

    `bins` (rows, F) from sketch.bin_matrix, `positions` (rows,) each row's current node;
    `sampled` (bool (rows,), subsample < 1): only these rows count, in every channel. One
    compiled pass over the rows adds each row's (g, h, 1) into its (node, feature, bin) cell
    (kernels.hist_kernel): int64 sums, exact in any order. It replaced one sparse product per
    level (scipy's CSC times the rows' (g, h, 1)), most of whose time went to building its
    index arrays."""
    build = np.asarray(build_nodes, dtype=np.int64)
    n_features, n_slots, n_build = bins.shape[1], int(n_slots), len(build)
    out = np.zeros((n_build, n_features, n_slots, CHANNELS), dtype=np.int64)
    if n_build == 0 or len(positions) == 0:
        return out
    if bins.size and int(bins.max()) >= n_slots:        # the kernel trusts every cell index
        raise ValueError(f"a bin index is beyond the {n_slots} slots")
    if len(bins) != len(positions) or len(gq) != len(positions) or len(hq) != len(positions):
        raise ValueError("bins, gradients and positions must have one entry per row")
    slot_of = np.full(int(max(positions.max(initial=0), build.max())) + 1, -1, dtype=np.int64)
    slot_of[build] = np.arange(n_build)
    slot = slot_of[positions]
    if sampled is not None:
        slot = np.where(sampled, slot, -1)
    hist_kernel(np.ascontiguousarray(bins), np.ascontiguousarray(gq, dtype=np.int64),
                np.ascontiguousarray(hq, dtype=np.int64), slot, out)
    return out


def encode_histograms(hist: np.ndarray, n_parties: int) -> np.ndarray:
    """int64 histograms (any shape) -> the uint64 vector for the secure sum (two's complement, so
    the ring's arithmetic mod 2^64 gives the exact signed sum). DataError unless every
    |cell| * n_parties < 2^63 — then no sum of n_parties such vectors can wrap."""
    flat = np.ascontiguousarray(hist, dtype=np.int64).ravel()
    if isinstance(n_parties, bool) or not isinstance(n_parties, (int, np.integer)) or n_parties < 1:
        raise ValueError(f"n_parties must be a positive integer, got {n_parties!r}")
    limit = (_INT_SUM_LIMIT - 1) // int(n_parties)
    if len(flat) and int(np.abs(flat).max()) > limit:        # |int64 min| cannot occur: rows <= 2^24
        i = int(np.argmax(np.abs(flat)))
        raise DataError(f"histogram mode: cell {i} holds {int(flat[i])}, beyond the secure sum's bound "
                        f"|cell| * {n_parties} parties < 2^63")
    return flat.view(np.uint64)


def decode_histograms(total: Any, n_nodes: int, n_features: int, n_slots: int) -> np.ndarray:
    """The secure sum of `encode_histograms` vectors -> int64 (n_nodes, F, n_slots, 3)."""
    total = np.asarray(total)
    want = int(n_nodes) * int(n_features) * int(n_slots) * CHANNELS
    if total.dtype != np.uint64 or total.shape != (want,):
        raise ValueError(f"expected uint64 ({want},) summed histograms, got {total.dtype} {total.shape}")
    return total.view(np.int64).reshape(int(n_nodes), int(n_features), int(n_slots), CHANNELS)


def check_plausible(hist: np.ndarray, rows: int) -> None:
    """ValueError unless every cell of summed histograms (int64 (nodes, F, S, 3)) is what honest
    members can give: its row count between 0 and the federation's training rows, |Σg| and Σh
    at most its rows times 2^ROW_Q_BITS (each row's quantised value is bounded so), Σh >= 0."""
    g, h, n = hist[..., 0], hist[..., 1], hist[..., 2]
    if (n < 0).any() or (n > rows).any():
        raise ValueError(f"a histogram cell counts rows outside [0, the federation's {rows}]")
    limit = n << ROW_Q_BITS        # rows <= 2^31 (SITE_ROWS_MAX per site, at most 128 sites): no overflow
    if (g > limit).any() or (g < -limit).any():
        raise ValueError("a histogram cell's gradient sum exceeds its rows times the per-row bound")
    if (h < 0).any() or (h > limit).any():
        raise ValueError("a histogram cell's hessian sum is negative or exceeds its rows times the per-row bound")


def check_root(hist: np.ndarray, rows: int, every_row: bool) -> None:
    """ValueError unless the root's summed histograms (its first feature's slots) count the
    federation's training rows: exactly, when every row is in every tree (subsample 1), else at
    most. Below the root, each level's totals are checked against its parent's split."""
    counted = int(hist[0, 0, :, 2].sum())
    if counted > rows or (every_row and counted != rows):
        raise ValueError("the root's histograms do not count the federation's training rows")


LANE_BITS = 64


@functools.lru_cache(maxsize=16)
def _kept_cells(bins: tuple[int, ...] | None, n_features: int, n_slots: int) -> np.ndarray | None:
    """Flat indices (feature * S + slot) of the cells that can hold rows: each feature's bins and
    its missing slot (the last); None when that is every cell."""
    if bins is None:
        return None
    if len(bins) != n_features or max(bins, default=0) >= n_slots:
        raise ValueError(f"a packing for {len(bins)} features does not fit ({n_features}, {n_slots}) slots")
    keep = np.arange(n_slots)[None, :] < np.asarray(bins)[:, None]
    keep[:, n_slots - 1] = True                                 # the missing-value slot
    if keep.all():
        return None
    kept = np.flatnonzero(keep)
    kept.flags.writeable = False
    return kept


@functools.lru_cache(maxsize=16)
def _every_cell(n_cells: int) -> np.ndarray:
    cells = np.arange(n_cells, dtype=np.int64)
    cells.flags.writeable = False
    return cells


@dataclass(frozen=True)
class Packing:
    """How one level's histograms travel once the federation's training rows are known (module
    docstring): `rows` = R, `unit_hessian` when every row's h_q is 2^hess_bits (squared error)."""

    rows: int
    unit_hessian: bool = False
    hess_bits: int = 0
    bins: tuple[int, ...] | None = None     # per feature, its bins (cut points + 1); None: every slot

    def slots(self, n_features: int, n_slots: int) -> np.ndarray | None:
        """Which of a node's F * S cells travel (flat indices, ascending), or None for every one."""
        return _kept_cells(self.bins, int(n_features), int(n_slots))

    @property
    def count_bits(self) -> int:
        return max(1, int(self.rows).bit_length())

    @property
    def layout(self) -> tuple[tuple[int, ...], ...]:
        """Each lane's channels (0 = Σ g, 1 = Σ h, 2 = rows), lowest field first."""
        b = self.count_bits
        if self.unit_hessian:
            return ((2, 0),) if 2 * b + ROW_Q_BITS + 1 <= LANE_BITS else ((0,), (2,))
        return ((0,), (2, 1)) if 2 * b + ROW_Q_BITS <= LANE_BITS else ((0,), (1,), (2,))

    @property
    def lanes(self) -> int:
        return len(self.layout)

    def entries(self, n_nodes: int, n_features: int, n_slots: int) -> int:
        kept = self.slots(n_features, n_slots)
        return int(n_nodes) * (int(n_features) * int(n_slots) if kept is None else len(kept)) * self.lanes

    def encode(self, hist: np.ndarray, cells_major: bool = False) -> np.ndarray:
        """A site's int64 histograms (nodes, F, S, 3) -> uint64 (nodes * cells * lanes,), in one
        compiled pass (kernels.pack_kernel); with `cells_major`, in (cell, node, lane) order
        (FeatureBlocks: each block one contiguous segment). DataError if a cell leaves the
        bounds the widths rest on (the site's rows exceed R, say)."""
        hist = np.ascontiguousarray(hist, dtype=np.int64)
        if hist.ndim != 4 or hist.shape[-1] != CHANNELS:
            raise ValueError(f"expected (nodes, F, S, 3) histograms, got shape {hist.shape}")
        n_nodes, n_features, n_slots = hist.shape[:3]
        kept = self.slots(n_features, n_slots)
        if kept is None:
            kept = _every_cell(n_features * n_slots)
        fields = np.array([(lane[0], lane[1] if len(lane) > 1 else -1) for lane in self.layout], dtype=np.int64)
        out = np.empty(n_nodes * len(kept) * self.lanes, dtype=np.uint64)
        refused = pack_kernel(hist.reshape(n_nodes, -1, CHANNELS).view(np.uint64), kept, fields, self.count_bits,
                              self.unit_hessian, int(self.hess_bits), bool(cells_major), out)
        if refused == PACK_DROPPED_ROWS:
            raise DataError("histogram mode: rows in a bin beyond the feature's cut points")
        if refused == PACK_BAD_COUNT:
            raise DataError(f"histogram mode: a histogram cell counts rows outside [0, 2^{self.count_bits}): more "
                            f"rows at this site than the federation's {self.rows}")
        if refused == PACK_BAD_HESSIAN:
            raise DataError("histogram mode: squared error, but a cell's hessian sum is not its rows times "
                            "2^hess_bits")
        return out

    def decode(self, total: Any, n_nodes: int, n_features: int, n_slots: int) -> np.ndarray:
        """The secure sum of `encode` vectors -> int64 (n_nodes, F, n_slots, 3)."""
        total = np.asarray(total)
        want = self.entries(n_nodes, n_features, n_slots)
        if total.dtype != np.uint64 or total.shape != (want,):
            raise ValueError(f"expected uint64 ({want},) summed histograms, got {total.dtype} {total.shape}")
        lanes = total.reshape(int(n_nodes), -1, self.lanes)
        out = np.empty(lanes.shape[:-1] + (CHANNELS,), dtype=np.int64)
        b = np.uint64(self.count_bits)
        for i, lane in enumerate(self.layout):
            if len(lane) == 1:
                out[..., lane[0]] = lanes[..., i].view(np.int64)
            else:
                out[..., lane[0]] = (lanes[..., i] & np.uint64((1 << self.count_bits) - 1)).view(np.int64)
                signed = lane[1] == 0                   # Σ g: an arithmetic shift keeps its sign
                high = lanes[..., i].view(np.int64) >> np.int64(b) if signed else (lanes[..., i] >> b).view(np.int64)
                out[..., lane[1]] = high
        if self.unit_hessian:
            out[..., 1] = out[..., 2] << self.hess_bits
        kept = self.slots(n_features, n_slots)
        if kept is None:
            return out.reshape(int(n_nodes), int(n_features), int(n_slots), CHANNELS)
        full = np.zeros((int(n_nodes), int(n_features) * int(n_slots), CHANNELS), dtype=np.int64)
        full[:, kept] = out
        return full.reshape(int(n_nodes), int(n_features), int(n_slots), CHANNELS)


@dataclass(frozen=True)
class FeatureBlocks:
    """A level's histograms cut into one contiguous block of features per owner, for the secure
    reduce-map (fedpeer/protocols/securesum/reducemap.py): member k owns features
    features[k] .. features[k + 1] - 1, blocks as equal in travelling cells as whole features
    allow (a member owns none when it is not among the owners, or there are fewer features
    than owners). The vector then runs block by block: `Packing.encode(..., cells_major=True)`
    writes it in (cell, node, lane) order, so each block is one contiguous segment at every
    level."""

    packing: Packing
    n_features: int
    n_slots: int
    features: tuple[int, ...]        # n + 1 feature bounds
    cells: tuple[int, ...]           # n + 1 bounds in travelling cells

    @classmethod
    def of(cls, packing: Packing, n_features: int, n_slots: int, members: int,
           owners: tuple[int, ...] | None = None) -> FeatureBlocks:
        """Blocks for `owners` (member indices, ascending; default every member), in member order;
        the other members own none."""
        owners = tuple(range(members)) if owners is None else tuple(owners)
        if not owners or list(owners) != sorted(set(owners)) or owners[0] < 0 or owners[-1] >= members:
            raise ValueError(f"block owners must be distinct member indices in [0, {members}), got {owners}")
        kept = packing.slots(n_features, n_slots)
        per = (np.full(n_features, n_slots, dtype=np.int64) if kept is None
               else np.bincount(kept // n_slots, minlength=n_features).astype(np.int64))
        cum = np.concatenate(([0], np.cumsum(per)))
        targets = cum[-1] * np.arange(len(owners) + 1) / len(owners)
        fb = np.clip(np.searchsorted(cum, targets, side="left"), 0, n_features)
        lower = np.clip(fb - 1, 0, n_features)          # the nearer of the two features around each target
        fb = np.where(np.abs(cum[lower] - targets) <= np.abs(cum[fb] - targets), lower, fb)
        fb[0], fb[-1] = 0, n_features
        fb = np.maximum.accumulate(fb)
        ends = iter(fb[1:])
        bounds = [0]
        for k in range(members):
            bounds.append(int(next(ends)) if k in owners else bounds[-1])
        fb = np.asarray(bounds)
        return cls(packing, int(n_features), int(n_slots), tuple(int(f) for f in fb), tuple(int(cum[f]) for f in fb))

    def bounds(self, n_nodes: int) -> list[int]:
        """The segments' bounds in vector entries for a level of n_nodes built nodes."""
        return [c * int(n_nodes) * self.packing.lanes for c in self.cells]

    def decode(self, k: int, segment: np.ndarray, n_nodes: int) -> np.ndarray:
        """Block k's summed segment -> int64 (n_nodes, F_k, n_slots, 3); ValueError on a wrong size."""
        f0, f1 = self.features[k], self.features[k + 1]
        cells, lanes = self.cells[k + 1] - self.cells[k], self.packing.lanes
        segment = np.asarray(segment)
        if segment.shape != (cells * int(n_nodes) * lanes,):
            want = cells * int(n_nodes) * lanes
            raise ValueError(f"expected ({want},) summed entries of block {k}, got {segment.shape}")
        node_major = segment.reshape(cells, int(n_nodes), lanes).transpose(1, 0, 2).ravel()
        bins = None if self.packing.bins is None else self.packing.bins[f0:f1]
        block = Packing(self.packing.rows, self.packing.unit_hessian, self.packing.hess_bits, bins)
        return block.decode(node_major, n_nodes, f1 - f0, self.n_slots)

