"""Histogram-mode federated XGBoost (docs/algorithms.md, "Lossless histogram federated
XGBoost"): parameters, the intercept from summed label statistics, the encoding of integer
statistics for the secure sum, model assembly — pure functions; the job only moves their inputs
and outputs.

A job (every member runs the same steps; "sum" = one secure sum over the members):
  1. p = HistParams.from_mapping(job params); sum `label_stats(y, p)` (encode_ints) ->
     base = base_score_from_stats(total, p).
  2. Cut points: the step machine of fedpeer.ml.xgb.sketch (sketch_steps sums: 12 of 50 * 255 * 7
     counts at 50 features and max_bin 256),
     then bins = bin_matrix(X, cuts, column_major=False) once.
  3. Per boosting round: g, h = gradients(objective, margins, y) (rows, K); per class k one tree:
     gq, hq = quantize_gradients(g[:, k], h[:, k], *p.bounds()); growth = start_tree(...);
     per level: sum encode_histograms(level_histograms(bins, gq, hq, positions, growth.build,
     cuts.n_slots)); growth = grow_level(growth, decode_histograms(...)); positions =
     route_rows(...). Then tree = finish_tree(growth, cuts); margins[:, k] += tree.value[positions].
  4. model = model_bytes(trees, base, F, p): the canonical xgboost JSON model (fedpeer.ml.xgb.model).
fedpeer.ml.xgb.histrun holds a member's side of these steps (HistSite) and runs them in one process
with a plain sum of the members' uint64 vectors (the secure sum's arithmetic, mod 2^64):
`train_in_process`, and `train_reference` on the pooled rows. Because every sum is a sum of
integers, both give byte-identical models.

Sampling, identical everywhere without any exchange: `colsample_bytree` < 1
gives tree t the max(1, floor(colsample_bytree * F)) features with the smallest BLAKE2b(seed, t,
feature) (`tree_features`: every member derives the same set from the job's seed, on any machine
and numpy version; the other features' cuts are not candidates). `subsample` < 1: every member
keeps each of its own rows for tree t with probability subsample, from its own seed (`HistSite`'s
`row_seed`; the job derives it from the job seed and the member's key) — rows are local, so only
the member itself needs to reproduce its draw; a row left out adds nothing to that tree's
histograms, row counts included (the min_leaf_rows floor counts sampled rows), and still gets
the tree's leaf value in its margin, as in xgboost. Neither draws the same numbers as xgboost's
own sampling: the federated model equals the in-process reference with the same seeds.

Not supported (refused by from_mapping, never silently ignored): reg_alpha, colsample_bylevel /
colsample_bynode below 1, grow_policy lossguide / max_leaves, scale_pos_weight, boosters other
than gbtree. The K trees of a multi-class round use the gradients of the round's start (as xgboost).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.ml.xgb.hist import Packing, encode_histograms, scale_bits
from fedpeer.ml.xgb.histtree import SplitParams
from fedpeer.ml.xgb.model import _base_vector, _model_bytes, global_base_score
from fedpeer.ml.xgb.tree import CLASSES_MAX, DEPTH_MAX, MODEL_OBJECTIVES, _groups, _Tree

__all__ = ["HistParams", "base_score_from_stats", "decode_ints", "encode_ints", "initial_margins", "label_stats",
           "model_bytes", "tree_features"]

LABEL_FRAC_BITS = 16           # regression labels are summed as round(y * 2^16)
LABEL_ABS_MAX = float(1 << 20)  # |y| <= 2^20 keeps a site's label sum far below 2^63 (2^24 rows * 2^36)
ROUNDS_MAX = 100_000
BOUND_MIN = 1e-30              # a declared grad_abs_max / hess_max below this: its fixed point would need
                               # over 120 fraction bits (the split search scales by 2^-bits, histtree._scale)
# The objectives' own gradient bounds (|g| <= grad_abs_max, 0 <= h <= hess_max); regression has
# none, so its default is a declaration the job may change (a row beyond it ends the job, named).
_BOUNDS = {"binary:logistic": (1.0, 0.25), "multi:softprob": (1.0, 0.5), "reg:squarederror": (1000.0, 1.0)}
_ALIASES = {"learning_rate": "eta", "lambda": "reg_lambda", "min_split_loss": "gamma", "num_boost_round": "num_round"}
_NO_EFFECT = {"tree_method": ("hist",), "nthread": None, "verbosity": None, "random_state": None,
              "grow_policy": ("depthwise",), "booster": ("gbtree",), "num_parallel_tree": (1, "1")}
_MUST_BE = {"reg_alpha": 0, "alpha": 0, "colsample_bylevel": 1,
            "colsample_bynode": 1, "max_leaves": 0, "scale_pos_weight": 1}


@dataclass(frozen=True)
class HistParams:
    """The training parameters, under xgboost's names (aliases accepted by from_mapping)."""

    objective: str = "binary:logistic"
    num_class: int = 0
    num_round: int = 10
    eta: float = 0.3
    max_depth: int = 6
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    max_delta_step: float = 0.0
    min_leaf_rows: int = 2
    max_bin: int = 256
    grad_abs_max: float = 0.0      # 0: the objective's own bound (_BOUNDS)
    hess_max: float = 0.0
    subsample: float = 1.0         # each member's rows kept per tree (its own draw, module docstring)
    colsample_bytree: float = 1.0  # features per tree (the same everywhere: tree_features)
    seed: int = 0                  # the job's seed: which features each tree may split on

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any]) -> HistParams:
        known = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in params.items():
            name = _ALIASES.get(key, key)
            if name in known:
                values[name] = value
            elif name in _NO_EFFECT:
                allowed = _NO_EFFECT[name]
                if allowed is not None and value not in allowed:
                    raise ValueError(f"histogram mode supports {name} in {allowed}, got {value!r}")
            elif name in _MUST_BE:
                if float(value) != _MUST_BE[name]:
                    raise ValueError(f"histogram mode does not support {name}={value!r} (only {_MUST_BE[name]})")
            else:
                raise ValueError(f"histogram mode has no parameter {key!r}")
        out = cls(**values)
        out.check()
        return out

    def check(self) -> None:
        _groups(self.objective, int(self.num_class))          # objective and num_class agree
        ints = (("num_round", 1, ROUNDS_MAX), ("max_depth", 1, DEPTH_MAX), ("min_leaf_rows", 1, 1 << 40),
                ("max_bin", 2, 65535))
        for name, low, high in ints:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not low <= v <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {v!r}")
        for name in ("eta", "reg_lambda", "gamma", "min_child_weight", "max_delta_step", "grad_abs_max", "hess_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        for name in ("grad_abs_max", "hess_max"):           # 0: the objective's own; else a scale the sums can hold
            v = getattr(self, name)
            if 0 < v < BOUND_MIN:
                raise ValueError(f"{name} must be 0 (the objective's own) or at least {BOUND_MIN:g}, got {v!r}")
        for name in ("subsample", "colsample_bytree"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")
        if self.eta <= 0:
            raise ValueError(f"eta must be positive, got {self.eta!r}")

    @property
    def groups(self) -> int:
        return _groups(self.objective, int(self.num_class))

    def bounds(self) -> tuple[float, float]:
        """(grad_abs_max, hess_max) as declared, or the objective's own."""
        g, h = _BOUNDS[self.objective]
        return float(self.grad_abs_max or g), float(self.hess_max or h)

    def packing(self, rows: int, cut_counts: Any = None) -> Packing:
        """How levels' histograms travel once the federation's training rows (and the cut
        points: each feature's count) are known."""
        bins = None if cut_counts is None else tuple(int(c) + 1 for c in cut_counts)
        return Packing(int(rows), unit_hessian=self.objective == "reg:squarederror",
                       hess_bits=scale_bits(self.bounds()[1]), bins=bins)

    def split_params(self) -> SplitParams:
        g, h = self.bounds()
        return SplitParams(grad_bits=scale_bits(g), hess_bits=scale_bits(h), eta=float(self.eta),
                           max_depth=int(self.max_depth), reg_lambda=float(self.reg_lambda), gamma=float(self.gamma),
                           min_child_weight=float(self.min_child_weight), max_delta_step=float(self.max_delta_step),
                           min_leaf_rows=int(self.min_leaf_rows))


def _labels(y: Any, p: HistParams) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.dtype.kind not in "biuf" or not np.isfinite(y.astype(np.float64)).all():
        raise DataError(f"y must be finite numbers (rows,), got {y.dtype} {y.shape}")
    if p.objective == "reg:squarederror":
        return y.astype(np.float64)
    top = 1 if p.groups == 1 else p.groups - 1
    if (y != np.round(y)).any() or (len(y) and (y.min() < 0 or y.max() > top)):
        raise DataError(f"{p.objective} needs integer labels in [0, {top}]")
    return y.astype(np.int64)


def label_stats(y: Any, p: HistParams) -> np.ndarray:
    """A site's additive label statistics (int64): binary [positives, rows]; multi-class
    [rows of class 0..K-1, rows]; regression [Σ round(y * 2^16), rows] (|y| <= 2^20, named)."""
    y = _labels(y, p)
    if p.objective == "reg:squarederror":
        if len(y) and float(np.abs(y).max()) > LABEL_ABS_MAX:
            raise DataError(f"histogram mode: |label| {float(np.abs(y).max())!r} exceeds LABEL_ABS_MAX={LABEL_ABS_MAX}")
        return np.array([int(np.rint(np.ldexp(y, LABEL_FRAC_BITS)).astype(np.int64).sum()), len(y)], dtype=np.int64)
    if p.groups == 1:
        return np.array([int(y.sum()), len(y)], dtype=np.int64)
    return np.concatenate((np.bincount(y, minlength=p.groups), [len(y)])).astype(np.int64)


def check_label_stats(total: Any, p: HistParams, parties: int) -> int:
    """ValueError unless summed `label_stats` are what honest members can give; the federation's
    rows. Rows between 1 and parties x SITE_ROWS_MAX; binary positives and every class count
    between 0 and the rows, class counts adding up to the rows; a regression's Σy within the rows
    times the label bound."""
    from fedpeer.ml.xgb.hist import SITE_ROWS_MAX

    total = np.asarray(total, dtype=np.int64)
    rows = int(total[-1])
    if not 0 < rows <= parties * SITE_ROWS_MAX:
        raise ValueError(f"the label counts' rows are outside [1, {parties} sites x {SITE_ROWS_MAX}]")
    head = total[:-1]
    if p.objective == "reg:squarederror":
        if abs(int(head[0])) > rows * (int(LABEL_ABS_MAX) << LABEL_FRAC_BITS):
            raise ValueError("the labels' sum exceeds the rows times the label bound")
    elif (head < 0).any() or (head > rows).any() or (p.groups > 1 and int(head.sum()) != rows):
        raise ValueError("the label counts are negative, above the rows, or do not add up to them")
    return rows


ROOT_GRADIENT_ROOM_PER_ROW = 1       # quanta (2^-grad_bits each): sites' libm may round p differently by one


def check_root_gradient(hist: np.ndarray, labels: Any, base: Sequence[float], p: HistParams, k: int) -> None:
    """ValueError unless the root's summed gradient of a first-round tree (class `k`; every row in
    the tree) is what the summed label statistics `labels` imply. At the initial margins every
    row of a class has one gradient, so the sum is exact up to each site's rounding: logistic
    Σg = N·base − P, softmax Σg_k = N·p_k − N_k, both in quantised integers (within one quantum,
    2^-grad_bits, per row: libm's last bit may differ between sites); squared error Σg =
    N·base − Σy, within one quantum and one label step (2^-LABEL_FRAC_BITS, the label sum's
    fixed point) per row. A member that flips the sign of its gradients fails it (unless its own
    rows' gradients sum to exactly zero)."""
    from fedpeer.ml.moments import exact_sum
    from fedpeer.ml.xgb.hist import gradients

    total = np.asarray(labels, dtype=np.int64)
    rows, bits = int(total[-1]), scale_bits(p.bounds()[0])
    summed = exact_sum(hist[0, 0, :, 0])                 # the first feature's slots hold every row once
    if p.objective == "reg:squarederror":
        expected = math.ldexp(rows * float(base[0]) - math.ldexp(int(total[0]), -LABEL_FRAC_BITS), bits)
        room = rows * (ROOT_GRADIENT_ROOM_PER_ROW + math.ldexp(1.0, bits - LABEL_FRAC_BITS))
        ok = abs(summed - expected) <= room
    else:
        held = int(total[0] if p.groups == 1 else total[k])        # the rows whose label is k (binary: 1)
        y = np.array([1, 0]) if p.groups == 1 else np.array([k, (k + 1) % p.groups])
        g, _ = gradients(p.objective, initial_margins(base, 2, p), y)
        gq = np.rint(np.ldexp(g[:, k], bits)).astype(np.int64)
        expected = held * int(gq[0]) + (rows - held) * int(gq[1])
        ok = abs(summed - expected) <= rows * ROOT_GRADIENT_ROOM_PER_ROW
    if not ok:
        raise ValueError("the first round's root gradient sum is what the label counts imply")


def base_score_from_stats(total: Any, p: HistParams) -> tuple[float, ...]:
    """The federation's intercept (float32 values) from summed `label_stats`: the label mean
    (binary: as a probability; regression: as a margin), or the class-prior margins."""
    total = np.asarray(total, dtype=np.int64)
    rows = int(total[-1])
    if rows <= 0:
        raise DataError("histogram mode: the federation has no rows")
    if p.objective == "reg:squarederror":
        return (float(np.float32(math.ldexp(int(total[0]), -LABEL_FRAC_BITS) / rows)),)
    if p.groups == 1:
        return (global_base_score(int(total[0]), rows, p.objective),)
    return tuple(global_base_score(total[:-1], rows, p.objective, p.groups))


def tree_features(p: HistParams, tree: int, n_features: int) -> np.ndarray:
    """bool (F,): the features tree `tree` (round * groups + class) may split on — every one, or
    the max(1, floor(colsample_bytree * F)) with the smallest BLAKE2b-64(seed, tree, feature),
    ties by index (module docstring)."""
    keep = np.ones(n_features, dtype=bool)
    if p.colsample_bytree >= 1.0:
        return keep
    want = max(1, int(p.colsample_bytree * n_features))
    prefix = int(p.seed).to_bytes(8, "big") + int(tree).to_bytes(8, "big")
    score = [int.from_bytes(hashlib.blake2b(prefix + f.to_bytes(4, "big"), digest_size=8).digest(), "big")
             for f in range(n_features)]
    keep[:] = False
    keep[sorted(range(n_features), key=lambda f: (score[f], f))[:want]] = True
    return keep


def initial_margins(base: Sequence[float], rows: int, p: HistParams) -> np.ndarray:
    """Every row's margin before any tree: float64 (rows, K)."""
    b = np.asarray(base, dtype=np.float64)
    if p.objective == "binary:logistic":
        b = np.log(b / (1.0 - b))                  # xgboost's ProbToMargin
    return np.tile(b, (rows, 1))


def encode_ints(values: Any, n_parties: int) -> np.ndarray:
    """Signed int64 statistics -> uint64 for the secure sum (the bound check of encode_histograms)."""
    return encode_histograms(np.asarray(values, dtype=np.int64), n_parties)


def decode_ints(total: Any) -> np.ndarray:
    total = np.asarray(total)
    if total.dtype != np.uint64:
        raise ValueError(f"expected uint64, got {total.dtype}")
    return total.view(np.int64)


def model_bytes(trees: Sequence[_Tree], base: Sequence[float], num_feature: int, p: HistParams) -> bytes:
    """The canonical xgboost JSON model of the trees (round major, class minor)."""
    if p.objective not in MODEL_OBJECTIVES or not 1 <= p.groups <= CLASSES_MAX:
        raise ValueError(f"cannot write a model for {p.objective}")
    return _model_bytes(list(trees), _base_vector(list(base), p.objective, p.groups), int(num_feature), p.groups,
                        p.objective)
