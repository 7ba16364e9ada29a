"""Histogram XGBoost's member side on a Dask site (`DaskHistSite`): the methods of
`ml.histrun.HistSite`, each a step on every partition of the site's rows, where the rows are.

Every partition holds a `_PartSite` (a HistSite over its own training rows) on its worker; a step
that changes state replaces it by an updated shallow copy (`_step`), a step that contributes to a
sum returns the partition's vector, and the vectors are added on the workers (`DaskSite.total`).
What comes back to the daemon is what the memory engine's HistSite returns: one uint64 vector per
sum. The per-row state (bins, margins, g and h, each row's node, the subsample draw) never does.

Why the model is the memory engine's byte for byte: a partition's vectors are sums of integers
over its rows, so their sum is the site's; the train/test split is drawn by `ml.data.split_mask`
on the site's labels (gathered on one worker, not the daemon) exactly as `split_train_test` draws
it; and a partition draws its subsample rows from the same stream as the whole site, advanced past
the rows before it (PCG64 `advance`: one 64-bit draw per row).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from fedpeer.data.dataset import split_mask
from fedpeer.errors import DataError
from fedpeer.ml.xgb.hist import SITE_ROWS_MAX, encode_histograms, quantize_gradients
from fedpeer.ml.xgb.histboost import HistParams
from fedpeer.ml.xgb.histrun import HistSite
from fedpeer.ml.xgb.histtree import Growth
from fedpeer.ml.xgb.sketch import prepare_site

__all__ = ["DaskHistSite"]


class _PartSite(HistSite):
    """A partition's HistSite: its rows are the site's training rows offset .. offset + rows."""

    def __init__(self, X: np.ndarray, y: np.ndarray, params: HistParams, row_seed: int, offset: int) -> None:
        super().__init__(X, y, params, 1, row_seed)       # 1 party: the site's total is checked on the daemon
        self.offset = int(offset)

    def start_tree(self, k: int, tree: int = 0) -> None:
        assert self._derivs is not None, "start_round first"
        g, h = self._derivs
        self._gq, self._hq = quantize_gradients(g[:, k], h[:, k], *self.p.bounds())
        self.positions = np.zeros(self.rows, dtype=np.int64)
        if self.p.subsample < 1.0:
            rng = np.random.default_rng([self.row_seed, int(tree)])
            rng.bit_generator.advance(self.offset)     # the site's stream, from this partition's first row
            self.sampled = rng.random(self.rows) < self.p.subsample


# -- tasks (run on the workers) -------------------------------------------------------------------

def _labelled(part: Any, labeller: Callable[[Any], np.ndarray]) -> np.ndarray:
    return labeller(SimpleNamespace(labels=part.labels, y=part.y))


def _masks(test_fraction: float, seed: int, stratify: bool, *ys: np.ndarray) -> list[np.ndarray]:
    """Every partition's test rows, drawn over the whole site as the memory engine draws them."""
    y = np.concatenate(ys)
    mask = split_mask(len(y), y if stratify else None, test_fraction, seed)
    ends = np.cumsum([len(v) for v in ys])
    return np.split(mask, ends[:-1])


def _train_rows(masks: list[np.ndarray]) -> list[int]:
    return [int((~m).sum()) for m in masks]


def _member(part: Any, y: np.ndarray, masks: list[np.ndarray] | None, i: int, params: HistParams,
            row_seed: int, offset: int) -> _PartSite:
    X = part.X if masks is None else part.X[~masks[i]]
    return _PartSite(X, y if masks is None else y[~masks[i]], params, row_seed, offset)


def _test_part(part: Any, y: np.ndarray, masks: list[np.ndarray], i: int) -> tuple[np.ndarray, np.ndarray]:
    return part.X[masks[i]], y[masks[i]]


def _step(state: _PartSite, method: str, *args: Any) -> _PartSite:
    new = copy.copy(state)
    if method == "prepare":
        new._prepared = prepare_site(new.X)
        return new
    if method == "add_tree":
        new.margins = state.margins.copy()          # add_tree adds in place: the old state stays as it was
    getattr(new, method)(*args)
    return new


def _vector(state: _PartSite, method: str, *args: Any) -> np.ndarray:
    return getattr(state, method)(*args)


def _on_train(state: _PartSite, fn: Callable[..., Any], *args: Any) -> Any:
    return state.train_total(fn, *args)


def _on_test(part: tuple[np.ndarray, np.ndarray], fn: Callable[..., Any], *args: Any) -> Any:
    return fn(part[0], part[1], *args)


# -- the daemon's side -----------------------------------------------------------------------------

class DaskHistSite:
    """`HistSite`'s methods over a DaskSite's partitions (module docstring). Blocking: the job
    calls every method off its event loop (HistJob.compute)."""

    def __init__(self, site: Any, params: HistParams, n_parties: int, row_seed: int,
                 labeller: Callable[[Any], np.ndarray], split: tuple[float, int, bool] | None) -> None:
        self.d, self.p, self.n_parties = site, params, int(n_parties)
        ys = [site.submit(_labelled, part, labeller) for part in site.parts]
        masks = None
        if split is not None:
            masks = site.submit(_masks, *split, *ys)
            train = site.wait(site.submit(_train_rows, masks))
        else:
            site.settle(ys)                          # a labelling error surfaces here, with its message
            train = list(site.part_rows)
        offsets = np.concatenate(([0], np.cumsum(train)))
        self.rows, self.test_rows = int(offsets[-1]), site.rows - int(offsets[-1])
        if self.rows == 0:
            raise DataError("histogram mode: this site has no training rows")
        if self.rows > SITE_ROWS_MAX:
            raise DataError(f"histogram mode: {self.rows} rows at one site exceed SITE_ROWS_MAX={SITE_ROWS_MAX}")
        keep = [i for i in range(len(site.parts)) if train[i] > 0]
        self.states = self._settle([site.submit(_member, site.parts[i], ys[i], masks, i, params, row_seed,
                                                int(offsets[i])) for i in keep])
        self.tests = [] if masks is None else self._settle(
            [site.submit(_test_part, site.parts[i], ys[i], masks, i) for i in range(len(site.parts))
             if site.part_rows[i] > train[i]])
        self._prepared = self._packed = False
        site.parts = []      # the states hold the rows now: the loaded partitions are released on the workers

    @property
    def n_features(self) -> int:
        return len(self.d.features)

    def _settle(self, futures: list[Any]) -> list[Any]:
        """Wait until every future is computed on its worker (errors raised here), gather none."""
        self.d.settle(futures)
        return futures

    def _update(self, method: str, *args: Any) -> None:
        """Replace every partition's state by its updated copy. Not waited for: the next sum's
        tasks depend on these, so a failure here surfaces there (one round trip per level, not two)."""
        self.states = [self.d.submit(_step, s, method, *args) for s in self.states]

    def _sum(self, method: str, *args: Any) -> np.ndarray:
        """The site's vector: the partitions' vectors added (uint64, mod 2^64, on the workers), then
        the bound check of the job's party count on the site's total, as the memory engine's."""
        total = self.d.map_total(_vector, self.states, method, *args)
        return encode_histograms(total.view(np.int64), self.n_parties)

    def label_vector(self) -> np.ndarray:
        return self._sum("label_vector")

    def set_base(self, base: Sequence[float]) -> None:
        self._update("set_base", base)

    def sketch_vector(self, keys: np.ndarray) -> np.ndarray:
        if not self._prepared:
            self._update("prepare")
            self._prepared = True
        return self._sum("sketch_vector", keys)

    def set_cuts(self, cuts: Any) -> None:
        self._update("set_cuts", cuts)
        self._prepared = False

    def start_round(self) -> None:
        self._update("start_round")

    def start_tree(self, k: int, tree: int = 0) -> None:
        self._update("start_tree", k, tree)

    def set_packing(self, packing: Any) -> None:
        self._update("set_packing", packing)
        self._packed = True

    def level_vector(self, growth: Growth, cells_major: bool = False) -> np.ndarray:
        if self._packed:      # each partition checked its fields' widths; their sum keeps them
            return self.d.map_total(_vector, self.states, "level_vector", _slim(growth), cells_major)
        return self._sum("level_vector", _slim(growth))

    def after_level(self, growth: Growth) -> None:
        self._update("after_level", _slim(growth))

    def add_tree(self, tree: Any, k: int) -> None:
        self._update("add_tree", tree, k)

    def resume(self, base: Sequence[float], trees: Sequence[Any]) -> int:
        self._update("resume", base, list(trees))
        groups = self.p.groups
        return len(trees) - len(trees) // groups * groups

    def train_total(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Σ over the training partitions of fn(margins, labels, *args)."""
        return self.d.map_total(_on_train, self.states, fn, *args)

    def test_total(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Σ over the test parts of fn(X_test, y_test, *args) (None without a test part)."""
        return self.d.map_total(_on_test, self.tests, fn, *args) if self.tests else None


def _slim(growth: Growth) -> Growth:
    """What the partitions need of a level (build nodes, splits): without the parents' histograms."""
    return replace(growth, parent_hist=np.zeros((0,), dtype=np.int64))
