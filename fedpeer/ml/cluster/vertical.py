"""Pure steps of k-means / fuzzy c-means over vertically partitioned rows: LLF-CM without a server
(Bárcena, Marcelloni et al., "Federated c-Means and Fuzzy c-Means Clustering Algorithms for
Horizontally and Vertically Partitioned Data"; Marcelloni's federated-learning lecture;
docs/algorithms.md, "Vertical k-means").

Every site holds the same N aligned entities (fedpeer/protocols/psi.py) and its own columns of
them; each site keeps, and alone updates, its own projection of the centres onto its columns.
A round t, for R restarts side by side (the `kmeans` job, fedpeer/kinds/cluster/vertical.py):
  - each site: its partial squared distances d_ic^m = ‖x_i^m − v_c^m‖² (R × N × k) and the partial
    squared distances between its projections of the centres ‖v_c^m − v_c'^m‖² (R × k × k);
  - a secure sum gives the totals D (the squared distances of the joined rows to the joined
    centres) and S (the squared distances between the joined centres);
  - every site, alike: the assignments argmin_c D_ic (fuzzy c-means: the memberships u_ic from D,
    Bezdek's formula), the objective, and the stop rule; each site then moves its projection:
    v_c^m = mean of its columns over the rows of cluster c (fuzzy: Σ u^m x / Σ u^m; eq. 2).
The stop rule is LLF-CM's (the lecture's "Vertical federated c-means", step 12): a restart stops
after round t ≥ 1 when ‖D^t − D^(t−1)‖_F < ε, with ε = tol · ‖D^(t−1)‖_F (tol relative, so the
rule does not depend on the features' units), or when nothing changed at all (‖ΔD‖ = 0, which
also ends a run with tol = 0), or after max_iter centre updates (LLF-CM's t > T). Its result is
the centres of round t and the assignments from D^t. Hard k-means run to ‖ΔD‖ = 0 ends where
scikit-learn's Lloyd iterations end from the same initial centres (a fixed point: the rows'
assignments no longer move the centres).

Empty clusters (the horizontal job's rule, fedpeer/ml/cluster/kmeans.py): a cluster that receives
no row gets a new centre drawn from the per-feature normal N(mean, std²) — here each site draws its
own projection from its own columns' mean and std over the aligned rows, with a generator seeded
by (job seed, restart, centre updates so far, the site's ring position). It reveals nothing of any row.

Initial centres: `init` (the joined centres, each site takes its own columns), or, per restart
r, each site's projection drawn from N(mean, std²) of its own columns with the generator seeded by
(job seed, r, the site's ring position).

What honest totals satisfy (`check_totals`, ValueError naming the check; the job then ends
everywhere): every sum finite; D ≥ 0 and S ≥ 0 (sums of squares), S's diagonal 0 and S
symmetric; the triangle inequality |√D_ic − √D_ic'| ≤ √S_cc' (distances between points of one
Euclidean space); and, at each site, every total at least the site's own part (the others' parts
are sums of squares).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedpeer.errors import JobError
from fedpeer.ml.cluster.kmeans import SAME_CLUSTERING_RTOL, memberships, sq_distances
from fedpeer.ml.moments import slack

STATES = ("running", "done")
CHECK_CELLS_MAX = 1 << 20           # rows x k x k held at once by the triangle check (8 MiB of float64)


def partials(Z: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A site's part of one round, R restarts at once: `centers` (R, k, d_m) its projections,
    Z (N, d_m) its aligned rows -> (R, N, k) squared distances, (R, k, k) squared distances
    between its projections of the centres."""
    R, k, _ = centers.shape
    D = np.empty((R, Z.shape[0], k))
    S = np.empty((R, k, k))
    for r in range(R):
        D[r] = sq_distances(Z, centers[r])
        diff = centers[r][:, None, :] - centers[r][None, :, :]
        S[r] = np.einsum("abd,abd->ab", diff, diff)
    return D, S


def check_totals(D: np.ndarray, S: np.ndarray, own_D: np.ndarray, own_S: np.ndarray) -> None:
    """ValueError naming the first check the summed (R, N, k) distances D and (R, k, k) centre
    distances S fail (module docstring); `own_D`, `own_S` this site's parts of them."""
    if not (np.isfinite(D).all() and np.isfinite(S).all()):
        raise ValueError("every summed distance is finite")
    if (D < -slack(D, 0.0)).any() or (S < -slack(S, 0.0)).any():
        raise ValueError("every summed squared distance is at least 0")
    if (D < own_D - slack(D, 0.0)).any() or (S < own_S - slack(S, 0.0)).any():
        raise ValueError("every summed squared distance is at least this site's part of it")
    diagonal = np.diagonal(S, axis1=1, axis2=2)
    if (np.abs(diagonal) > slack(diagonal, 0.0)).any() or \
            (np.abs(S - S.transpose(0, 2, 1)) > slack(S, 0.0)).any():
        raise ValueError("the centres' distances are symmetric and 0 to themselves")
    k = D.shape[2]
    step = max(1, CHECK_CELLS_MAX // (k * k))
    for r in range(D.shape[0]):
        for a in range(0, D.shape[1], step):
            part = D[r, a:a + step]                                          # (rows, k)
            root = np.sqrt(np.maximum(part, 0.0))
            gap = (root[:, :, None] - root[:, None, :]) ** 2                 # (rows, k, k)
            room = slack(part[:, :, None] + part[:, None, :] + S[r][None, :, :], 0.0)
            if (gap > np.maximum(S[r], 0.0)[None, :, :] + room).any():
                raise ValueError("the distances keep the triangle inequality (|√D_ic − √D_ic'| ≤ ‖v_c − v_c'‖)")


@dataclass
class VRestart:
    centers: np.ndarray                     # this site's projection (k, d_m), clustering space
    state: str = "running"
    iterations: int = 0                     # centre updates made
    history: list[float] = field(default_factory=list)    # objective at each round's centres
    previous: np.ndarray | None = None      # D of the last round (N, k)
    inertia: float | None = None            # objective at the final centres
    labels: np.ndarray | None = None        # final assignments (N,)
    counts: np.ndarray | None = None        # rows nearest each final centre
    reseeded: int = 0
    converged: bool = False                 # stopped by the rule, not by max_iter
    last_change: float | None = None        # ‖D^t − D^(t−1)‖_F at the stop


@dataclass
class VerticalLloyd:
    """One site's driver: its projections of every restart's centres; fed the summed totals, it
    advances identically at every site (assignments, stop) and moves this site's projections."""

    inits: list[np.ndarray]                 # per restart: this site's projection (k, d_m)
    fuzziness: float
    tol: float                              # ε = tol · ‖D^(t−1)‖_F
    max_iter: int
    seed: int
    position: int                           # this site's ring position (its own generators)
    mean: np.ndarray                        # its columns over the aligned rows, clustering space
    std: np.ndarray
    restarts: list[VRestart] = field(init=False)

    def __post_init__(self) -> None:
        self.restarts = [VRestart(np.array(c, dtype=np.float64)) for c in self.inits]

    @property
    def k(self) -> int:
        return self.restarts[0].centers.shape[0]

    def active(self) -> list[int]:
        return [i for i, r in enumerate(self.restarts) if r.state != "done"]

    @property
    def finished(self) -> bool:
        return not self.active()

    def local(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This site's partial (R_active, N, k) distances and (R_active, k, k) centre distances."""
        return partials(Z, np.stack([self.restarts[i].centers for i in self.active()]))

    def advance(self, Z: np.ndarray, D: np.ndarray) -> None:
        """Apply one round's summed distances D (R_active, N, k), in `active()` order."""
        active = self.active()
        if D.shape != (len(active), Z.shape[0], self.k):
            raise JobError(f"vertical k-means: summed distances of shape {D.shape} for {len(active)} restarts "
                           f"of {Z.shape[0]} rows and k={self.k}")
        for b, i in enumerate(active):
            self._step(i, Z, D[b])

    def _weights(self, D: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(weights (N, k), labels, objective): one-hot nearest centres, or u^m."""
        labels = D.argmin(axis=1)
        if self.fuzziness == 1.0:
            w = np.zeros_like(D)
            w[np.arange(D.shape[0]), labels] = 1.0
            return w, labels, float(D[np.arange(D.shape[0]), labels].sum())
        w = memberships(D, self.fuzziness) ** self.fuzziness
        return w, labels, float((w * D).sum())

    def _step(self, i: int, Z: np.ndarray, D: np.ndarray) -> None:
        r = self.restarts[i]
        w, labels, objective = self._weights(D)
        r.history.append(objective)
        if r.previous is not None:
            change = float(np.linalg.norm(D - r.previous))
            r.last_change = change
            if change == 0.0 or change < self.tol * float(np.linalg.norm(r.previous)):
                r.converged = True
        if r.converged or r.iterations >= self.max_iter:
            r.state, r.inertia, r.labels = "done", objective, labels
            r.counts = np.bincount(labels, minlength=self.k)
            return
        r.previous = D
        r.centers = self._update(i, Z, w)
        r.iterations += 1

    def _update(self, i: int, Z: np.ndarray, w: np.ndarray) -> np.ndarray:
        """This site's new projection: Σ w x / Σ w per cluster (eq. 2); empty clusters re-seeded."""
        r = self.restarts[i]
        weights = w.sum(axis=0)
        empty = weights <= 0
        new = np.empty_like(r.centers)
        new[~empty] = (w[:, ~empty].T @ Z) / weights[~empty, None]
        if empty.any():
            rng = np.random.default_rng([self.seed, i, r.iterations, self.position, 1])
            draws = self.mean + self.std * rng.standard_normal(r.centers.shape)
            new[empty] = draws[empty]
            r.reseeded += int(empty.sum())
        if not np.isfinite(new).all():
            raise JobError("vertical k-means: a centre is not finite; set standardize=true or rescale the features")
        return new

    def best(self) -> int:
        """The restart with the lowest final objective; a later one replaces the kept one only if
        it is lower and not the same clustering (the same sizes, objectives within
        SAME_CLUSTERING_RTOL), as the horizontal job keeps its restarts."""
        assert self.finished
        kept = 0
        for i, r in enumerate(self.restarts[1:], start=1):
            k = self.restarts[kept]
            assert r.inertia is not None and k.inertia is not None and r.counts is not None and k.counts is not None
            same = bool((np.sort(r.counts) == np.sort(k.counts)).all()) and \
                abs(r.inertia - k.inertia) <= SAME_CLUSTERING_RTOL * max(abs(r.inertia), abs(k.inertia))
            if r.inertia < k.inertia and not same:
                kept = i
        return kept


def initial_projections(mean: np.ndarray, std: np.ndarray, k: int, seed: int, restart: int,
                        position: int) -> np.ndarray:
    """k centres' projections onto a site's columns drawn from N(mean, std²) per column, seeded
    by (seed, restart, the site's ring position)."""
    rng = np.random.default_rng([seed, restart, position])
    return mean + std * rng.standard_normal((k, len(mean)))


def column_moments(Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A site's columns' mean and population std over its aligned rows (what the horizontal job
    gets from a secure sum: here the site holds every row of its columns)."""
    return Z.mean(axis=0), Z.std(axis=0)


def reference_vertical(blocks: list[np.ndarray], inits: list[np.ndarray], *, fuzziness: float = 1.0,
                       tol: float = 0.0, max_iter: int = 300, seed: int = 0) -> list[VerticalLloyd]:
    """What the federation computes, in one process with plain sums: every site's driver, run to
    the end over the aligned blocks (each (N, d_m)); `inits` each site's (k, d_m) projection."""
    drivers = []
    for m, (Z, init) in enumerate(zip(blocks, inits)):
        mean, std = column_moments(Z)
        drivers.append(VerticalLloyd([init], fuzziness, tol, max_iter, seed, m, mean, std))
    while not drivers[0].finished:
        parts = [d.local(Z) for d, Z in zip(drivers, blocks)]
        D = sum(p[0] for p in parts)
        for d, Z in zip(drivers, blocks):
            d.advance(Z, D)
    return drivers
