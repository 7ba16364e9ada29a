"""The stats job's consistency check on the secure sums: what honest sites' sums always satisfy."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.errors import JobError
from fedpeer.kinds import stats


def honest(seed: int = 0) -> tuple[int, int, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 3))
    y = rng.integers(0, 2, 50)
    mean = X.mean(axis=0)
    edges = stats.bin_edges(mean, X.std(axis=0), 4)
    return 50, int(y.sum()), ((X - mean) ** 2).sum(axis=0), stats.local_histograms(X, edges)


def test_honest_totals_pass() -> None:
    stats.check_totals(*honest())


@pytest.mark.parametrize("lie, words", [
    (lambda n, p, c, h: (n, n + 1, c, h), "positives"),
    (lambda n, p, c, h: (n, p, c, h + np.eye(h.shape[0], h.shape[1], dtype=np.int64)), "histogram holds 51 rows"),
    (lambda n, p, c, h: (n, p, -c, h), "negative sum of squared deviations"),
    (lambda n, p, c, h: (n, p, c, h - 2 * (h == h.max())), "histogram"),
])
def test_inconsistent_totals_fail_the_job_with_the_reason(lie, words) -> None:
    with pytest.raises(JobError, match=words) as caught:
        stats.check_totals(*lie(*honest(1)))
    assert "a member sent a wrong contribution" in str(caught.value)
