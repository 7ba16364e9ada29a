"""A site's rows kept between bagging rounds with the global model's margins on them (`RoundCache`),
so that a round costs its new trees, not O(rounds). No networking, no clock, no logging: state
the caller owns and passes in.

Tree bagging continues the global model every round (fedpeer.ml.xgb.bagging): done plainly, each
round builds an xgboost DMatrix of the site's rows (and its quantile sketch), loads the whole
model and predicts every old tree on every row before growing one tree; the evaluation loads and
predicts the whole model again. The cache keeps the DMatrix and the margins of the last model
it saw, and adds only the trees a newer model appends.

Why the bytes stay the same: xgboost predicts a row as base_score's margin plus each tree's leaf,
added in model order in float32 (its warm start does the same for the rows it trains on). The
kept margins are xgboost's own output of that sum over a model's first trees; given as
`base_margin`, xgboost adds the trees after them in the same order, so the sums are the very same
float32 values, and so are the trees grown from them and the probabilities (xgboost's own
transform of those margins). tests/unit/test_xgb_margins.py compares both ways, byte for byte.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from fedpeer.ml.xgb.model import ModelInfo, _model_bytes, _nthread

__all__ = ["RoundCache"]

_NO_MARGIN = np.empty(0, dtype=np.float32)


class RoundCache:
    """One site's rows as a DMatrix and the margins of the last global model seen on them.

    Tied to the caller's arrays (by identity: other objects rebuild it; the caller must not change
    their values meanwhile). A model that does not extend the kept trees (another leader's) is
    predicted from its start. One call at a time (a lock): a round a deposed leader abandoned may
    still run in its thread when the next one starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: tuple[Any, Any] | None = None      # the caller's (X, y) the matrix holds (y None: no labels)
        self._matrix: Any = None                       # xgboost.DMatrix of those rows
        self._trees: tuple = ()                        # the model trees `_margin` sums
        self._margin: np.ndarray | None = None         # float32 (rows,) or (rows, groups)

    def train(self, rows: tuple[Any, Any], X: np.ndarray, y: np.ndarray, info: ModelInfo | None,
              train_params: dict, num_local_round: int) -> Any:
        """A booster holding only the new trees, trained on `rows` (as checked: X, y) from the
        margins of `info` (None: from train_params' base_score)."""
        import xgboost as xgb

        nthread = train_params.get("nthread")
        with self._lock:
            self._hold(rows, X, y, nthread)
            if info is None:
                self._matrix.set_base_margin(_NO_MARGIN)
            else:
                self._matrix.set_base_margin(self._margins(info, nthread))
                train_params = {**train_params, "base_score": info.base_score[0] if info.groups == 1
                                else list(info.base_score)}     # the new trees' booster keeps it, as warm
            return xgb.train(train_params, self._matrix, num_boost_round=int(num_local_round), verbose_eval=False)

    def predict(self, rows_X: Any, X: np.ndarray, info: ModelInfo, nthread: Any) -> np.ndarray:
        """`predict_proba` of the model `info` on `rows_X` (as checked: X)."""
        with self._lock:
            self._hold((rows_X, None), X, None, nthread)
            margin = self._margins(info, nthread)
            booster = _booster((), info, nthread)       # no trees: xgboost's transform of the margins
            self._matrix.set_base_margin(margin)
            return booster.predict(self._matrix)

    def _hold(self, rows: tuple[Any, Any], X: np.ndarray, y: np.ndarray | None, nthread: Any) -> None:
        import xgboost as xgb

        held = self._rows
        if held is None or held[0] is not rows[0] or (rows[1] is not None and held[1] is not rows[1]):
            self._matrix = xgb.DMatrix(X, label=y, nthread=_nthread(nthread))
            self._rows, self._trees, self._margin = rows, (), None

    def _margins(self, info: ModelInfo, nthread: Any) -> np.ndarray:
        kept = len(self._trees)
        extends = self._margin is not None and len(info.trees) >= kept and \
            all(a is b or a.same_as(b) for a, b in zip(self._trees, info.trees))
        new = info.trees[kept:] if extends else info.trees
        if extends and not new:
            return self._margin
        booster = _booster(new, info, nthread)
        self._matrix.set_base_margin(self._margin if extends else _NO_MARGIN)
        self._margin, self._trees = booster.predict(self._matrix, output_margin=True), info.trees
        return self._margin


def _booster(trees: Any, info: ModelInfo, nthread: Any) -> Any:
    """A booster of `trees` with the model's intercept and shape (our own canonical bytes)."""
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(_model_bytes(trees, np.array(info.base_score), info.num_feature, info.groups,
                                              info.objective)))
    if nthread:
        booster.set_param("nthread", int(nthread))
    return booster
