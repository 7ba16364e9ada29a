"""Column moments of a site's rows, for secure sums: [n, Σy, Σx per column, Σx² per column] and
the fixed-point encoding they travel in (32 fraction bits in three 64-bit limbs). `stats` sums
them first; BOFRF's clustered variant derives its bounds from them; xgboost's label statistics
use the same encoding."""

from __future__ import annotations

import numpy as np

from fedpeer.protocols.fixedpoint import FixedPoint


FIXED = FixedPoint(frac_bits=32, limbs=3)


def local_moments(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.concatenate([[X.shape[0], float(y.sum())], X.sum(axis=0), (X * X).sum(axis=0)])
