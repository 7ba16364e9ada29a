"""Histogram mode, one member's side (`HistSite`) and the whole protocol in one process
(`train_in_process`, `train_reference`) (docs/algorithms.md).

`HistSite` holds one member's rows and running state (bins, margins, the current tree's row
positions) and nothing else: no I/O, no clock, no randomness. Each `*_vector` method returns
the uint64 vector this member adds to the next secure sum; each `set_*` / `after_*` / `add_*`
method takes what every member derived from that sum. The federation-wide side is the pure
step machines of fedpeer.ml.xgb.sketch (cut points) and fedpeer.ml.xgb.histtree (one tree), which every
member runs itself on the same sums, so every member holds the same cuts, trees and model.

`train_in_process` is the reference sequence a job follows (one sum per arrow):
    label_vector -> base          set_base
    sketch_vector(keys) x 33      set_cuts
    per round: start_round; per class k: start_tree(k), then per level
    level_vector(growth) -> grow_level -> after_level, and add_tree(finish_tree(growth), k).
It sums with plain uint64 addition (the secure sum's arithmetic, mod 2^64, without its
privacy); `train_reference` runs it on the pooled rows as one member. Every sum is a sum of
integers, so the two give byte-identical models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.ml.xgb.hist import (
    Packing,
    encode_histograms,
    gradients,
    level_histograms,
    quantize_gradients,
)
from fedpeer.ml.xgb.histboost import (
    HistParams,
    _labels,
    base_score_from_stats,
    check_label_stats,
    decode_ints,
    encode_ints,
    initial_margins,
    label_stats,
    model_bytes,
    tree_features,
)
from fedpeer.ml.xgb.histtree import Growth, finish_tree, grow_level, route_rows, start_tree, tree_leaf_values
from fedpeer.ml.xgb.sketch import (
    Cuts,
    bin_matrix,
    prepare_site,
    site_counts,
    sketch_advance,
    sketch_cuts,
    sketch_start,
)
from fedpeer.ml.xgb.tree import _Tree

__all__ = ["HistResult", "HistSite", "train_in_process", "train_members", "train_reference"]


class HistSite:
    """One member's rows and running state in histogram mode (module docstring)."""

    def __init__(self, X: Any, y: Any, params: HistParams, n_parties: int, row_seed: int = 0) -> None:
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[0] == 0 or X.dtype.kind not in "biuf":
            raise DataError(f"histogram mode needs a non-empty numeric (rows, features) matrix, got {X.dtype} "
                            f"{X.shape}")
        self.p, self.n_parties, self.row_seed = params, int(n_parties), int(row_seed)
        self.sampled: np.ndarray | None = None     # this tree's rows (subsample < 1), else every row
        self.X, self.y = X, _labels(y, params)
        if len(self.y) != X.shape[0]:
            raise DataError(f"{X.shape[0]} rows but {len(self.y)} labels")
        self._prepared: np.ndarray | None = None
        self.cuts: Cuts | None = None
        self.bins: np.ndarray | None = None
        self.margins = np.zeros((0, params.groups))
        self._derivs: tuple[np.ndarray, np.ndarray] | None = None
        self._gq = self._hq = self.positions = np.zeros(0, dtype=np.int64)
        self.packing: Packing | None = None      # one uint64 per channel until set_packing

    @property
    def rows(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    def label_vector(self) -> np.ndarray:
        return encode_ints(label_stats(self.y, self.p), self.n_parties)

    def set_base(self, base: Sequence[float]) -> None:
        self.margins = initial_margins(base, self.rows, self.p)

    def set_packing(self, packing: Packing) -> None:
        """Levels' histograms packed for the federation's training rows (hist.Packing)."""
        self.packing = packing

    def sketch_vector(self, keys: np.ndarray) -> np.ndarray:
        if self._prepared is None:
            self._prepared = prepare_site(self.X)
        return encode_ints(site_counts(self._prepared, keys), self.n_parties)

    def set_cuts(self, cuts: Cuts) -> None:
        self.cuts, self.bins, self._prepared = cuts, bin_matrix(self.X, cuts, column_major=False), None

    def start_round(self) -> None:
        """g, h of every class at the round's margins (the K trees of a round share them)."""
        self._derivs = gradients(self.p.objective, self.margins, self.y)

    def start_tree(self, k: int, tree: int = 0) -> None:
        """Tree number `tree` (round * groups + k) of class k: its quantised g, h and, with
        subsample < 1, this member's own draw of its rows (seeded by row_seed and the tree)."""
        assert self._derivs is not None, "start_round first"
        g, h = self._derivs
        self._gq, self._hq = quantize_gradients(g[:, k], h[:, k], *self.p.bounds())
        self.positions = np.zeros(self.rows, dtype=np.int64)
        if self.p.subsample < 1.0:
            self.sampled = np.random.default_rng([self.row_seed, int(tree)]).random(self.rows) < self.p.subsample

    def level_vector(self, growth: Growth, cells_major: bool = False) -> np.ndarray:
        """This member's vector of the level (packed once set_packing; `cells_major`: in the
        secure reduce-map's block order, hist.FeatureBlocks)."""
        assert self.bins is not None and self.cuts is not None, "set_cuts first"
        hist = level_histograms(self.bins, self._gq, self._hq, self.positions, growth.build, self.cuts.n_slots,
                                self.sampled)
        if self.packing is None:
            assert not cells_major, "set_packing first"
            return encode_histograms(hist, self.n_parties)
        return self.packing.encode(hist, cells_major)

    def after_level(self, growth: Growth) -> None:
        assert self.bins is not None and self.cuts is not None
        self.positions = route_rows(growth, self.bins, self.positions, self.cuts.missing_bin)

    def add_tree(self, tree: _Tree, k: int) -> None:
        self.margins[:, k] += tree.value[self.positions]

    def train_total(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(margins, labels, *args) over this member's training rows (the Dask engine's: summed
        over its partitions)."""
        return fn(self.margins, self.y, *args)

    def resume(self, base: Sequence[float], trees: Sequence[_Tree]) -> int:
        """Rebuild the margins (and the current round's g, h) from committed trees, e.g. under a
        new leader or after a restart; returns the class k of the next tree (start_tree(k) next,
        or start_round() first when k is 0)."""
        groups = self.p.groups
        complete = len(trees) // groups * groups
        self.set_base(base)
        for t, tree in enumerate(trees[:complete]):
            self.margins[:, t % groups] += tree_leaf_values(tree, self.X)
        if complete == len(trees):
            return 0
        self.start_round()                         # the round's g, h: at its start, as when it began
        for t, tree in enumerate(trees[complete:]):
            self.margins[:, t] += tree_leaf_values(tree, self.X)
        return len(trees) - complete


@dataclass(frozen=True, eq=False)
class HistResult:
    model: bytes
    margins: tuple[np.ndarray, ...]   # each member's final margins (rows, K), as the builder tracked them
    cuts: Cuts
    base: tuple[float, ...]


def _plain_sum(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The secure sum's arithmetic without its privacy: uint64 vectors added mod 2^64."""
    total = np.zeros_like(parts[0])
    for part in parts:
        total += part
    return total


def _agree_cuts(members: Sequence[HistSite], n_features: int, max_bin: int, rows: int) -> Cuts:
    sk = sketch_start(n_features, max_bin, rows)
    while not sk.done:
        keys = sk.request()
        sk = sketch_advance(sk, decode_ints(_plain_sum([m.sketch_vector(keys) for m in members])).reshape(keys.shape))
    return sketch_cuts(sk)


def _grow(members: Sequence[HistSite], cuts: Cuts, p: HistParams, tree: int, packing: Packing) -> _Tree:
    growth = start_tree(cuts.counts(), p.split_params(), tree_features(p, tree, cuts.n_features))
    while not growth.done:
        total = _plain_sum([m.level_vector(growth) for m in members])
        growth = grow_level(growth, packing.decode(total, len(growth.build), cuts.n_features, cuts.n_slots))
        for m in members:
            m.after_level(growth)
    return finish_tree(growth, cuts)


def train_in_process(sites: Sequence[tuple[Any, Any]], params: Mapping[str, Any] | HistParams,
                     start_trees: Sequence[_Tree] = (), row_seeds: Sequence[int] | None = None) -> HistResult:
    """Histogram-mode training of members held in one process, summing with plain uint64 sums;
    with `start_trees` (committed trees, round major, class minor) it resumes after them;
    `row_seeds`: each member's own seed for subsample (default 0 each)."""
    p = params if isinstance(params, HistParams) else HistParams.from_mapping(params)
    if not sites:
        raise ValueError("no sites")
    seeds = list(row_seeds) if row_seeds is not None else [0] * len(sites)
    members = [HistSite(X, y, p, len(sites), seed) for (X, y), seed in zip(sites, seeds, strict=True)]
    return train_members(members, p, start_trees)


def train_members(members: Sequence[Any], p: HistParams, start_trees: Sequence[_Tree] = ()) -> HistResult:
    """`train_in_process`'s sequence over members already built: HistSite, or anything with its
    methods (the Dask engine's DaskHistSite); `margins` as the members hold them (None if not)."""
    n_features = members[0].n_features
    if any(m.n_features != n_features for m in members):
        raise DataError("members differ in their number of features")
    stats = decode_ints(_plain_sum([m.label_vector() for m in members]))
    base, rows = base_score_from_stats(stats, p), check_label_stats(stats, p, len(members))
    for m in members:
        m.set_base(base)
    cuts = _agree_cuts(members, n_features, p.max_bin, rows)
    packing = p.packing(rows, cuts.counts())
    for m in members:
        m.set_cuts(cuts)
        m.set_packing(packing)
    trees: list[_Tree] = list(start_trees)
    first_k = 0
    for m in members:
        first_k = m.resume(base, trees) if trees else 0
    resume_round = len(trees) // p.groups
    for r in range(resume_round, p.num_round):
        if r > resume_round or first_k == 0:     # resume() already took g, h at a partial round's start
            for m in members:
                m.start_round()
        for k in range(first_k if r == resume_round else 0, p.groups):
            for m in members:
                m.start_tree(k, len(trees))
            tree = _grow(members, cuts, p, len(trees), packing)
            for m in members:
                m.add_tree(tree, k)
            trees.append(tree)
    return HistResult(model=model_bytes(trees, base, n_features, p),
                      margins=tuple(getattr(m, "margins", None) for m in members), cuts=cuts, base=base)


def train_reference(sites_X: Sequence[Any], sites_y: Sequence[Any], params: Mapping[str, Any] | HistParams) -> bytes:
    """The centralized reference: the same pure functions on the pooled rows (one member)."""
    pooled = (np.concatenate([np.asarray(X) for X in sites_X]), np.concatenate([np.asarray(y) for y in sites_y]))
    return train_in_process([pooled], params).model
