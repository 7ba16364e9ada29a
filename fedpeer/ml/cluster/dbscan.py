"""Pure steps of federated DBSCAN via Gaussian-mixture descriptions (Vasilopoulou's thesis §5.2).

1. Each site runs DBSCAN(eps, min_samples) on its own rows and describes every local cluster by a
   small Gaussian mixture (`components` Gaussians, full covariance; fewer when the cluster has
   fewer rows) fitted with scikit-learn: `describe_site`.
2. The descriptions travel in *slots*: the job's vector holds `local_clusters_max` slots per member,
   a site fills its own and leaves the others at zero, so the secure sum of all vectors is every
   site's descriptions side by side (`pack` / `unpack`). This shares each local cluster's row
   count and mixture with every member — more than the kmeans and gmm jobs share. Beside them
   travel the clustered rows' Σx and Σx² per feature (federation-wide; the descriptions imply
   them), which every described mixture must reproduce (`check_moments`).
3. Every member samples the same synthetic points from all descriptions (generator seeded by the
   job seed, the member's position and the slot; a cluster of n rows gives n points, split over
   its Gaussians by a multinomial draw on their weights, as Vasilopoulou's thesis, Table 5.2) and runs
   DBSCAN(eps, min_samples) on them: `synthesize`, `cluster_synthetic`.
4. Each site labels its own rows: the cluster of the nearest synthetic point that DBSCAN did not
   call noise, if that point is within eps, else noise (-1): `assign`.
Clusters are numbered in a canonical order: by the first coordinate of their synthetic points'
mean (ties by the next coordinates).
"""

from __future__ import annotations

import numpy as np

from fedpeer.errors import DataError, JobError
from fedpeer.ml.moments import PLAUSIBLE_RTOL, exact_sum, slack

DESCRIPTION_WEIGHTS_TOL = 1e-6          # |Σ weights - 1| of an honest description after rounding
DESCRIPTION_COVARIANCE_ATOL = 1e-9      # a covariance entry's fixed-point rounding (2^-32 per member), per feature


def slot_size(components: int, d: int) -> int:
    """Floats per slot: rows, weights, means, covariance upper triangles."""
    return 1 + components * (1 + d + d * (d + 1) // 2)


def describe_site(X: np.ndarray, eps: float, min_samples: int, components: int, seed: int,
                  reg_covar: float) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(rows, weights, means, covariances) of each local DBSCAN cluster, largest first."""
    return describe_with_moments(X, eps, min_samples, components, seed, reg_covar)[0]


def describe_with_moments(X: np.ndarray, eps: float, min_samples: int, components: int, seed: int,
                          reg_covar: float) -> tuple[list, np.ndarray]:
    """`describe_site`'s descriptions and [Σx, Σx²] per feature over the rows in local clusters:
    what the descriptions imply, summed beside them so that the federation can hold every
    description to its rows (`check_moments`)."""
    from sklearn.cluster import DBSCAN
    from sklearn.mixture import GaussianMixture

    moments = np.zeros(2 * X.shape[1])
    if X.shape[0] == 0:
        return [], moments
    labels = DBSCAN(eps=eps, min_samples=min_samples).fit_predict(X)
    found = [c for c in np.unique(labels) if c >= 0]
    found.sort(key=lambda c: (-int((labels == c).sum()), int(c)))
    out = []
    for c in found:
        rows = X[labels == c]
        n_comp = min(components, len(rows))
        gm = GaussianMixture(n_comp, covariance_type="full", reg_covar=reg_covar, random_state=seed).fit(rows)
        out.append((len(rows), gm.weights_, gm.means_, gm.covariances_))
        moments += np.concatenate([rows.sum(axis=0), (rows * rows).sum(axis=0)])
    return out, moments


def pack(descriptions: list, position: int, members: int, slots: int, components: int, d: int) -> np.ndarray:
    """This site's descriptions in its own slots (position in member order); zeros elsewhere."""
    if len(descriptions) > slots:
        raise DataError(f"this site found {len(descriptions)} local clusters, more than local_clusters_max "
                        f"{slots}; raise local_clusters_max (or eps / min_samples)",
                        public="more local clusters than local_clusters_max; raise local_clusters_max "
                        "(or eps / min_samples)")
    size = slot_size(components, d)
    vector = np.zeros(members * slots * size)
    iu = np.triu_indices(d)
    for s, (rows, weights, means, covs) in enumerate(descriptions):
        at = (position * slots + s) * size
        block = np.zeros(size)
        block[0] = rows
        m = len(weights)
        block[1:1 + m] = weights
        base = 1 + components
        block[base:base + m * d] = means.ravel()
        base += components * d
        tri = d * (d + 1) // 2
        block[base:base + m * tri] = np.concatenate([c[iu] for c in covs])
        vector[at:at + size] = block
    return vector


def unpack(total: np.ndarray, members: int, slots: int, components: int,
           d: int) -> list[tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray]]:
    """(member position, slot, rows, weights, means, covariances) of every filled slot, in order.
    ValueError (naming the check) when a slot cannot be a description an honest site sent: rows
    a whole number >= 1, at most min(components, rows) weights, each in [0, 1], adding up to 1,
    every value finite, every described covariance symmetric positive semi-definite. (Which slot
    proves nothing of who wrote it: any member can add to any slot.)"""
    size, tri = slot_size(components, d), d * (d + 1) // 2
    iu = np.triu_indices(d)
    out = []
    for p in range(members):
        for s in range(slots):
            block = total[(p * slots + s) * size:(p * slots + s + 1) * size]
            rows = block[0]
            if rows == 0 and not block.any():
                continue
            weights = block[1:1 + components]
            means = block[1 + components:1 + components + components * d].reshape(components, d)
            covs = np.zeros((components, d, d))
            flat = block[1 + components + components * d:].reshape(components, tri)
            for c in range(components):
                covs[c][iu] = flat[c]
                covs[c] = covs[c] + np.triu(covs[c], 1).T
            keep = weights > 0
            if (not np.isfinite(block).all() or rows < 1 or rows != round(rows) or (weights < 0).any()
                    or (weights > 1).any() or abs(weights.sum() - 1) > DESCRIPTION_WEIGHTS_TOL
                    or int(keep.sum()) > min(components, rows)):
                raise ValueError("every shared cluster description has whole rows and weights adding up to 1")
            _check_covariances(covs[keep], flat[keep])
            out.append((p, s, int(round(rows)), weights[keep], means[keep], covs[keep]))
    return out


def _check_covariances(covs: np.ndarray, flat: np.ndarray) -> None:
    """Every described covariance positive semi-definite, up to the rounding of its entries
    (fixed point: DESCRIPTION_COVARIANCE_ATOL; float: a relative PLAUSIBLE_RTOL of its trace)."""
    if not len(covs):
        return
    lowest = np.linalg.eigvalsh(covs)[:, 0]
    traces = np.trace(covs, axis1=1, axis2=2)
    if (lowest < -(PLAUSIBLE_RTOL * np.abs(traces) + DESCRIPTION_COVARIANCE_ATOL * covs.shape[1])).any():
        raise ValueError("every shared covariance is positive semi-definite")


def check_counts(described: list, rows: int, noise: int) -> None:
    """ValueError unless the first sum's counts fit its descriptions: the noise between 0 and the
    rows, and the local clusters' rows plus the noise adding up to the rows (each site's rows are
    in one local cluster or noise)."""
    if not 0 <= noise <= rows:
        raise ValueError("the noise rows are between 0 and the rows")
    if sum(n for _, _, n, *_ in described) + noise != rows:
        raise ValueError("the local clusters' rows and the noise add up to the rows")


def check_moments(described: list, moments: np.ndarray, reg_covar: float, rows: int) -> None:
    """ValueError unless the descriptions fit the summed [Σx, Σx²] of the clustered rows: a
    Gaussian mixture fitted by EM (scikit-learn's M-step) reproduces its rows' first and second
    moments, Σ_c N_c m_c = Σx and Σ_c N_c (Σ_c,jj - reg_covar + m_cj²) = Σx_j², with N_c = rows·w_c.
    A description of rows elsewhere than the rows summed fails it."""
    d = len(moments) // 2
    first, second = np.zeros(d), np.zeros(d)
    size_1, size_2 = np.zeros(d), np.zeros(d)
    for _, _, n, weights, means, covs in described:
        N = n * weights
        first += N @ means
        size_1 += N @ np.abs(means)
        diag = np.diagonal(covs, axis1=1, axis2=2) - reg_covar + means * means
        second += N @ diag
        size_2 += N @ np.abs(diag)
    s1, s2 = moments[:d], moments[d:]
    if not np.isfinite(moments).all() or (np.abs(first - s1) > slack(size_1 + np.abs(s1), rows)).any() \
            or (np.abs(second - s2) > slack(size_2 + np.abs(s2) + reg_covar * rows, rows)).any():
        raise ValueError("the shared descriptions reproduce their rows' summed Σx and Σx²")


def check_sizes(sizes: np.ndarray, rows: int) -> None:
    """ValueError unless the second sum's sizes (noise, then every cluster) hold every row once."""
    if (sizes < 0).any() or (sizes > rows).any() or exact_sum(sizes) != rows:
        raise ValueError("the cluster sizes and the noise add up to the rows")


def synthesize(described: list, seed: int) -> np.ndarray:
    """The synthetic points every member draws identically (module docstring, step 3)."""
    parts = []
    for p, s, rows, weights, means, covs in described:
        rng = np.random.default_rng([seed, p, s])
        counts = rng.multinomial(rows, weights / weights.sum())
        for n, mean, cov in zip(counts, means, covs):
            if n == 0:
                continue
            try:
                chol = np.linalg.cholesky(cov)
            except np.linalg.LinAlgError:
                raise JobError(f"the shared description of member {p + 1}'s cluster {s + 1} has a covariance that "
                               "is not positive definite; raise reg_covar") from None
            parts.append(mean + rng.standard_normal((n, len(mean))) @ chol.T)
    d = described[0][4].shape[1] if described else 0
    S = np.vstack(parts) if parts else np.zeros((0, d))
    if not np.isfinite(S).all():
        raise JobError("synthetic points that are not finite: a shared description cannot come from an honest "
                       "site (a member sent a wrong contribution)")
    return S


def cluster_synthetic(S: np.ndarray, eps: float, min_samples: int) -> np.ndarray:
    """DBSCAN labels of the synthetic points, renumbered in the canonical order (noise: -1)."""
    from sklearn.cluster import DBSCAN

    if len(S) == 0:
        return np.zeros(0, dtype=np.int64)
    labels = DBSCAN(eps=eps, min_samples=min_samples).fit_predict(S)
    found = [c for c in np.unique(labels) if c >= 0]
    if not found:
        return labels.astype(np.int64)
    means = np.array([S[labels == c].mean(axis=0) for c in found])
    order = np.lexsort(means.T[::-1])
    renumber = {int(found[i]): rank for rank, i in enumerate(order)}
    return np.array([renumber.get(int(v), -1) for v in labels], dtype=np.int64)


def assign(X: np.ndarray, S: np.ndarray, labels: np.ndarray, eps: float) -> np.ndarray:
    """Each row: the cluster of its nearest non-noise synthetic point within eps, else -1."""
    from sklearn.neighbors import NearestNeighbors

    core = labels >= 0
    if not core.any() or len(X) == 0:
        return np.full(len(X), -1, dtype=np.int64)
    nn = NearestNeighbors(n_neighbors=1).fit(S[core])
    dist, idx = nn.kneighbors(X)
    out = labels[core][idx[:, 0]]
    return np.where(dist[:, 0] <= eps, out, -1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# eps from the federation's k-distances (`eps_auto`)
# ---------------------------------------------------------------------------------------------

KDIST_EDGES = np.logspace(-4, 4, 161)   # 20 bins a decade over [1e-4, 1e4], plus one below and one above
EPS_AUTO_QUANTILE = 0.75                # eps: where three rows in four have min_samples rows that near


def kdistance_histogram(Z: np.ndarray, min_samples: int) -> np.ndarray:
    """Counts of this site's rows' k-distances (to their min_samples-th nearest row of the site, the
    row itself counted as DBSCAN counts it) in KDIST_EDGES' bins, with an underflow bin first and an
    overflow bin last. A site with fewer rows than min_samples puts every row in the overflow bin.
    A site's own k-distance is at least the federation's (its rows are a subset)."""
    from sklearn.neighbors import NearestNeighbors

    counts = np.zeros(len(KDIST_EDGES) + 1, dtype=np.int64)
    if Z.shape[0] < min_samples:
        counts[-1] = Z.shape[0]
        return counts
    dist, _ = NearestNeighbors(n_neighbors=min_samples).fit(Z).kneighbors(Z)
    return np.bincount(np.searchsorted(KDIST_EDGES, dist[:, -1], side="right"),
                       minlength=len(counts)).astype(np.int64)


def check_kdistances(counts: np.ndarray, rows: int) -> None:
    """ValueError unless the summed k-distance histogram holds every row once."""
    if int(np.asarray(counts).sum()) != rows:
        raise ValueError(f"the k-distance histograms hold {int(np.asarray(counts).sum())} rows, not the {rows} rows")


def eps_from_histogram(counts: np.ndarray, quantile: float = EPS_AUTO_QUANTILE) -> float:
    """The upper edge of the bin where the summed histogram reaches `quantile` of the rows (at most
    one bin, a factor 10^0.05, above the exact quantile). JobError when it lies outside the edges."""
    total = int(counts.sum())
    if total == 0:
        raise JobError("eps_auto: no rows to measure k-distances on")
    at = int(np.searchsorted(np.cumsum(counts), quantile * total))
    if at == 0 or at >= len(KDIST_EDGES):
        raise JobError(f"eps_auto: the rows' k-distances lie outside [{KDIST_EDGES[0]:g}, {KDIST_EDGES[-1]:g}] "
                       "standardized units; set eps")
    return float(KDIST_EDGES[at])


def noise_warning(rows: int, noise: int, sizes: np.ndarray) -> str | None:
    """One line when the clustering says little: more than half the rows noise, or one cluster
    holding every row that is not noise (the rows then form no separate dense groups at this eps)."""
    if rows and noise * 2 > rows:
        return (f"{noise} of {rows} rows ({noise / rows:.0%}) are noise: eps is small for these rows "
                "(raise eps, or eps_auto=true)")
    if rows and len(sizes) == 1 and int(sizes[0]) == rows:
        return f"one cluster holds all {rows} rows: eps is large for these rows (lower eps)"
    if rows and len(sizes) == 1:
        return (f"one cluster holds all {int(sizes[0])} rows that are not noise ({noise} are): the rows form no "
                "separate dense groups at this eps (a lower eps may split it, with more noise; kmeans or gmm "
                "find groups that are not separated by sparse regions)")
    return None
