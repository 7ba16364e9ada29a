"""`kmeans` over vertical sites ([data] partition = "vertical"): LLF-CM without a server
(docs/algorithms.md, "Vertical k-means"; fedpeer/ml/cluster/vertical.py has the arithmetic and the
stop rule). The `kmeans` kind runs `run_vertical` when its site's data is vertical.

Steps (tags `kmeans/...`):
1. alignment (fedpeer/kinds/aligned.py): every member's columns, then the private set intersection
   of the IDs: N common entities, this site's rows in the shared order.
2. one secure sum per round: every running restart's partial squared distances (N × k) and the
   partial squared distances between the site's projections of the centres (k × k). From the
   totals every member derives the same assignments (fuzzy: memberships) and stop; each member
   moves its own projection of the centres.
3. the result: one secure sum in which each member places its projection of the kept restart's
   centres (and its columns' shift and scale) on its own columns: every member ends with the
   same joined centres, in the joined column order (every member's columns, in ring order).

Parameters are the kind's: `k`, `max_iter` (centre updates), `tol` (the stop rule's ε =
tol · ‖D^(t−1)‖_F), `n_init` (restarts side by side, 1 when `init` is given), `seed`,
`standardize` (each site scales its own columns by their mean and std over the aligned rows:
the federation's, as it holds them all), `fuzziness`, `init` (the joined centres, in the joined
column order), `min_cluster_rows`, `secure_sum`.

What every member learns: the common IDs and every member's number of IDs (fedpeer/protocols/psi.py);
every member's column names; every round's summed distance of every aligned entity to every
centre, hence every entity's cluster (and membership) in every round, and the summed distances
between the centres; at the end the joined centres. A member's projection of the centres is not
seen by the others until that end (only its part of the distances, inside the sums). Every total
is checked first (`check_totals`): one no honest members can give ends the job everywhere, naming
the sum and the check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedpeer.jobs.kind import JobContext, JobFailsEverywhere, checked_total
from fedpeer.kinds.aligned import Aligned, Offload, VerticalSums, align, alignment_result, placed
from fedpeer.ml.cluster import vertical as vc
from fedpeer.ml.cluster.kmeans import canonical_order, parse_centers
from fedpeer.ml.moments import slack

PREFIX = "kmeans"


class Space:
    """This site's clustering space: z = (x - shift) / scale over its own columns."""

    def __init__(self, X: np.ndarray, standardize: bool) -> None:
        mean, std = vc.column_moments(X)
        d = X.shape[1]
        self.shift = mean if standardize else np.zeros(d)
        self.scale = np.where(std > 0, std, 1.0) if standardize else np.ones(d)
        self.mean, self.std = (mean - self.shift) / self.scale, std / self.scale

    def to(self, X: np.ndarray) -> np.ndarray:
        return (X - self.shift) / self.scale


def plan(params: Mapping[str, Any], aligned: Aligned, space: Space) -> vc.VerticalLloyd:
    """The driver of this site: its projections of the initial centres (every restart)."""
    k, position = params["k"], aligned.position
    if aligned.n < k:
        raise JobFailsEverywhere(f"{aligned.n} entities are held by every member; k = {k} clusters need at least "
                                 f"{k} (lower k)")
    if params["init"]:
        joined = parse_centers(params["init"], k, len(aligned.features))
        inits = [space.to(joined[:, aligned.own_slice()])]
    else:
        inits = [vc.initial_projections(space.mean, space.std, k, params["seed"], r, position)
                 for r in range(params["n_init"])]
    return vc.VerticalLloyd(inits, params["fuzziness"], params["tol"], params["max_iter"], params["seed"], position,
                            space.mean, space.std)


async def run_lloyd(ch: Any, sums: VerticalSums, lloyd: vc.VerticalLloyd, Z: np.ndarray,
                    offload: Offload) -> dict[int, np.ndarray]:
    """Rounds of secure sums until every restart is done (the same at every member); returns each
    restart's last summed centre distances (what its gathered centres are checked against)."""
    n, k = Z.shape[0], lloyd.k
    bound = lloyd.max_iter + 1
    last_S: dict[int, np.ndarray] = {}
    for step in range(1, bound + 1):
        if lloyd.finished:
            break
        ch.progress(f"round {step}", step, bound)
        active = lloyd.active()
        own_D, own_S = await offload(lloyd.local, Z)
        R = own_D.shape[0]
        floats = await sums.add(f"round{step}", np.concatenate([own_D.ravel(), own_S.ravel()]))
        D, S = floats[:R * n * k].reshape(R, n, k), floats[R * n * k:].reshape(R, k, k)
        checked_total(sums.tag(f"round{step}"), vc.check_totals, D, S, own_D, own_S)
        last_S.update((i, S[b]) for b, i in enumerate(active))
        await offload(lloyd.advance, Z, D)
    assert lloyd.finished, "each restart ends within max_iter + 1 rounds"
    return last_S


def check_centres(C: np.ndarray, S: np.ndarray) -> None:
    """ValueError unless the gathered joined centres (clustering space) are the centres whose
    distances the last round summed: Σ over columns of (v_c − v_c')² = S_cc'."""
    if not np.isfinite(C).all():
        raise ValueError("every centre is finite")
    diff = C[:, None, :] - C[None, :, :]
    if (np.abs(np.einsum("abd,abd->ab", diff, diff) - S) > slack(S, 0.0)).any():
        raise ValueError("the centres are those whose distances the rounds summed")


async def gather_centres(sums: VerticalSums, aligned: Aligned, best: vc.VRestart, space: Space,
                         S: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 3: (joined centres in clustering space, shift, scale), the same at every member."""
    k, d = best.centers.shape[0], len(aligned.features)
    own = np.concatenate([best.centers.T, space.shift[:, None], space.scale[:, None]], axis=1)  # (d_m, k + 2)
    joined = (await sums.gather("centres", placed(aligned, own, k + 2), aligned.slices())).reshape(d, k + 2)
    C, shift, scale = joined[:, :k].T.copy(), joined[:, k], joined[:, k + 1]
    checked_total(sums.tag("centres"), check_centres, C, S)
    if (scale <= 0).any():
        raise JobFailsEverywhere(f"secure sum '{sums.tag('centres')}': a member's scale is not positive")
    return C, shift, scale


async def run_vertical(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                       offload: Offload = asyncio.to_thread) -> dict:
    aligned = await align(ch, ctx, PREFIX, offload)
    k = params["k"]
    restarts = 1 if params["init"] else params["n_init"]
    sums = VerticalSums(ch, ctx, params["secure_sum"], PREFIX, params["secure_sum_compact"])
    sums.check_size(restarts * (aligned.n * k + k * k), "lower k or n_init")
    space = Space(aligned.X, params["standardize"])
    lloyd = plan(params, aligned, space)
    Z = await offload(space.to, aligned.X)
    last_S = await run_lloyd(ch, sums, lloyd, Z, offload)
    kept = lloyd.best()
    C, shift, scale = await gather_centres(sums, aligned, lloyd.restarts[kept], space, last_S[kept])
    return result(params, aligned, lloyd, kept, C, shift, scale, sums, ctx)


def result(params: Mapping[str, Any], aligned: Aligned, lloyd: vc.VerticalLloyd, kept: int, C: np.ndarray,
           shift: np.ndarray, scale: np.ndarray, sums: VerticalSums, ctx: JobContext) -> dict:
    best = lloyd.restarts[kept]
    assert best.inertia is not None and best.counts is not None
    centers = C * scale + shift
    order = canonical_order(centers)
    min_rows = params["min_cluster_rows"]
    rounds = sums.sent_entries[:-1]
    members = tuple(sums.ch.members)
    return {
        "k": params["k"], "features": list(aligned.features), "rows": aligned.n, "participants": sums.names(),
        **alignment_result(aligned, ctx, members),
        "centers": centers[order].tolist(),
        "inertia": best.inertia,
        "inertia_units": "standardized features" if params["standardize"] else "original units",
        "iterations": best.iterations, "converged": best.converged,
        "stop_rule": "||D(t) - D(t-1)||_F < tol * ||D(t-1)||_F, or no change, or max_iter centre updates",
        "history": [{"round": i + 1, "inertia": v} for i, v in enumerate(best.history)],
        "cluster_sizes": [int(c) if c >= min_rows else f"< {min_rows}" for c in best.counts[order]],
        "restarts": len(lloyd.restarts), "restart_inertia": [r.inertia for r in lloyd.restarts],
        "kept_restart": kept, "empty_clusters_reseeded": best.reseeded,
        "fuzziness": params["fuzziness"], "standardized": params["standardize"],
        "secure_sum": params["secure_sum"], "secure_sums": len(sums.sent_entries), **sums.false_claims(),
        "bytes_sent_per_site": 8 * sum(sums.sent_entries),
        "bytes_per_round_per_site": 8 * max(rounds) if rounds else 0,
        "_model": {"kind": "kmeans", "features": list(aligned.features), "centers": C[order],
                   "shift": shift, "scale": scale, "fuzziness": params["fuzziness"]},
    }
