"""`fedpeer predict`'s rows from class probabilities, as the supervised kinds (xgboost, logreg,
mlp) write them: a binary model's score and 0/1 (or class) prediction, a multi-class model's
predicted class and one probability per class."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def binary_rows(proba: np.ndarray, classes: Sequence[str] = ()) -> list[dict]:
    """P(positive) per row: the score, and the prediction (the class when the model names two)."""
    return [{"row": i + 1, "score": float(p),
             "prediction": classes[int(p > 0.5)] if classes else int(p > 0.5)} for i, p in enumerate(proba)]


def class_rows(proba: np.ndarray, classes: Sequence[str]) -> list[dict]:
    """One probability per class and row: the most probable class, and every class's p_<class>."""
    return [{"row": i + 1, "prediction": classes[int(row.argmax())],
             **{f"p_{c}": float(v) for c, v in zip(classes, row)}} for i, row in enumerate(proba)]
