"""The tree job's arithmetic without the network: one member's side (`TreeSite`) and the whole
protocol in one process (`train_in_process`, `train_reference`) — pure, no I/O, no clock. It joins
the federated cut points of histogram XGBoost (fedpeer/ml/xgb/sketch.py) with the CART core
(fedpeer/ml/tree/cart.py, fedpeer/ml/tree/model.py); fedpeer/kinds/tree/job.py runs the same steps
over secure sums.

The sequence every member follows (one sum per arrow; here plain uint64 addition — the secure
sum's arithmetic, mod 2^64, without its privacy):
    sketch_vector(keys) x sketch_steps -> cut points, the federation's rows, which bins hold one value
    per level: level_vector(growth) -> grow_level -> after_level
    finish_tree: scikit-learn's arrays, pruned with ccp_alpha.
Every sum is a sum of integers, so the members' tree equals the pooled rows' tree byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.ml.tree.cart import (
    Growth,
    Layout,
    TreeParams,
    decode_level,
    encode_level,
    grow_level,
    label_channels,
    level_histograms,
    route_rows,
    start_tree,
)
from fedpeer.ml.tree.model import BinValues, Cart, finish_tree
from fedpeer.ml.xgb.sketch import (
    Cuts,
    Sketch,
    bin_matrix,
    keys_to_float,
    prepare_site,
    site_counts,
    sketch_advance,
    sketch_cuts,
    sketch_start,
)

__all__ = ["TreeSite", "bin_values", "federation_rows", "train_in_process", "train_reference"]


class TreeSite:
    """One member's rows and running state: its bins and each row's node."""

    def __init__(self, X: Any, y: Any, params: TreeParams, n_parties: int) -> None:
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[0] == 0 or X.dtype.kind not in "biuf":
            raise DataError(f"tree: needs a non-empty numeric (rows, features) matrix, got {X.dtype} {X.shape}")
        if not np.isfinite(X.astype(np.float32)).all():
            raise DataError("tree: a feature value is missing or beyond float32 (set [data] missing = \"drop\" "
                            "or \"impute\")")
        self.X, self.p, self.cp, self.n_parties = X, params, params.cart(), int(n_parties)
        self.labels = label_channels(y, self.cp)
        if len(self.labels) != X.shape[0]:
            raise DataError(f"tree: {X.shape[0]} rows but {len(self.labels)} labels")
        self._prepared: np.ndarray | None = None
        self.bins: np.ndarray | None = None
        self.layout: Layout | None = None
        self.positions = np.zeros(X.shape[0], dtype=np.int64)

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def sketch_vector(self, keys: np.ndarray) -> np.ndarray:
        if self._prepared is None:
            self._prepared = prepare_site(self.X)
        return encode_level(site_counts(self._prepared, keys), self.n_parties)

    def set_cuts(self, cuts: Cuts) -> None:
        self.bins, self.layout, self._prepared = bin_matrix(self.X, cuts), Layout.of(cuts.counts()), None
        self.positions = np.zeros(self.X.shape[0], dtype=np.int64)

    def level_vector(self, growth: Growth) -> np.ndarray:
        assert self.bins is not None and self.layout is not None, "set_cuts first"
        hist = level_histograms(self.bins, self.labels, self.positions, growth.build, self.layout, self.cp)
        return encode_level(hist, self.n_parties)

    def after_level(self, growth: Growth) -> None:
        assert self.bins is not None
        self.positions = route_rows(growth, self.bins, self.positions)


def federation_rows(sketch: Sketch) -> int:
    """The federation's training rows from the sketch's first sum; ValueError unless every feature
    counts the same rows, at least one (no member has missing values)."""
    assert sketch.present is not None
    rows = int(sketch.present[0])
    if rows < 1 or (sketch.present != rows).any():
        raise ValueError("the features' non-missing row counts differ (or are zero): a member has missing values")
    return rows


def bin_values(sketch: Sketch, cuts: Cuts) -> BinValues:
    """The cut points and which features' bins hold one value each: those with max_bin above their
    rows, whose every value the sketch located — the smallest (rank 1) is their minimum."""
    assert sketch.present is not None and sketch.done
    exact = (sketch.max_bin > sketch.present) & (sketch.present > 0)
    keys = np.where(sketch.ranks() >= 1, sketch.hi, np.iinfo(np.int64).max).min(axis=1)
    floor = np.where(exact, keys_to_float(np.where(exact, keys, 0).astype(np.uint32)), np.nan).astype(np.float32)
    return BinValues(values=cuts.values, ptr=cuts.ptr, exact=exact, floor=floor)


def _plain_sum(parts: Sequence[np.ndarray]) -> np.ndarray:
    total = np.zeros_like(parts[0])
    for part in parts:
        total += part
    return total


def train_in_process(sites: Sequence[tuple[Any, Any]], params: TreeParams) -> Cart:
    """The tree of members held in one process, summing with plain uint64 sums."""
    if not sites:
        raise ValueError("no sites")
    members = [TreeSite(X, y, params, len(sites)) for X, y in sites]
    n_features = members[0].n_features
    if any(m.n_features != n_features for m in members):
        raise DataError("members differ in their number of features")
    sk = sketch_start(n_features, params.max_bin)
    while not sk.done:
        keys = sk.request()
        total = _plain_sum([m.sketch_vector(keys) for m in members])
        sk = sketch_advance(sk, total.view(np.int64).reshape(keys.shape))
    cuts = sketch_cuts(sk)
    for m in members:
        m.set_cuts(cuts)
    layout, cp = Layout.of(cuts.counts()), params.cart()
    growth = start_tree(layout, cp, federation_rows(sk))
    while not growth.done:
        total = _plain_sum([m.level_vector(growth) for m in members])
        growth = grow_level(growth, decode_level(total, len(growth.build), layout, cp))
        for m in members:
            m.after_level(growth)
    return finish_tree(growth, bin_values(sk, cuts), params.ccp_alpha)


def train_reference(sites_X: Sequence[Any], sites_y: Sequence[Any], params: TreeParams) -> Cart:
    """The centralized reference: the same pure functions on the pooled rows (one member)."""
    pooled = (np.concatenate([np.asarray(X) for X in sites_X]), np.concatenate([np.asarray(y) for y in sites_y]))
    return train_in_process([pooled], params)
