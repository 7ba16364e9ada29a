"""`stats` over vertical sites ([data] partition = "vertical"): the aligned row count and every
joined column's mean, sample standard deviation and histogram (docs/algorithms.md, "Vertical
partition"). The `stats` kind runs `run_vertical` when its site's data is vertical.

After the alignment (fedpeer/kinds/aligned.py: columns, then the private set intersection), each
column belongs to one site, which holds it for every aligned entity: its statistics are that
site's to compute. They still travel in two secure sums (each member places its columns' values
on its own columns, zeros elsewhere), so that every member ends with the same table and every
total is checked as the horizontal job checks its own (fedpeer/ml/moments.py `check_columns`,
`check_spread`):
1. moments: [Σx, Σx²] per joined column over the N aligned rows; bins over mean ± 3 sd as the
   horizontal job draws them (no minimum or maximum revealed).
2. spread: [Σ(x - mean)²] per column and the histogram counts.
No label: a vertical job needs none (a label column is not a feature either).

What every member learns: the alignment's (fedpeer/protocols/psi.py), and every column's
statistics over the aligned entities — which the site holding that column chose to share by
joining the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedpeer.jobs.kind import JobContext, JobFailsEverywhere, checked_total
from fedpeer.jobs.report import table
from fedpeer.kinds.aligned import Offload, VerticalSums, align, alignment_result, placed
from fedpeer.ml.moments import bin_edges, check_columns, check_spread, column_summaries, local_histograms

PREFIX = "stats"
def _whole(counts: np.ndarray) -> np.ndarray:
    if (counts != np.round(counts)).any() or (counts < 0).any():
        raise ValueError("every histogram count is a whole number, not negative")
    return counts.astype(np.int64)


async def run_vertical(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                       offload: Offload = asyncio.to_thread) -> dict:
    aligned = await align(ch, ctx, PREFIX, offload)
    n, X, own = aligned.n, aligned.X, aligned.own_slice()
    if n < 2:
        raise JobFailsEverywhere(f"{n} entity is held by every member; statistics need at least 2")
    sums = VerticalSums(ch, ctx, params["secure_sum"], PREFIX, params["secure_sum_compact"])
    ch.progress("moments (secure sum 1 of 2)", 1, 2)
    moments = (await sums.gather("moments", placed(aligned, np.stack([X.sum(axis=0), (X * X).sum(axis=0)], 1), 2),
                                 aligned.slices())).reshape(-1, 2)
    checked_total(sums.tag("moments"), check_columns, n, moments[:, 0], moments[:, 1])
    mean = moments[:, 0] / n
    rough = np.sqrt(np.maximum(moments[:, 1] / n - mean * mean, 0.0) * n / (n - 1))
    edges = bin_edges(mean, rough, params["bins"])

    ch.progress("spread and histograms (secure sum 2 of 2)", 2, 2)
    width = params["bins"] + 2
    own_part = np.concatenate([((X - mean[own]) ** 2).sum(axis=0)[:, None], local_histograms(X, edges[own])], axis=1)
    second = (await sums.gather("spread", placed(aligned, own_part, 1 + width),
                                aligned.slices())).reshape(-1, 1 + width)
    centred = second[:, 0]
    hist = checked_total(sums.tag("spread"), _whole, second[:, 1:])
    checked_total(sums.tag("spread"), check_spread, n, moments[:, 0], moments[:, 1], centred, edges, hist)
    std = np.sqrt(centred / (n - 1))
    cols = aligned.features
    return {
        "count": n, "participants": sums.names(), **alignment_result(aligned, ctx, tuple(ch.members)),
        **column_summaries(cols, mean, std, edges, hist),
        "secure_sum": params["secure_sum"], **sums.false_claims(),
    }


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines of a vertical stats result: the alignment, every column's mean and spread."""
    sites = ", ".join(f"{s} {c}" for s, c in result["ids_per_site"].items())
    lines = [f"  federation: {result['count']} aligned entities (IDs held by every site) over "
             f"{', '.join(result['participants'])}; IDs per site: {sites}; std = {result['std_kind']}"]
    owner = {c: s for s, cols in result["columns_per_site"].items() for c in cols}
    rows = [("COLUMN", "SITE", "MEAN", "STD")] + [(c, owner.get(c, "-"), f"{result['mean'][c]:.6g}",
                                                   f"{result['std'][c]:.6g}") for c in result["mean"]]
    lines.append(table(rows, indent="  "))
    return lines


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """The harness's table of a vertical stats job: every site's IDs and the aligned count."""
    rows = [("SITE", "STATE", "LOCAL ROWS", "ALIGNED ROWS", "COLUMNS", "FIRST COLUMN MEAN ± STD")]
    for s in sites:
        r = s.get("result") or {}
        first = next(iter(r.get("mean", {})), None)
        spread = f"{first}: {r['mean'][first]:.4g} ± {r['std'][first]:.4g}" if first else "-"
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("count", "-"), len(r.get("mean", {})) or "-", spread))
    return table(rows)
