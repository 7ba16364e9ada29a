"""Pure k-means / fuzzy c-means steps on arrays (docs/algorithms.md; Bárcena et al.'s LLF-CM, eq. 2).

Rules of this module:
- Pure: numpy in, numpy out. No channel, no clock, no randomness except generators seeded from the
  job seed. The `kmeans` and `gmm` jobs (fedpeer/kinds/cluster/kmeans.py, gmm.py) and the in-process
  reference (`reference_kmeans`) call the same functions, so the federated run and the run on the
  pooled rows differ only by the fixed-point rounding of the summed values.
- Every site computes a *local block* per k-means restart from its own rows; the secure sum adds
  the blocks; `Lloyd.advance` turns the totals into the next centres, identically at every site.
- The blocks of all running restarts come from one pass over the rows (`local_blocks`): per chunk
  of rows, one matmul gives every restart's distances, and one compiled pass (kernels.py) the
  nearest centres and the cluster sums (fuzzy c-means: a second matmul); no per-restart or
  per-centre loop, no (rows x d) array per centre.

A block (one restart, k clusters, d features), in clustering space (standardised or not):
  floats: Σ w x per cluster (k·d), Σ w per cluster (k), Σ w · ‖x - c‖² (1)
  counts: rows nearest each centre (k), rows whose nearest centre changed since the last round (1)
with w = 1 for the nearest centre and 0 otherwise (hard k-means, `fuzziness` 1), or w = u^m, the
fuzzy c-means membership u raised to m = `fuzziness` > 1 (Marcelloni's federated-learning lecture; Bezdek's update).

Lloyd iterations follow scikit-learn's `KMeans(algorithm="lloyd")`: a restart stops when no row
changed its nearest centre (strict convergence: the new centres are the old ones), or when the
squared centre shift Σ‖c' - c‖² is at most tol · mean per-feature variance, or after max_iter
rounds. After a stop that is not strict, one more round only evaluates the final centres (inertia
and cluster sizes at those centres), as scikit-learn re-assigns labels before its inertia. Of the
restarts, the lowest inertia is kept, the first of those ending in the same clustering (`Lloyd.best`).

What honest sums satisfy (`check_block`, ValueError naming the check; the jobs end everywhere
with it): cluster sizes are counts adding up to the rows, the changed rows at most the rows; hard
k-means' weights are the sizes, fuzzy weights Σ u^m lie between rows·k^(1-m) and the rows; every
cluster's Σ w z is within Cauchy–Schwarz of its weight and the rows' Σz² (from the moments);
the objective is between 0 and the rows' squared distance to any one current centre (memberships
minimise it); and J + 2 Σ c·s_c - Σ w_c ‖c‖² lies between k^(1-m) Σz² and Σz² (hard k-means: it
equals Σz², so the moments tie the inertia).

Empty clusters (the documented rule): a cluster that receives no rows (Σ w = 0) gets a new centre
drawn from the federation-wide per-feature normal N(mean, std²) with a generator seeded by
(job seed, restart, round, cluster). It reveals nothing about any row (scikit-learn instead moves
it to the row farthest from its centre, which would expose that row). A restart that ends with an
empty cluster keeps it; its inertia decides whether it is kept.

Initial centres: for restart r, k draws from N(mean, std²) per feature with the generator seeded
by (job seed, r): the federation-wide mean and std come from one secure sum; no row is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedpeer.errors import JobError
from fedpeer.ml.cluster import kernels
from fedpeer.ml.moments import PLAUSIBLE_RTOL, check_columns, exact_sum, slack

ROWS_PER_CHUNK_CELLS = 1 << 20        # rows x restarts x max(k, d) held at once (8 MiB of float64)
STATES = ("running", "evaluating", "done")
SAME_CLUSTERING_RTOL = 1e-9           # objectives this close, same sizes: one clustering (`Lloyd.best`)
_OVERFLOW = ("squared distances overflow float64 (features of magnitude ~1e154 or more): "
             "set standardize=true or rescale the features")


# ---------------------------------------------------------------------------------------------
# Moments and the clustering space
# ---------------------------------------------------------------------------------------------

def local_moments(X: np.ndarray) -> np.ndarray:
    """[Σx per feature, Σx² per feature] of a site's rows (the row count travels as a count)."""
    return np.concatenate([X.sum(axis=0), (X * X).sum(axis=0)])


def finish_moments(n: int, sums: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Federation-wide mean and population std (denominator n, as numpy's and scikit-learn's
    StandardScaler) from the summed moments."""
    mean = sums[:d] / n
    var = np.maximum(sums[d:2 * d] / n - mean * mean, 0.0)
    return mean, np.sqrt(var)


@dataclass(frozen=True)
class Space:
    """Where clustering happens: z = (x - shift) / scale. Identity unless standardised."""

    shift: np.ndarray
    scale: np.ndarray

    def to(self, X: np.ndarray) -> np.ndarray:
        return (X - self.shift) / self.scale

    def back(self, C: np.ndarray) -> np.ndarray:
        return C * self.scale + self.shift

    @property
    def standardized(self) -> bool:
        return bool((self.shift != 0).any() or (self.scale != 1).any())


SCALE_RATIO_WARN = 100.0     # columns whose std differ more than this dominate unstandardized distances


def scale_warning(std: np.ndarray, features: tuple[str, ...] | list[str]) -> str | None:
    """One line when unstandardized columns' federated std differ by more than SCALE_RATIO_WARN
    times (the clusters then follow the widest column), else None."""
    live = np.flatnonzero(std > 0)
    if len(live) < 2:
        return None
    wide, narrow = live[np.argmax(std[live])], live[np.argmin(std[live])]
    ratio = float(std[wide] / std[narrow])
    if ratio <= SCALE_RATIO_WARN:
        return None
    return (f"column scales differ {ratio:.0f}x (std of {features[wide]} {std[wide]:.4g}, of {features[narrow]} "
            f"{std[narrow]:.4g}): unstandardized, the clusters follow the widest columns; "
            "standardize=true clusters (x - mean) / std")


def make_space(mean: np.ndarray, std: np.ndarray, standardize: bool) -> Space:
    """Standardise with the federated mean and std; a constant feature (std 0) keeps scale 1."""
    if not standardize:
        return Space(np.zeros_like(mean), np.ones_like(mean))
    return Space(mean.copy(), np.where(std > 0, std, 1.0))


def initial_centers(mean: np.ndarray, std: np.ndarray, k: int, seed: int, restart: int) -> np.ndarray:
    """k centres drawn from N(mean, std²) per feature (clustering space), seeded by (seed, restart)."""
    rng = np.random.default_rng([seed, restart])
    return mean + std * rng.standard_normal((k, len(mean)))


def parse_centers(text: str, k: int, d: int) -> np.ndarray:
    """`init` = "x1,x2;y1,y2": one centre per ';'-separated group, d numbers each (original units)."""
    rows = [r for r in text.split(";") if r.strip()]
    try:
        values = [[float(v) for v in r.split(",")] for r in rows]
    except ValueError:
        raise JobError(f"parameter init: {text[:80]!r} is not centres like \"1.0,2.0;3.5,-1\"") from None
    lengths = {len(v) for v in values}
    if len(rows) != k or lengths != {d}:
        got = f"{len(rows)} centre(s)" + (f" of {lengths.pop()} values" if len(lengths) == 1 else " of unequal lengths")
        raise JobError(f"parameter init: {got}; this job needs k = {k} centres of {d} values (one per feature)")
    C = np.array(values, dtype=np.float64)
    if not np.isfinite(C).all():
        raise JobError("parameter init: every value must be finite")
    return C


# ---------------------------------------------------------------------------------------------
# Distances and a site's block
# ---------------------------------------------------------------------------------------------

def sq_distances(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(rows, k) squared Euclidean distances, ‖x‖² - 2 x·c + ‖c‖² clipped at 0 (as scikit-learn)."""
    with np.errstate(over="ignore", invalid="ignore"):
        d2 = (X * X).sum(axis=1)[:, None] - 2.0 * (X @ C.T) + (C * C).sum(axis=1)[None, :]
    np.maximum(d2, 0.0, out=d2)
    if not np.isfinite(d2).all():
        raise JobError(_OVERFLOW)
    return d2


def memberships(d2: np.ndarray, fuzziness: float) -> np.ndarray:
    """Fuzzy c-means memberships u_ic = 1 / Σ_j (d_ic / d_ij)^(2/(m-1)) over the last axis (the
    centres), in log space so that large exponents neither overflow nor divide by zero (a row on a
    centre gets membership ~1 there)."""
    tiny = np.finfo(np.float64).tiny
    logw = -np.log(np.maximum(d2, tiny)) / (fuzziness - 1.0)
    logw -= logw.max(axis=-1, keepdims=True)
    w = np.exp(logw)
    return w / w.sum(axis=-1, keepdims=True)


def _chunk_rows(restarts: int, k: int, d: int) -> int:
    """Rows per chunk: (rows, restarts, max(k, d)) temporaries of at most ROWS_PER_CHUNK_CELLS."""
    return max(1, ROWS_PER_CHUNK_CELLS // max(restarts * max(k, d), 1))


def _nearest_part(X: np.ndarray, F: np.ndarray, k: int, sums: np.ndarray | None = None) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """scikit-learn's Lloyd assignment for R restarts at once, F = their centres stacked (R·k, d):
    one matmul gives every restart's x·c; per restart the argmin of ‖c‖² - 2 x·c over its k
    centres (‖x‖² is the same for all of them; lowest index on ties), as an index into F, (rows, R);
    and the squared distance to the chosen centre taken directly, Σ (x - c)², (rows, R), free of
    the expansion's cancellation far from the origin. With `sums` (R·k, d), each row is added to
    its chosen centres' (fedpeer/ml/cluster/kernels.py: one compiled pass after the matmul)."""
    rows, restarts = X.shape[0], F.shape[0] // k
    X, F = np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(F, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        partial = X @ F.T
        cc = (F * F).sum(axis=1)
    chosen = np.empty((rows, restarts), dtype=np.int64)
    best = np.empty((rows, restarts))
    accumulate = sums is not None
    if sums is not None and (sums.shape != F.shape or sums.dtype != np.float64 or not sums.flags.c_contiguous):
        raise ValueError(f"sums must be C-ordered float64 of the centres' shape {F.shape}")
    target = sums if sums is not None else np.zeros((0, 0))
    if not kernels.hard_kernel(X, partial, cc, F, k, chosen, best, target, accumulate):
        raise JobError(_OVERFLOW)
    return chosen, best


def nearest(X: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest centre (lowest index on ties) and its squared distance."""
    labels = np.empty(X.shape[0], dtype=np.int64)
    best = np.empty(X.shape[0], dtype=np.float64)
    step = _chunk_rows(1, *C.shape)
    for a in range(0, X.shape[0], step):
        chosen, dist = _nearest_part(X[a:a + step], C, C.shape[0])
        labels[a:a + step], best[a:a + step] = chosen[:, 0], dist[:, 0]
    return labels, best


def _fuzzy_part(X: np.ndarray, F: np.ndarray, k: int, fuzziness: float) -> tuple[np.ndarray, np.ndarray,
                                                                                 np.ndarray]:
    """Rows X against R restarts' stacked centres F: (u^m (rows, R·k), objective per restart (R),
    chosen (rows, R) indices into F, the nearest centre)."""
    rows, restarts = X.shape[0], F.shape[0] // k
    d2 = sq_distances(X, F).reshape(rows, restarts, k)
    chosen = d2.argmin(axis=2) + np.arange(0, restarts * k, k)[None, :]
    u = memberships(d2, fuzziness) ** fuzziness
    return u.reshape(rows, restarts * k), (u * d2).sum(axis=(0, 2)), chosen


def local_blocks(X: np.ndarray, centers: np.ndarray, fuzziness: float,
                 previous: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of R restarts at once, `centers` (R, k, d), `previous` each restart's last labels
    (None: none yet): (floats (R·nf), counts (R·nc), labels (rows, R)), restart by restart in the
    module docstring's layout. One pass over the rows for every restart: per chunk, hard k-means
    one matmul and one compiled pass; fuzzy c-means two matmuls."""
    restarts, k, d = centers.shape
    F = centers.reshape(restarts * k, d)
    sums, weights, objective = np.zeros((restarts * k, d)), np.zeros(restarts * k), np.zeros(restarts)
    labels = np.empty((X.shape[0], restarts), dtype=np.int64)
    step = _chunk_rows(restarts, k, d)
    for a in range(0, X.shape[0], step):
        part = X[a:a + step]
        if fuzziness == 1.0:
            labels[a:a + step], best = _nearest_part(part, F, k, sums)
            objective += best.sum(axis=0)
        else:
            w, obj, labels[a:a + step] = _fuzzy_part(part, F, k, fuzziness)
            sums += w.T @ part
            weights += w.sum(axis=0)
            objective += obj
    counts = np.bincount(labels.ravel(), minlength=restarts * k).reshape(restarts, k)
    if fuzziness == 1.0:
        weights = counts.ravel().astype(np.float64)          # hard k-means: a cluster's weight is its size
    labels -= np.arange(0, restarts * k, k)[None, :]
    changed = [X.shape[0] if p is None else int((labels[:, r] != p).sum()) for r, p in enumerate(previous)]
    floats = np.concatenate([sums.reshape(restarts, k * d), weights.reshape(restarts, k), objective[:, None]],
                            axis=1)
    counts = np.concatenate([counts, np.array(changed, dtype=np.int64)[:, None]], axis=1).astype(np.int64)
    return floats.ravel(), counts.ravel(), labels


def block_sizes(k: int, d: int) -> tuple[int, int]:
    """(floats, counts) per restart block."""
    return k * d + k + 1, k + 1


# ---------------------------------------------------------------------------------------------
# The Lloyd driver: identical at every member, fed with the summed blocks
# ---------------------------------------------------------------------------------------------

@dataclass
class Restart:
    centers: np.ndarray                     # current (final once done), clustering space
    state: str = "running"
    iterations: int = 0                     # centre updates made
    history: list[float] = field(default_factory=list)   # objective at each round's centres
    inertia: float | None = None            # objective at the final centres
    counts: np.ndarray | None = None        # rows nearest each final centre, federation-wide
    reseeded: int = 0                       # empty clusters re-seeded
    converged: bool = False                 # stopped on strict convergence or tol, not max_iter


@dataclass
class Lloyd:
    inits: list[np.ndarray]
    fuzziness: float
    tol_abs: float                          # bound on Σ‖c' - c‖² (tol · mean variance)
    max_iter: int
    seed: int
    mean: np.ndarray                        # federation-wide, clustering space (for re-seeding)
    std: np.ndarray
    # the rows' Σz and Σz² per feature (clustering space) and the magnitude Σz² was computed
    # from (its rounding), from the summed moments: what `check_block` holds the sums against
    z_sums: np.ndarray | None = None
    z_squares: np.ndarray | None = None
    z_magnitude: np.ndarray | None = None
    restarts: list[Restart] = field(init=False)

    def __post_init__(self) -> None:
        self.restarts = [Restart(np.array(c, dtype=np.float64)) for c in self.inits]

    @property
    def k(self) -> int:
        return self.restarts[0].centers.shape[0]

    @property
    def d(self) -> int:
        return self.restarts[0].centers.shape[1]

    def active(self) -> list[int]:
        return [i for i, r in enumerate(self.restarts) if r.state != "done"]

    @property
    def finished(self) -> bool:
        return not self.active()

    def local(self, X: np.ndarray, labels: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """This site's blocks for the active restarts, concatenated; `labels` (restart -> last
        labels) is the site's own memory for the 'changed' count, updated in place (a restart that
        is done is forgotten). Every active restart in one pass (`local_blocks`)."""
        active = self.active()
        centers = np.stack([self.restarts[i].centers for i in active])
        floats, counts, now = local_blocks(X, centers, self.fuzziness, [labels.get(i) for i in active])
        labels.clear()                              # the columns of `now` only: one (rows, R) array
        labels.update((i, now[:, b]) for b, i in enumerate(active))
        return floats, counts

    def advance(self, floats: np.ndarray, counts: np.ndarray, n: int) -> None:
        """Apply the summed blocks of the active restarts (in `active()` order)."""
        nf, nc = block_sizes(self.k, self.d)
        active = self.active()
        if floats.shape != (nf * len(active),) or counts.shape != (nc * len(active),):
            raise JobError(f"k-means: summed blocks of shape {floats.shape}/{counts.shape} for "
                           f"{len(active)} restarts of k={self.k}, d={self.d}")
        for b, i in enumerate(active):
            self._step(i, floats[b * nf:(b + 1) * nf], counts[b * nc:(b + 1) * nc], n)

    def _step(self, i: int, f: np.ndarray, c: np.ndarray, n: int) -> None:
        k, d = self.k, self.d
        r = self.restarts[i]
        sums, weights, objective = f[:k * d].reshape(k, d), f[k * d:k * d + k], float(f[-1])
        sizes, changed = c[:k], int(c[k])
        check_block(self, r.centers, sums, weights, objective, sizes, changed, n)
        r.history.append(objective)
        if r.state == "evaluating":
            r.inertia, r.counts, r.state = objective, sizes.copy(), "done"
            return
        r.iterations += 1
        new, empty = self._update(i, sums, weights)
        if self.fuzziness == 1.0 and changed == 0 and not empty.any():   # strict convergence
            r.inertia, r.counts, r.state, r.converged = objective, sizes.copy(), "done", True
            return
        shift = float(((new - r.centers) ** 2).sum())
        r.centers = new
        r.converged = shift <= self.tol_abs
        if r.converged or r.iterations >= self.max_iter:
            r.state = "evaluating"

    def _update(self, i: int, sums: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New centres Σ w x / Σ w (eq. 2); empty clusters re-seeded (module docstring)."""
        r = self.restarts[i]
        empty = weights <= 0
        new = np.empty_like(r.centers)
        new[~empty] = sums[~empty] / weights[~empty, None]
        if empty.any():
            rng = np.random.default_rng([self.seed, i, r.iterations, 1])
            draws = self.mean + self.std * rng.standard_normal((self.k, self.d))
            new[empty] = draws[empty]
            r.reseeded += int(empty.sum())
        if not np.isfinite(new).all():
            raise JobError("k-means: a centre is not finite; set standardize=true or rescale the features")
        return new, empty

    def best(self) -> int:
        """The restart with the lowest final objective, as scikit-learn keeps its best run: a later
        restart replaces the kept one only if its objective is lower and it is not the same
        clustering (`_same`), so the rounding of the sums never decides between two restarts that
        ended in the same partition (the first of them is kept, at every member and in the reference)."""
        assert self.finished
        kept = 0
        for i, r in enumerate(self.restarts[1:], start=1):
            if r.inertia < self.restarts[kept].inertia and not self._same(i, kept):
                kept = i
        return kept

    def _same(self, i: int, j: int) -> bool:
        """Restarts i and j ended in the same clustering, as far as the sums tell: the same cluster
        sizes (up to order) and objectives equal to SAME_CLUSTERING_RTOL."""
        a, b = self.restarts[i], self.restarts[j]
        assert a.counts is not None and b.counts is not None and a.inertia is not None and b.inertia is not None
        return bool((np.sort(a.counts) == np.sort(b.counts)).all()) and \
            abs(a.inertia - b.inertia) <= SAME_CLUSTERING_RTOL * max(abs(a.inertia), abs(b.inertia))


def check_block(lloyd: Lloyd, centers: np.ndarray, sums: np.ndarray, weights: np.ndarray, objective: float,
                sizes: np.ndarray, changed: int, n: int) -> None:
    """ValueError (naming the check) unless one restart's summed block, taken at `centers`, is
    what honest sites can give (module docstring); the job then ends rather than hand every
    site centres that cannot be true."""
    if not (np.isfinite(sums).all() and np.isfinite(weights).all() and np.isfinite(objective)):
        raise ValueError("every sum is finite")
    if (sizes < 0).any() or (sizes > n).any() or exact_sum(sizes) != n:
        raise ValueError("the cluster sizes add up to the rows")
    if not 0 <= changed <= n:
        raise ValueError("the changed rows are between 0 and the rows")
    if lloyd.fuzziness == 1.0:
        if (np.abs(weights - sizes) > 0.5).any():
            raise ValueError("every cluster's weight is its size")
    else:
        low = n * float(len(weights)) ** (1.0 - lloyd.fuzziness)
        total = float(weights.sum())
        if (weights < -slack(0.0, n)).any() or total > n + slack(n, n) or total < low - slack(low, n):
            raise ValueError("the fuzzy weights lie between rows·k^(1-m) and the rows")
    if lloyd.z_sums is None or lloyd.z_squares is None or lloyd.z_magnitude is None:
        return
    squares = lloyd.z_squares + slack(lloyd.z_magnitude, n)          # the most Σz² honest rows hold
    w = np.maximum(weights, 0.0)
    if (sums * sums > w[:, None] * squares[None, :] * (1 + PLAUSIBLE_RTOL) + slack(0.0, n)).any():
        raise ValueError("every cluster's sum is within its weight and the rows' spread")
    _check_objective(lloyd, centers, sums, w, objective, n)


def _check_objective(lloyd: Lloyd, centers: np.ndarray, sums: np.ndarray, w: np.ndarray, objective: float,
                     n: int) -> None:
    assert lloyd.z_sums is not None and lloyd.z_squares is not None and lloyd.z_magnitude is not None
    total_sq, magnitude = float(lloyd.z_squares.sum()), float(lloyd.z_magnitude.sum())
    cross = centers @ lloyd.z_sums                              # c · Σz per centre
    norms = (centers * centers).sum(axis=1)
    around = total_sq - 2.0 * cross + n * norms                 # Σ ‖z - c‖² over every row, per centre
    room = slack(magnitude + 2.0 * np.abs(cross) + n * norms, n)
    if objective < -slack(0.0, n) or objective > float((around + room).min()):
        raise ValueError("the objective is between 0 and the rows' spread around any centre")
    # J = Σ_c (A_c - 2 c·s_c + w_c ‖c‖²) with Σ_c A_c = Σ_i (Σ_c u^m) ‖z_i‖², and Σ_c u^m lies in
    # [k^(1-m), 1]: the rows' Σ‖z‖² brackets J + 2 Σ c·s - Σ w ‖c‖² (hard k-means: equals it)
    dots = (centers * sums).sum(axis=1)
    weighted = float((w * norms).sum())
    implied = objective + 2.0 * float(dots.sum()) - weighted
    low = float(len(w)) ** (1.0 - lloyd.fuzziness)
    room = slack(magnitude + 2.0 * float(np.abs(dots).sum()) + weighted + abs(objective), n)
    if not low * total_sq - room <= implied <= total_sq + room:
        raise ValueError("the objective fits the clusters' sums and the rows' Σz²")


def check_moments(n: int, sums: np.ndarray, d: int) -> None:
    """ValueError unless the summed [Σx, Σx²] over n rows can be honest (at least one row;
    fedpeer/ml/moments.py `check_columns`)."""
    if n < 1:
        raise ValueError("the rows are at least 1")
    check_columns(n, sums[:d], sums[d:2 * d])


def tolerance(std: np.ndarray, tol: float) -> float:
    """scikit-learn's absolute tolerance: tol times the mean per-feature variance."""
    return float(np.mean(std * std)) * tol


def canonical_order(C: np.ndarray) -> np.ndarray:
    """Indices sorting centres by first coordinate, ties by the next ones (original units)."""
    return np.lexsort(C.T[::-1])


# ---------------------------------------------------------------------------------------------
# In-process reference: the same steps on pooled rows, with plain sums
# ---------------------------------------------------------------------------------------------

def plan(X_moments: tuple[int, np.ndarray], d: int, *, k: int, seed: int, n_init: int, standardize: bool,
         tol: float, max_iter: int, fuzziness: float, init: np.ndarray | None) -> tuple[Space, Lloyd]:
    """From the summed moments (n, [Σx, Σx²]) to the clustering space and the Lloyd driver."""
    n, sums = X_moments
    mean, std = finish_moments(n, sums, d)
    space = make_space(mean, std, standardize)
    mean_c, std_c = (mean - space.shift) / space.scale, std / space.scale
    if init is not None:
        inits = [space.to(init)]
    else:
        inits = [initial_centers(mean_c, std_c, k, seed, r) for r in range(n_init)]
    z_sums, z_squares, z_magnitude = space_moments(space, n, sums, d)
    return space, Lloyd(inits, fuzziness, tolerance(std_c, tol), max_iter, seed, mean_c, std_c,
                        z_sums, z_squares, z_magnitude)


def space_moments(space: Space, n: int, sums: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' Σz, Σz² per feature in the clustering space z = (x - shift) / scale, from the
    summed Σx, Σx², and the magnitude Σz² is computed from (the scale of its rounding)."""
    s1, s2, shift, scale2 = sums[:d], sums[d:2 * d], space.shift, space.scale * space.scale
    z_sums = (s1 - n * shift) / space.scale
    z_squares = np.maximum((s2 - 2.0 * shift * s1 + n * shift * shift) / scale2, 0.0)
    magnitude = (np.abs(s2) + 2.0 * np.abs(shift * s1) + n * shift * shift) / scale2
    return z_sums, z_squares, magnitude


def reference_kmeans(X: np.ndarray, **params: object) -> tuple[Space, Lloyd, int]:
    """What the federation computes, run on the pooled rows: (space, finished driver, rounds)."""
    d = X.shape[1]
    space, lloyd = plan((X.shape[0], local_moments(X)), d, **params)   # type: ignore[arg-type]
    Z, labels, rounds = space.to(X), {}, 0
    while not lloyd.finished:
        floats, counts = lloyd.local(Z, labels)
        lloyd.advance(floats, counts, X.shape[0])
        rounds += 1
    return space, lloyd, rounds
