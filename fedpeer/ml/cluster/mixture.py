"""Pure Gaussian-mixture EM steps on sufficient statistics (docs/algorithms.md; Vasilopoulou's thesis §5.1).

Vasilopoulou's thesis (§5.1) averages each client's GMM; here EM is exact instead: every E-step's
sufficient statistics are sums over rows, so the secure sum of the sites' statistics is the
statistic of the pooled rows, and the M-step every site then computes is the centralized one.

A site's block at the current model θ (k components, d features, clustering space):
  floats: Σ r_c (k), Σ r_c (x - m_c) (k·d), Σ r_c (x - m_c)(x - m_c)ᵀ upper triangle (k·d(d+1)/2,
          covariance "full") or Σ r_c (x - m_c)² (k·d, "diag"), Σ log p(x | θ) (1)
  counts: rows whose most probable component is c (k)
r_c is the responsibility of component c for a row. The statistics are taken around m_c, the
current means (not around 0): the new covariance is then S/N - δδᵀ with a small δ = new mean - m_c,
free of the cancellation of Σ r x xᵀ / N - μμᵀ on data far from the origin.

What honest blocks satisfy (`check_block`, ValueError naming the check; the job ends everywhere
with it): finite; responsibilities N_c >= 0 adding up to the rows (whole numbers in the init
block, whose log-likelihood is 0); every component's [[N, Σ r δᵀ], [Σ r δ, Σ r δδᵀ]] positive
semi-definite (a weighted Gram matrix: the covariance the M-step gives is PSD before reg_covar);
and at a model, the log-likelihood L within [Q, Q + rows·log k], where Q = Σ_c N_c (log w_c -
½ d log 2π - ½ log det Σ_c) - ½ tr(Σ_c⁻¹ S_c) is the expected complete-data log-likelihood the
same statistics give (log p(x) = Σ_c r_c log(w_c N_c(x)) + H(r), 0 <= H(r) <= log k).

The M-step is scikit-learn's GaussianMixture: N_c = Σ r_c + 10·eps, weights N_c / n, means, and
covariances with `reg_covar` added to the diagonal. Initialisation (scikit-learn's
init_params="kmeans"): responsibilities one-hot on the nearest final k-means centre.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedpeer.errors import JobError
from fedpeer.ml.moments import exact_sum, is_whole, slack

COVARIANCE_TYPES = ("full", "diag")
ROWS_PER_CHUNK_CELLS = 1 << 22
_EPS10 = 10 * np.finfo(np.float64).eps
_LOG_2PI = np.log(2 * np.pi)


def stat_sizes(k: int, d: int, covariance: str) -> tuple[int, int]:
    """(floats, counts) of one block."""
    second = d * (d + 1) // 2 if covariance == "full" else d
    return k + k * d + k * second + 1, k


@dataclass(frozen=True)
class Mixture:
    weights: np.ndarray          # (k,)
    means: np.ndarray            # (k, d)
    covariances: np.ndarray      # (k, d, d) full, (k, d) diag
    covariance: str

    @property
    def k(self) -> int:
        return len(self.weights)

    def cholesky(self) -> np.ndarray:
        """Lower Cholesky factors of the covariances (full) or their square roots (diag)."""
        if self.covariance == "diag":
            if (self.covariances <= 0).any() or not np.isfinite(self.covariances).all():
                raise JobError("gmm: a component's variance is not positive; raise reg_covar")
            return np.sqrt(self.covariances)
        out = np.empty_like(self.covariances)
        for c, cov in enumerate(self.covariances):
            try:
                out[c] = np.linalg.cholesky(cov)
            except np.linalg.LinAlgError:
                raise JobError(f"gmm: component {c}'s covariance is not positive definite (a collapsed "
                               "component, or too few rows for the features); raise reg_covar or use "
                               "fewer components") from None
        return out

    def reordered(self, order: np.ndarray) -> Mixture:
        return Mixture(self.weights[order], self.means[order], self.covariances[order], self.covariance)


def log_gaussian(X: np.ndarray, model: Mixture, chol: np.ndarray) -> np.ndarray:
    """(rows, k) log N(x | mean_c, cov_c)."""
    n, d = X.shape
    out = np.empty((n, model.k))
    for c in range(model.k):
        diff = X - model.means[c]
        if model.covariance == "diag":
            z = diff / chol[c]
            logdet = np.log(chol[c]).sum()
        else:   # z = L⁻¹ (x - mean), with the d x d inverse once per component (a matmul per row block)
            z = diff @ np.linalg.inv(chol[c]).T
            logdet = np.log(np.diag(chol[c])).sum()
        out[:, c] = -0.5 * (d * _LOG_2PI + (z * z).sum(axis=1)) - logdet
    return out


def estep(X: np.ndarray, model: Mixture, chol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(responsibilities (rows, k), log p(x | θ) per row)."""
    with np.errstate(divide="ignore"):
        weighted = log_gaussian(X, model, chol) + np.log(model.weights)[None, :]
    top = weighted.max(axis=1, keepdims=True)
    norm = top[:, 0] + np.log(np.exp(weighted - top).sum(axis=1))
    if not np.isfinite(norm).all():
        raise JobError("gmm: a row's log-likelihood is not finite; set standardize=true or raise reg_covar")
    return np.exp(weighted - norm[:, None]), norm


def local_stats(X: np.ndarray, resp: np.ndarray, around: np.ndarray, covariance: str) -> np.ndarray:
    """Σ r, Σ r (x - m), second moments around m (module docstring), concatenated."""
    k, d = around.shape
    N = resp.sum(axis=0)
    first = np.empty((k, d))
    second = []
    iu = np.triu_indices(d)
    for c in range(k):
        diff = X - around[c]
        rd = resp[:, c:c + 1] * diff
        first[c] = rd.sum(axis=0)
        second.append((rd.T @ diff)[iu] if covariance == "full" else (rd * diff).sum(axis=0))
    return np.concatenate([N, first.ravel(), np.concatenate(second)])


def local_block(X: np.ndarray, model: Mixture | None, around: np.ndarray, covariance: str,
                labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A site's block: at `model` (E-step), or with one-hot responsibilities on `labels` (init)."""
    k = around.shape[0]
    floats, counts, loglik = [], np.zeros(k, dtype=np.int64), 0.0
    chol = model.cholesky() if model is not None else None
    step = max(1, ROWS_PER_CHUNK_CELLS // max(k * X.shape[1], 1))
    for a in range(0, max(X.shape[0], 1), step):
        part = X[a:a + step]
        if model is None:
            assert labels is not None
            resp = np.zeros((part.shape[0], k))
            resp[np.arange(part.shape[0]), labels[a:a + step]] = 1.0
        else:
            resp, norm = estep(part, model, chol)
            loglik += float(norm.sum())
        floats.append(local_stats(part, resp, around, covariance))
        counts += np.bincount(resp.argmax(axis=1), minlength=k)
    total = np.sum(floats, axis=0) if floats else np.zeros(stat_sizes(k, X.shape[1], covariance)[0] - 1)
    return np.concatenate([total, [loglik]]), counts


def split_block(floats: np.ndarray, k: int, d: int, covariance: str) -> tuple[np.ndarray, np.ndarray,
                                                                                  np.ndarray, float]:
    """(N (k), first (k, d), second (k, d, d) or (k, d), log-likelihood) from a summed block."""
    N, first = floats[:k], floats[k:k + k * d].reshape(k, d)
    rest = floats[k + k * d:-1]
    if covariance == "full":
        m = d * (d + 1) // 2
        second = np.zeros((k, d, d))
        iu = np.triu_indices(d)
        for c in range(k):
            second[c][iu] = rest[c * m:(c + 1) * m]
            second[c] = second[c] + np.triu(second[c], 1).T
    else:
        second = rest.reshape(k, d)
    return N, first, second, float(floats[-1])


def check_block(n: int, floats: np.ndarray, counts: np.ndarray, around: np.ndarray, covariance: str,
                model: Mixture | None, kmeans: tuple[np.ndarray, float] | None = None) -> None:
    """ValueError (naming the check) unless a summed block (module docstring) can be honest: at
    `model` (an E-step round, statistics around its means), or the init block (model None,
    one-hot responsibilities on the nearest of `around`, no log-likelihood, zero counts). With
    `kmeans` = (sizes, inertia) of the k-means restart that gave `around`, the init block must be
    that clustering: N = its sizes, Σ_c tr(S_c) = its inertia."""
    k, d = around.shape
    if not np.isfinite(floats).all():
        raise ValueError("every statistic is finite")
    N, first, second, loglik = split_block(floats, k, d, covariance)
    if (N < -slack(0.0, n)).any() or abs(float(N.sum()) - n) > slack(n, n):
        raise ValueError("the responsibilities are non-negative and add up to the rows")
    if model is None:
        if not all(is_whole(float(v), n) for v in N) or abs(loglik) > slack(0.0, n) or counts.any():
            raise ValueError("the initial responsibilities are whole rows, with no log-likelihood")
        traces = second.sum(axis=1) if covariance == "diag" else np.trace(second, axis1=1, axis2=2)
        if kmeans is not None and ((np.abs(N - kmeans[0]) > 0.5).any()
                                   or abs(float(traces.sum()) - kmeans[1]) > slack(abs(kmeans[1]), n)):
            raise ValueError("the initial block is the k-means clustering: its sizes and inertia")
    elif (counts < 0).any() or (counts > n).any() or exact_sum(counts) != n:
        raise ValueError("the cluster sizes add up to the rows")
    _check_gram(N, first, second, covariance, n)
    if model is not None:
        _check_loglik(N, second, loglik, model, n)


def _check_gram(N: np.ndarray, first: np.ndarray, second: np.ndarray, covariance: str, n: int) -> None:
    """Every component's weighted Gram matrix of [1, x - m] is positive semi-definite."""
    if covariance == "diag":
        if (second < -slack(0.0, n)).any() or (first * first > np.maximum(N, 0.0)[:, None]
                                               * (second + slack(second, n))).any():
            raise ValueError("every component's second moments are a covariance (positive semi-definite)")
        return
    for c in range(len(N)):
        gram = np.block([[np.array([[N[c]]]), first[c][None, :]], [first[c][:, None], second[c]]])
        lowest = float(np.linalg.eigvalsh(gram)[0])
        if lowest < -slack(np.trace(gram), n):
            raise ValueError("every component's second moments are a covariance (positive semi-definite)")


def _check_loglik(N: np.ndarray, second: np.ndarray, loglik: float, model: Mixture, n: int) -> None:
    """Q <= L <= Q + rows·log k (module docstring), with the rounding of each term as slack."""
    k, d = model.means.shape
    chol = model.cholesky()
    q, room = 0.0, 0.0
    for c in range(k):
        if model.covariance == "diag":
            logdet = 2.0 * float(np.log(chol[c]).sum())
            inv = np.diag(1.0 / model.covariances[c])
            S = np.diag(second[c])
        else:
            logdet = 2.0 * float(np.log(np.diag(chol[c])).sum())
            L_inv = np.linalg.inv(chol[c])
            inv = L_inv.T @ L_inv
            S = second[c]
        per_row = float(np.log(model.weights[c])) - 0.5 * (d * _LOG_2PI + logdet)
        trace = float((inv * S).sum())
        q += float(N[c]) * per_row - 0.5 * trace
        room += abs(float(N[c]) * per_row) + 0.5 * float((np.abs(inv) * (slack(S, n))).sum())
    room = float(slack(room, n))
    if not q - room <= loglik <= q + n * float(np.log(k)) + room:
        raise ValueError("the log-likelihood lies within what the responsibilities' statistics give")


def mstep(n: int, floats: np.ndarray, around: np.ndarray, covariance: str, reg_covar: float) -> Mixture:
    """scikit-learn's M-step from the summed statistics taken around `around`."""
    k, d = around.shape
    N, first, second, _ = split_block(floats, k, d, covariance)
    if not (np.isfinite(floats).all() and (N > -1e-6).all()):
        raise JobError("the secure sums cannot come from honest sites (negative or non-finite "
                       "responsibilities): a member sent a wrong contribution; no mixture is reported")
    N = np.maximum(N, 0.0) + _EPS10
    delta = first / N[:, None]
    means = around + delta
    if covariance == "full":
        covs = second / N[:, None, None] - delta[:, :, None] * delta[:, None, :]
        covs = 0.5 * (covs + covs.transpose(0, 2, 1))
        covs[:, np.arange(d), np.arange(d)] += reg_covar
    else:
        covs = second / N[:, None] - delta * delta + reg_covar
    return Mixture(N / n, means, covs, covariance)


def parameter_count(k: int, d: int, covariance: str) -> int:
    """Free parameters, as scikit-learn's `_n_parameters`."""
    cov = k * d * (d + 1) / 2 if covariance == "full" else k * d
    return int(cov + k * d + k - 1)


def bic(loglik_total: float, n: int, k: int, d: int, covariance: str) -> float:
    return -2.0 * loglik_total + parameter_count(k, d, covariance) * np.log(n)


def to_original(model: Mixture, shift: np.ndarray, scale: np.ndarray) -> Mixture:
    """The mixture of x = z · scale + shift given the mixture of z."""
    if model.covariance == "full":
        covs = model.covariances * scale[None, :, None] * scale[None, None, :]
    else:
        covs = model.covariances * scale[None, :] ** 2
    return Mixture(model.weights, model.means * scale + shift, covs, model.covariance)


def em_reference(X: np.ndarray, init_means: np.ndarray, init_labels: np.ndarray, *, covariance: str,
                 reg_covar: float, tol: float, max_iter: int) -> tuple[Mixture, list[float], np.ndarray]:
    """The job's EM on the pooled rows (plain sums): (model, mean log-likelihood per E-step, sizes).
    The same rules as the job: the kept model is the last one evaluated (module docstring of
    fedpeer/kinds/cluster/gmm.py)."""
    n = X.shape[0]
    floats, _ = local_block(X, None, init_means, covariance, labels=init_labels)
    model = mstep(n, floats, init_means, covariance, reg_covar)
    history: list[float] = []
    while True:
        floats, counts = local_block(X, model, model.means, covariance)
        history.append(float(floats[-1]) / n)
        if len(history) >= max_iter or (len(history) > 1 and abs(history[-1] - history[-2]) < tol):
            return model, history, counts
        model = mstep(n, floats, model.means, covariance, reg_covar)
