"""FedAvg's summed round (fedpeer/kinds/linear/fedavg.py): the bound every member's weights keep,
and what a round's total must satisfy to come from honest members.

A round's total is [Σ n_k w_k, Σ n_k, Σ log-loss] ++ the evaluation counts (fedpeer/ml/evaluation.py
`site_counts`) of the model the round started from, on the same rows. Honest members' weights
stay within ±WEIGHT_ABS_MAX (a member whose local SGD leaves it fails the job naming
learning_rate), so the row-weighted average Σ n_k w_k / Σ n_k does too: a convex combination of
bounded values is bounded the same. The weights are the row counts, so Σ n_k is the rows the
evaluation counts, and at most the federation's rows (all of them while no member is lost).
What a member can still do: send weights anywhere within the bound and its true row count —
the average moves by at most its share of the rows times 2·WEIGHT_ABS_MAX.
"""

from __future__ import annotations

import numpy as np

from fedpeer.ml import evaluation
from fedpeer.ml.moments import is_whole, slack

WEIGHT_ABS_MAX = 1e4      # |weight| of a member's local model (standardised inputs); beyond: its SGD diverged


def weights_within_bound(w: np.ndarray) -> bool:
    """Whether a member's trained weights are finite and within ±WEIGHT_ABS_MAX."""
    return bool(np.isfinite(w).all() and (np.abs(w) <= WEIGHT_ABS_MAX).all())


def check_round(weighted: np.ndarray, rows: float, loss: float, counts: np.ndarray, groups: int, bins: int,
                rows_max: int, every_row: bool, eval_rows_max: int | None = None) -> int:
    """ValueError (naming the check) unless a round's decoded total can be honest (module
    docstring): `weighted` = Σ n_k w_k, `rows` = Σ n_k, `loss` and `counts` the evaluation;
    `rows_max` the federation's rows, all of them summed when `every_row`; `eval_rows_max` the
    federation's held-out rows when the evaluation is over those (None: over the rows averaged).
    Returns the rows."""
    if not is_whole(rows, rows_max) or not 1 <= round(rows) <= rows_max:
        raise ValueError("the summed rows are a whole number between 1 and the federation's rows")
    n = round(rows)
    if every_row and n != rows_max:
        raise ValueError("with every member in, the summed rows are the federation's rows")
    if not np.isfinite(weighted).all() or (np.abs(weighted) > n * WEIGHT_ABS_MAX + slack(n * WEIGHT_ABS_MAX, n)).any():
        raise ValueError(f"the average weights are within ±WEIGHT_ABS_MAX={WEIGHT_ABS_MAX:g}")
    if eval_rows_max is None and int(counts[-1]) != n:
        raise ValueError("the evaluation counts the rows the average weighs")
    if eval_rows_max is not None and not (1 <= int(counts[-1]) <= eval_rows_max
                                          and (not every_row or int(counts[-1]) == eval_rows_max)):
        raise ValueError("the evaluation counts the federation's held-out rows")
    evaluation.check_counts(counts, loss, groups, bins)
    return n
