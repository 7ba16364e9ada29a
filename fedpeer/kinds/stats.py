"""`stats`: federation-wide descriptive statistics from secure sums only (docs/algorithms.md).

Every member ends with the same result: row count, label prior, per-column mean and sample
standard deviation, and per-column histograms on bins every member derives identically.

Two secure sums, so that no site ever sees another's values:
1. moments: [n, n_positive, Σx per column, Σx² per column] (fixed point, 96-bit limbs). From them
   every member computes the same mean and a first spread, and from those the histogram bins:
   `bins` equal bins over mean ± 3 σ per column, plus one bin below and one above, so the bins
   are agreed without any site revealing its minimum or maximum.
2. spread: [Σ(x - mean)² per column, histogram counts]. The centred sum gives a standard deviation
   free of the cancellation of Σx² - n·mean² on large values.
Both totals are checked before anything is reported (fedpeer/ml/moments.py `check_moments`,
`check_spread`: whole counts, Cauchy–Schwarz, the centred sum matching the first sum, every
histogram holding each row once, Chebyshev's bound on its tails); a total that fails ends the job
everywhere naming the sum and the check, never a site. A member lost between the two sums would
make them cover different sites: the job then fails with that reason rather than mixing
populations. A member lost inside a sum is handled by the secure sum itself (re-run over the
survivors); `participants` in the result names who is in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedpeer.data.rows import rows_of
from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param, checked_total
from fedpeer.jobs.params import SECURE_SUM_COMPACT, SECURE_SUM_EXPLAINED
from fedpeer.jobs.report import DEFAULT_CLASS_NAMES, class_names, table
from fedpeer.kinds import stats_dp, vertical_stats
from fedpeer.kinds.aligned import MESSAGES as VERTICAL_MESSAGES
from fedpeer.ml.moments import (  # noqa: F401  (bin_edges, local_histograms: importable from here)
    FIXED,
    bin_edges,
    check_moments,
    check_spread,
    column_summaries,
    local_histograms,
    local_moments,
    whole_counts,
)
from fedpeer.protocols.fixedpoint import encode_counts
from fedpeer.protocols.securesum.api import secure_sum

PARAMS = {
    "bins": Param(int, 10, "histogram bins per column between mean-3sd and mean+3sd (plus one below, one above)",
                  low=1, high=1000),
    "secure_sum": SECURE_SUM_EXPLAINED,
    "secure_sum_compact": SECURE_SUM_COMPACT,
    **stats_dp.PARAMS,       # differential privacy (fedpeer/kinds/stats_dp.py): off at dp_epsilon = 0
}


def local_spread(X: np.ndarray, y: Any, mean: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ (x - mean)² per column, local_histograms): the second sum's site-local part."""
    return ((X - mean) ** 2).sum(axis=0), local_histograms(X, edges)


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    dp_on = params.get("dp_epsilon", 0.0) > 0
    if ctx.data.partition == "vertical":      # every column is one site's (fedpeer/kinds/vertical_stats.py)
        if dp_on:
            raise JobError("stats over vertical data does not take dp_epsilon (its sums are one site's columns)")
        return await vertical_stats.run_vertical(ch, params, ctx)
    if dp_on:
        return await stats_dp.run_dp(ch, params, ctx, _result)
    data = ctx.data
    rows, d = rows_of(data), len(data.features)
    parties = len(ch.members)
    mode, hop, compact = params["secure_sum"], ctx.hop_timeout_ms, params["secure_sum_compact"]

    ch.progress("moments (secure sum 1 of 2)", 1, 2)
    first = await secure_sum(ch, "stats/moments", FIXED.encode(await rows.additive(local_moments), parties),
                             mode=mode, hop_timeout_ms=hop, compact=compact)
    totals = FIXED.decode(first.total)
    n, n_pos = checked_total("stats/moments", check_moments, totals, d)
    if n < 2:
        raise JobError(f"the federation has {n} rows; statistics need at least 2")
    mean = totals[2:2 + d] / n
    rough_var = np.maximum(totals[2 + d:] / n - mean * mean, 0.0) * n / (n - 1)
    edges = bin_edges(mean, np.sqrt(rough_var), params["bins"])

    ch.progress("spread and histograms (secure sum 2 of 2)", 2, 2)
    centred, hist = await rows.additive(local_spread, mean, edges)
    vector = np.concatenate([FIXED.encode(centred, parties), encode_counts(hist.ravel(), parties, count_max=2**40)])
    second = await secure_sum(ch, "stats/spread", vector, mode=mode, hop_timeout_ms=hop, compact=compact)
    if second.participants != first.participants:
        raise JobError("a member dropped out between the two secure sums; the sums would cover different sites")
    split = d * FIXED.limbs
    centred_total = FIXED.decode(second.total[:split])
    counts = checked_total("stats/spread", whole_counts, second.total[split:]).reshape(d, -1)
    checked_total("stats/spread", check_spread, n, totals[2:2 + d], totals[2 + d:], centred_total, edges, counts)
    std = np.sqrt(centred_total / (n - 1))
    return _result(data, n, n_pos, mean, std, edges, counts, first.participants, ctx, mode)


def _result(data: Any, n: int, n_pos: int, mean: np.ndarray, std: np.ndarray, edges: np.ndarray,
            counts: np.ndarray, participants: tuple[bytes, ...], ctx: JobContext, mode: str) -> dict:
    cols = data.features
    return {
        "count": n,
        "participants": [ctx.names.get(k, k.hex()[:16]) for k in participants],
        "class_counts": {"positive": n_pos, "negative": n - n_pos},
        "positive_share": n_pos / n,
        **column_summaries(cols, mean, std, edges, counts),
        "secure_sum": mode,
    }


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines: the federation's rows and every column's mean and spread."""
    if result.get("partition") == "vertical":
        return vertical_stats.describe(result)
    lines: list[str] = []
    lines.append(f"  federation: {result['count']} rows over {', '.join(result['participants'])}; "
                 f"{_share(result)}; std = {result['std_kind']}")
    rows = [("COLUMN", "MEAN", "STD")] + [(c, f"{result['mean'][c]:.6g}", f"{result['std'][c]:.6g}")
                                          for c in result["mean"]]
    lines.append(table(rows, indent="  "))
    return lines


def _share(result: Mapping[str, Any]) -> str:
    """The positive class's share of the rows, naming the class ([data] positive) where known."""
    other, positive = class_names(result)
    if (other, positive) == DEFAULT_CLASS_NAMES:
        return f"positive share {result['positive_share']:.3f}"
    return f"share of {positive} {result['positive_share']:.3f} (the rest {other})"


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    if any((s.get("result") or {}).get("partition") == "vertical" for s in sites):
        return vertical_stats.site_table(sites)
    rows = [("SITE", "STATE", "LOCAL ROWS", "FEDERATION ROWS", "POSITIVE SHARE", "FIRST COLUMN MEAN ± STD")]
    for s in sites:
        r = s.get("result") or {}
        first = next(iter(r.get("mean", {})), None)
        spread = f"{first}: {r['mean'][first]:.4g} ± {r['std'][first]:.4g}" if first else "-"
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("count", "-"), f"{r['positive_share']:.3f}" if r else "-", spread))
    return table(rows)


# [policy.stats]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "bins_max": Limit("bins", 1000, "histogram bins per column (fewer: coarser views of few rows)"),
}


KIND = JobKind(name="stats", help="federation-wide count, mean, std, label prior and histograms (secure sums only)",
               params=PARAMS, run=run, needs_data=True, binary_label=True, limits=LIMITS,
               dask_support="stats", describe=describe, site_table=site_table, vertical=True,
               messages=VERTICAL_MESSAGES)
