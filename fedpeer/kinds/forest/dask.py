"""BOFRF's member side on a Dask site (`[data] engine = "dask"`): what `jobs.bofrf`'s pure steps
do with a site's rows (prepare_site, score_site, finish_site), done where the rows are.

What runs where:

- the split (test part; personalized: validation part of the training rows) is drawn on one
  worker from the partitions' labels only, by `ml.data.split_mask` over the whole site, exactly as
  the memory engine's `split_train_test` draws it; each partition gets its rows' roles;
- the forest is trained ON ONE WORKER (never in the daemon): each partition sends only its
  training rows to the training task, which concatenates them in partition order — the memory
  engine's training matrix — and runs the same `train_local_forest` with the same seed. A random
  forest needs all its rows in one process, so the training rows are bounded by TRAIN_ROWS_MAX
  (a DataError naming the limit before anything is moved); only the forest (flat tree arrays)
  comes back to the daemon, which sends it to the other members;
- every tree's confusion matrix on the site's training rows (row-proportional, additive) is one
  task per partition; the (T, 4) integer matrices are added on the workers and only the total
  is gathered — the memory engine's matrix exactly (sums of integers);
- the test metrics (local RF, F_n, F) are computed on one worker that gathers the site's test rows
  (bounded by the same limit) and scores them exactly as the memory engine does, in one call over
  all test rows: AUC needs every test row's score, and the scores must be bit for bit the memory
  engine's (`ensemble_score` is a BLAS product whose last bits depend on how the rows are cut:
  scored partition by partition, two rows tied in the memory engine came out 1 ulp apart and
  moved the AUC in the 3rd decimal). Three small dicts come back. Personalized: the validation
  rows are gathered the same way and tau is chosen there.

So the kept forest, weights and metrics are the memory engine's for the same rows and seed
(tests/unit/test_dask_engine.py checks them equal). The clustered variant and the BOPPID
baseline are not on this engine (dasksite.dask_refusal says so before any cluster work).
Every method blocks: the job calls them off its event loop (asyncio.to_thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedpeer.data.dataset import split_mask
from fedpeer.errors import DataError

__all__ = ["GATHERED_ROWS_MAX", "DaskBofrfPart", "prepare"]

GATHERED_ROWS_MAX = 2_000_000   # rows one worker gathers: the training rows (to train the forest), the test rows
FIT, VALIDATION, TEST = 0, 1, 2  # a row's role, per partition (int8)


# -- tasks (run on the workers) -------------------------------------------------------------------

def _y(part: Any) -> np.ndarray:
    return part.y


def _roles(test_fraction: float, seed: int, validation_fraction: float | None, *ys: np.ndarray) -> list[np.ndarray]:
    """Every partition's rows' roles, split over the whole site as `split_train_test` splits it
    (then, personalized, its training part again with seed + 1)."""
    y = np.concatenate(ys)
    in_test = split_mask(len(y), y, test_fraction, seed)
    roles = np.where(in_test, TEST, FIT).astype(np.int8)
    if validation_fraction is not None:
        train = np.flatnonzero(~in_test)
        roles[train[split_mask(len(train), y[train], validation_fraction, seed + 1)]] = VALIDATION
    return np.split(roles, np.cumsum([len(v) for v in ys])[:-1])


def _role_counts(roles: list[np.ndarray]) -> list[int]:
    return np.bincount(np.concatenate(roles), minlength=3).tolist()


def _rows(part: Any, roles: list[np.ndarray], i: int, role: int) -> tuple[np.ndarray, np.ndarray]:
    keep = roles[i] == role
    return part.X[keep], part.y[keep]


def _joined(*pieces: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


def _train(options: Mapping[str, Any], features: tuple[str, ...], fit: tuple[np.ndarray, np.ndarray]) -> Any:
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import trees

    model = mb.train_local_forest(fit[0], fit[1], **options)
    return trees.from_sklearn(model, features)


def _confusion(part: Any, roles: list[np.ndarray], i: int, forest: Any) -> np.ndarray:
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import treepredict

    X, y = _rows(part, roles, i, FIT)
    return mb.confusion_per_tree(treepredict.predict_trees(forest, X, part.features), y)


def _tau(validation: tuple[np.ndarray, np.ndarray], forest: Any, features: tuple[str, ...], mcc: np.ndarray,
         grid: Sequence[float]) -> float:
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import treepredict

    return mb.choose_tau(treepredict.predict_trees(forest, validation[0], features), validation[1], mcc, grid=grid)


def _metrics(test: tuple[np.ndarray, np.ndarray], forest: Any, features: tuple[str, ...], own: np.ndarray,
             alpha: np.ndarray) -> tuple[dict, dict, dict]:
    """jobs.bofrf.SitePart.metrics, the same calls on the same rows."""
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import treepredict

    return mb.site_metrics(treepredict.predict_trees(forest, test[0], features), test[1], own, alpha)


# -- the daemon's side -----------------------------------------------------------------------------

class DaskBofrfPart:
    """A Dask site's private BOFRF state between the job's steps (`jobs.bofrf.SitePart`'s role):
    futures of the partitions and their rows' roles on the workers, the site's own forest here."""

    engine = "dask"
    local_model = None          # the sklearn forest stays on the worker that trained it

    def __init__(self, site: Any, roles: Any, validation: Any, test: Any, forest: Any, counts: list[int]) -> None:
        self.site, self.roles, self.validation, self.test, self.forest = site, roles, validation, test, forest
        self.rows = {"train": int(counts[FIT]), "test": int(counts[TEST])}

    def _scattered(self, forest: Any) -> Any:
        """The forest on the cluster once, for every partition's task (not once per task)."""
        return self.site._guarded(lambda: self.site.client.scatter(forest, hash=False))

    def confusion(self, forest: Any) -> np.ndarray:
        """(T, 4) matrices of every tree on the site's training rows: summed on the workers."""
        on = self._scattered(forest)
        return np.asarray(self.site.total([self.site.submit(_confusion, p, self.roles, i, on)
                                           for i, p in enumerate(self.site.parts)]), dtype=np.int64)

    def choose_tau(self, forest: Any, mcc: np.ndarray, grid: Sequence[float]) -> float:
        return float(self.site.wait(self.site.submit(_tau, self.validation, self._scattered(forest),
                                                     self.site.features, mcc, tuple(grid))))

    def metrics(self, forest: Any, own: np.ndarray, alpha: np.ndarray) -> tuple[dict, dict, dict]:
        """binary_metrics of the local RF, F_n and F on the site's test rows."""
        local_rf, local, glob = self.site.wait(self.site.submit(_metrics, self.test, self._scattered(forest),
                                                                self.site.features, own, alpha))
        return local_rf, local, glob


def prepare(site: Any, *, test_fraction: float, validation_fraction: float | None, seed: int,
            options: Mapping[str, Any]) -> DaskBofrfPart:
    """Split the site's rows and train its forest on a worker (module docstring). `options` are
    `train_local_forest`'s keyword arguments, the memory engine's."""
    ys = [site.submit(_y, p) for p in site.parts]
    roles = site.submit(_roles, test_fraction, seed, validation_fraction, *ys)
    counts = site.wait(site.submit(_role_counts, roles))
    for what, rows in (("training", counts[FIT] + counts[VALIDATION]), ("test", counts[TEST])):
        if rows > GATHERED_ROWS_MAX:
            raise DataError(f"bofrf on engine = \"dask\": this site's {rows} {what} rows exceed "
                            f"GATHERED_ROWS_MAX={GATHERED_ROWS_MAX}, the rows one worker gathers to train the forest "
                            "or to score the test part; use a sample of the rows (or a smaller test_fraction)")

    def gathered(role: int) -> Any:
        return site.submit(_joined, *[site.submit(_rows, p, roles, i, role) for i, p in enumerate(site.parts)])
    fit = gathered(FIT)
    validation = gathered(VALIDATION) if validation_fraction is not None else None
    forest = site.wait(site.submit(_train, dict(options), site.features, fit))
    del fit                     # the training matrix is freed on its worker once the forest is back
    return DaskBofrfPart(site, roles, validation, gathered(TEST), forest, counts)
